package stripe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Wire format of one frame on a sub-connection (big-endian):
//
//	type(1) version(1) reserved(2) length(4) num(8) crc32c(4) payload(length)
//
// num is the chunk sequence number for DATA, the cumulative ack for ACK and
// PING, and the final sequence number for CLOSE. The CRC-32C covers the first
// 16 header bytes and the payload, so a corrupted seq or ack is caught too, not
// only corrupted data (TLS makes this redundant, plain TCP does not).
const (
	hdrLen      = 20
	wireVersion = 1
	// maxPayload bounds a DATA payload, so a decoder never allocates more
	// than this for one frame whatever the peer sends.
	maxPayload = 1 << 20
)

type frameType uint8

const (
	frameData  frameType = 1 // num = seq; payload = one chunk
	frameAck   frameType = 2 // num = chunks delivered to the reader so far (+1 once EOF is reached)
	framePing  frameType = 3 // num = as ACK; sent on idle sub-conns to prove they are alive
	frameClose frameType = 4 // num = number of chunks the sender will ever send
)

func (t frameType) String() string {
	switch t {
	case frameData:
		return "DATA"
	case frameAck:
		return "ACK"
	case framePing:
		return "PING"
	case frameClose:
		return "CLOSE"
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

type frame struct {
	typ     frameType
	num     uint64
	payload []byte
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errChecksum = errors.New("stripe: frame checksum mismatch")

// putHeader fills h[:hdrLen] for a frame carrying payload.
func putHeader(h []byte, typ frameType, num uint64, payload []byte) {
	h[0] = byte(typ)
	h[1] = wireVersion
	h[2], h[3] = 0, 0
	binary.BigEndian.PutUint32(h[4:8], uint32(len(payload)))
	binary.BigEndian.PutUint64(h[8:16], num)
	crc := crc32.Update(crc32.Checksum(h[:16], castagnoli), castagnoli, payload)
	binary.BigEndian.PutUint32(h[16:20], crc)
}

// readFrame decodes one frame, taking the payload buffer from alloc. It
// validates type, version and length before allocating, so garbage input costs
// at most maxPayload bytes.
func readFrame(r io.Reader, alloc func(n int) []byte) (frame, error) {
	var h [hdrLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	if h[1] != wireVersion {
		return frame{}, fmt.Errorf("stripe: frame version %d, want %d", h[1], wireVersion)
	}
	if h[2] != 0 || h[3] != 0 {
		return frame{}, fmt.Errorf("stripe: reserved frame bytes set (%#x)", h[2:4])
	}
	f := frame{typ: frameType(h[0]), num: binary.BigEndian.Uint64(h[8:16])}
	n := binary.BigEndian.Uint32(h[4:8])
	switch f.typ {
	case frameData:
		if n == 0 || n > maxPayload {
			return frame{}, fmt.Errorf("stripe: DATA frame of %d bytes (want 1..%d)", n, maxPayload)
		}
	case frameAck, framePing, frameClose:
		if n != 0 {
			return frame{}, fmt.Errorf("stripe: %v frame with %d payload bytes", f.typ, n)
		}
	default:
		return frame{}, fmt.Errorf("stripe: unknown frame type %d", h[0])
	}
	if n > 0 {
		f.payload = alloc(int(n))
		if _, err := io.ReadFull(r, f.payload); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return frame{}, err
		}
	}
	crc := crc32.Update(crc32.Checksum(h[:16], castagnoli), castagnoli, f.payload)
	if crc != binary.BigEndian.Uint32(h[16:20]) {
		return frame{}, errChecksum
	}
	return f, nil
}

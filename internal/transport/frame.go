// Package transport carries ferry's agent protocol: versioned, framed,
// checksummed messages on multiplexed channels over one connection per
// migration. The connection itself is any net.Conn, so TLS and MPTCP slot in
// underneath without touching the framing.
package transport

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// ProtocolVersion is the wire version ferry speaks. A peer with another
// version is refused at the handshake (every frame header carries it, so the
// peer's Hello frame already fails to decode, with both versions named).
//
// Version 6 hands a container's address over at the freeze: the source
// asks ("address") and waits for the destination's AddressTaken (a
// version-5 destination never answers).
// Version 5 gave post-copy a rounds channel: the pages the container wrote
// while its root filesystem synced, sent beside its dump (a destination of
// version 4 would never acknowledge them).
// Version 4 changed post-copy's push channel back to the source: fixed
// records, the pages stored or the pages the destination waits for.
// Version 3 added FrameControlMore: a control message larger than MaxPayload
// travels as FrameControlMore frames followed by one FrameControl frame.
// Version 2 capped a control message at one frame.
const ProtocolVersion = 6

// VersionError is a peer speaking another protocol version: one of the
// two ferries is older, and the message says which to upgrade.
type VersionError struct {
	Peer int
	// PeerName and LocalName name the two hosts where known (the
	// handshake fills them in); "" says "the peer" and "this host".
	PeerName, LocalName string
}

func (e *VersionError) Error() string {
	peer := cmp.Or(e.PeerName, "the peer")
	local := "this host"
	if e.LocalName != "" {
		local += " (" + e.LocalName + ")"
	}
	msg := fmt.Sprintf("transport: peer speaks protocol version %d, this ferry speaks %d: ", e.Peer, ProtocolVersion)
	if e.Peer < ProtocolVersion {
		return msg + fmt.Sprintf("%s runs an older ferry; upgrade ferry on %s to this one's version or later", peer, peer)
	}
	return msg + fmt.Sprintf("this ferry is older than %s's; upgrade ferry on %s to %s's version or later", peer, local, peer)
}

// MaxPayload bounds one frame's payload; larger writes and larger control
// messages are split.
const MaxPayload = 1 << 20

// MaxControlMessage bounds one control message once reassembled from its
// frames, so that a peer cannot make Recv allocate without limit. A
// manifest of a root filesystem with a million files is about 100 MiB.
const MaxControlMessage = 256 << 20

// headerSize: magic(3) version(1) type(1) flags(1) reserved(2) seq(8) len(4) crc(4).
const headerSize = 24

var magic = [3]byte{'F', 'R', 'Y'}

// FrameType says what a frame's payload is.
type FrameType uint8

const (
	// FrameControl carries one JSON-encoded control message.
	FrameControl FrameType = 1
	// FrameData carries a piece of a byte stream.
	FrameData FrameType = 2
	// FrameEnd closes the sender's byte stream (no payload).
	FrameEnd FrameType = 3
	// FrameError carries a UTF-8 error message from the peer; it ends the
	// stream in that direction.
	FrameError FrameType = 4
	// FrameControlMore carries a non-empty piece of a control message that
	// continues in the next frame of the channel; the message's last piece
	// is a FrameControl frame. Only a FrameControlMore or a FrameControl
	// frame may follow one (a FrameError ends the channel as always).
	FrameControlMore FrameType = 5

	maxFrameType = FrameControlMore
)

func (t FrameType) String() string {
	switch t {
	case FrameControl:
		return "control"
	case FrameData:
		return "data"
	case FrameEnd:
		return "end"
	case FrameError:
		return "error"
	case FrameControlMore:
		return "control-continues"
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// Frame is one unit on the wire. Seq numbers frames per direction of a
// channel, starting at 0, so a receiver notices a lost or repeated frame and
// a later resume can say where to pick up.
type Frame struct {
	Type    FrameType
	Seq     uint64
	Payload []byte
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrChecksum means a frame's payload does not match its CRC.
var ErrChecksum = errors.New("transport: frame checksum mismatch")

// WriteFrame encodes f to w in one write.
func WriteFrame(w io.Writer, f Frame) error {
	if len(f.Payload) > MaxPayload {
		return fmt.Errorf("transport: payload of %d bytes exceeds %d", len(f.Payload), MaxPayload)
	}
	buf := make([]byte, headerSize+len(f.Payload))
	putHeader(buf, f)
	copy(buf[headerSize:], f.Payload)
	_, err := w.Write(buf)
	return err
}

func putHeader(buf []byte, f Frame) {
	copy(buf[0:3], magic[:])
	buf[3] = ProtocolVersion
	buf[4] = byte(f.Type)
	buf[5] = 0 // flags, reserved for compression and resume markers
	binary.BigEndian.PutUint16(buf[6:8], 0)
	binary.BigEndian.PutUint64(buf[8:16], f.Seq)
	binary.BigEndian.PutUint32(buf[16:20], uint32(len(f.Payload)))
	binary.BigEndian.PutUint32(buf[20:24], crc32.Checksum(f.Payload, castagnoli))
}

// ReadFrame decodes one frame from r, verifying magic, version, type, size
// and checksum. buf is reused for the payload when large enough.
func ReadFrame(r io.Reader, buf []byte) (Frame, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	if h[0] != magic[0] || h[1] != magic[1] || h[2] != magic[2] {
		return Frame{}, fmt.Errorf("transport: bad frame magic %q (not a ferry peer?)", h[0:3])
	}
	if h[3] != ProtocolVersion {
		return Frame{}, &VersionError{Peer: int(h[3])}
	}
	if h[5] != 0 || h[6] != 0 || h[7] != 0 {
		return Frame{}, fmt.Errorf("transport: frame uses flags %#x this version does not know", h[5:8])
	}
	t := FrameType(h[4])
	if t < FrameControl || t > maxFrameType {
		return Frame{}, fmt.Errorf("transport: unknown frame type %d", h[4])
	}
	n := binary.BigEndian.Uint32(h[16:20])
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("transport: frame payload of %d bytes exceeds %d", n, MaxPayload)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return Frame{}, unexpectedEOF(err)
	}
	if crc32.Checksum(buf, castagnoli) != binary.BigEndian.Uint32(h[20:24]) {
		return Frame{}, ErrChecksum
	}
	return Frame{Type: t, Seq: binary.BigEndian.Uint64(h[8:16]), Payload: buf}, nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

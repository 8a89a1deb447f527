package pages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/klauspost/compress/zstd"
)

// The round stream:
//
//	header: "FRPG" version(1) flags(1)        flags bit 0: chunks may be zstd
//	chunk*: kind(1) uvarint(rawLen) [uvarint(zLen)] payload
//
// A chunk of kind 0 carries rawLen bytes of records as they are; kind 1
// carries a zstd frame of zLen (< rawLen) bytes holding them. Records never
// cross chunks, so a decoder reads exactly the stream's bytes and nothing
// after it. A record starts with a tag: the low 2 bits are its kind, bit 2
// says the key is the previous record's key plus one page (and is omitted).
//
//	page:   tag [uvarint(pid) uvarint(addr/PageSize)] data[PageSize]
//	delta:  tag [key] uvarint(n <= PageSize) n bytes (see EncodeDelta)
//	round:  tag uvarint(round) uvarint(pages) uvarint(deltas)   counts since the last round record
//	end:    tag                                                 last record of the stream
const (
	streamMagic   = "FRPG"
	streamVersion = 1
	flagZstd      = 1

	chunkRaw  = 0
	chunkZstd = 1

	chunkTarget = 1 << 20 // a chunk is sent once it holds this much
	maxChunk    = 2 << 20 // decoders refuse bigger chunks
	chunkHead   = 1 + 2*binary.MaxVarintLen32

	recEnd   = 0
	recPage  = 1
	recDelta = 2
	recRound = 3
	recSeq   = 4

	maxPageNo = math.MaxUint64 / PageSize
)

// Encoder writes a round stream. It buffers records and writes a chunk
// when enough are pending and at the end of every round. It is not safe for
// concurrent use.
type Encoder struct {
	w       io.Writer
	zw      *zstd.Encoder
	buf     []byte // chunkHead bytes of room, then the pending records
	zbuf    []byte
	prev    Key
	hasPrev bool
	pages   uint64 // in the current round
	deltas  uint64
	raw     int64
	written int64
	err     error
}

// NewEncoder writes the stream header to w. With compress, chunks are
// zstd-compressed (and sent as they are where that does not help).
func NewEncoder(w io.Writer, compress bool) (*Encoder, error) {
	e := &Encoder{w: w, buf: make([]byte, chunkHead, chunkHead+chunkTarget+2*PageSize)}
	hdr := []byte(streamMagic + "\x01\x00")
	hdr[4] = streamVersion
	if compress {
		zw, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(maxChunk))
		if err != nil {
			return nil, err
		}
		e.zw = zw
		e.zbuf = make([]byte, 0, chunkHead+chunkTarget+2*PageSize)
		hdr[5] = flagZstd
	}
	if err := e.write(hdr); err != nil {
		return nil, err
	}
	e.raw = int64(len(hdr))
	return e, nil
}

func (e *Encoder) write(b []byte) error {
	n, err := e.w.Write(b)
	e.written += int64(n)
	if err != nil {
		e.err = err
	}
	return err
}

// RawBytes returns how many bytes the stream holds before compression.
func (e *Encoder) RawBytes() int64 { return e.raw }

// WrittenBytes returns how many bytes were written to the underlying writer.
func (e *Encoder) WrittenBytes() int64 { return e.written }

// key appends the record tag and, unless it follows the previous key, the key.
func (e *Encoder) key(kind byte, k Key) error {
	if k.Addr%PageSize != 0 {
		return fmt.Errorf("pages: address %#x is not page aligned", k.Addr)
	}
	if e.hasPrev && k.PID == e.prev.PID && k.Addr == e.prev.Addr+PageSize {
		e.buf = append(e.buf, kind|recSeq)
	} else {
		e.buf = append(e.buf, kind)
		e.buf = binary.AppendUvarint(e.buf, uint64(k.PID))
		e.buf = binary.AppendUvarint(e.buf, k.Addr/PageSize)
	}
	e.prev, e.hasPrev = k, true
	return nil
}

// Page sends a whole page (PageSize bytes).
func (e *Encoder) Page(k Key, data []byte) error {
	if e.err != nil {
		return e.err
	}
	if len(data) != PageSize {
		return fmt.Errorf("pages: page of %d bytes", len(data))
	}
	if err := e.key(recPage, k); err != nil {
		return err
	}
	e.buf = append(e.buf, data...)
	e.pages++
	return e.maybeFlush()
}

// Delta sends a delta (from EncodeDelta) against the page last sent under k.
func (e *Encoder) Delta(k Key, delta []byte) error {
	if e.err != nil {
		return e.err
	}
	if len(delta) > PageSize {
		return fmt.Errorf("pages: delta of %d bytes", len(delta))
	}
	if err := e.key(recDelta, k); err != nil {
		return err
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(len(delta)))
	e.buf = append(e.buf, delta...)
	e.deltas++
	return e.maybeFlush()
}

// EndRound ends a round (numbered by the caller) and writes everything
// pending.
func (e *Encoder) EndRound(round int) error {
	if e.err != nil {
		return e.err
	}
	if round < 0 || round > math.MaxInt32 {
		return fmt.Errorf("pages: round %d out of range", round)
	}
	e.buf = append(e.buf, recRound)
	e.buf = binary.AppendUvarint(e.buf, uint64(round))
	e.buf = binary.AppendUvarint(e.buf, e.pages)
	e.buf = binary.AppendUvarint(e.buf, e.deltas)
	e.pages, e.deltas = 0, 0
	return e.flush()
}

// Close ends the stream and writes everything pending. It does not close
// the underlying writer.
func (e *Encoder) Close() error {
	if e.err != nil {
		return e.err
	}
	e.buf = append(e.buf, recEnd)
	err := e.flush()
	if e.zw != nil {
		e.zw.Close()
	}
	if err == nil {
		e.err = errors.New("pages: encoder closed")
	}
	return err
}

// Flush writes the pending records now, as one chunk (a sender pacing
// itself by what the receiver has decoded must not leave pages waiting).
func (e *Encoder) Flush() error {
	if e.err != nil {
		return e.err
	}
	return e.flush()
}

func (e *Encoder) maybeFlush() error {
	if len(e.buf)-chunkHead >= chunkTarget {
		return e.flush()
	}
	return nil
}

// flush writes the pending records as one chunk. The chunk header is put
// right in front of the payload, in the room kept for it, so the chunk goes
// out in one write without copying.
func (e *Encoder) flush() error {
	payload := e.buf[chunkHead:]
	if len(payload) == 0 {
		return nil
	}
	e.raw += int64(len(payload))
	chunk := e.buf
	var head [chunkHead]byte
	h := append(head[:0], chunkRaw)
	h = binary.AppendUvarint(h, uint64(len(payload)))
	if e.zw != nil {
		z := e.zw.EncodeAll(payload, e.zbuf[:chunkHead])
		if zlen := len(z) - chunkHead; zlen < len(payload) {
			h = append(head[:0], chunkZstd)
			h = binary.AppendUvarint(h, uint64(len(payload)))
			h = binary.AppendUvarint(h, uint64(zlen))
			chunk = z
		}
		e.zbuf = z[:0]
	}
	start := chunkHead - len(h)
	copy(chunk[start:], h)
	err := e.write(chunk[start:])
	e.buf = e.buf[:chunkHead]
	return err
}

// Decoder reads a round stream into a Store. It is the Store's one writer.
type Decoder struct {
	r       io.Reader
	zd      *zstd.Decoder
	zstdOK  bool
	buf     []byte
	zbuf    []byte
	rest    []byte // records not yet applied
	prev    Key
	hasPrev bool
	pages   uint64
	deltas  uint64
	page    []byte
	done    bool
	err     error
}

// NewDecoder reads the stream header from r. The decoder never reads past
// the end of the stream.
func NewDecoder(r io.Reader) (*Decoder, error) {
	var hdr [6]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("pages: reading stream header: %w", err)
	}
	if string(hdr[:4]) != streamMagic {
		return nil, errors.New("pages: not a page stream")
	}
	if hdr[4] != streamVersion {
		return nil, fmt.Errorf("pages: stream version %d, want %d", hdr[4], streamVersion)
	}
	if hdr[5]&^flagZstd != 0 {
		return nil, fmt.Errorf("pages: unknown stream flags %#x", hdr[5])
	}
	return &Decoder{r: r, zstdOK: hdr[5]&flagZstd != 0, page: make([]byte, PageSize)}, nil
}

// Next applies the next record to s: a page is stored, a delta is applied to
// the page stored under its key. At the end of a round it returns the
// round's number and true. At the end of the stream it returns io.EOF;
// a stream cut short gives io.ErrUnexpectedEOF. Errors are final.
func (d *Decoder) Next(s *Store) (round int, endOfRound bool, err error) {
	if d.err != nil {
		return 0, false, d.err
	}
	round, endOfRound, err = d.next(s)
	if err != nil {
		if errors.Is(err, io.EOF) && !d.done {
			err = io.ErrUnexpectedEOF
		}
		d.err = err
		if d.zd != nil {
			d.zd.Close()
			d.zd = nil
		}
	}
	return round, endOfRound, err
}

var errRecord = errors.New("pages: malformed record in page stream")

func (d *Decoder) next(s *Store) (int, bool, error) {
	for len(d.rest) == 0 {
		if d.done {
			return 0, false, io.EOF
		}
		if err := d.readChunk(); err != nil {
			return 0, false, err
		}
	}
	tag := d.rest[0]
	d.rest = d.rest[1:]
	if tag&^(recSeq|3) != 0 {
		return 0, false, fmt.Errorf("pages: unknown record tag %#x", tag)
	}
	kind := tag & 3
	if kind == recEnd || kind == recRound {
		if tag&recSeq != 0 {
			return 0, false, errRecord
		}
	}
	switch kind {
	case recEnd:
		if len(d.rest) != 0 {
			return 0, false, errors.New("pages: data after the end of the page stream")
		}
		d.done = true
		return 0, false, io.EOF
	case recRound:
		round, ok1 := d.uvarint(math.MaxInt32)
		pages, ok2 := d.uvarint(math.MaxUint64)
		deltas, ok3 := d.uvarint(math.MaxUint64)
		if !ok1 || !ok2 || !ok3 {
			return 0, false, errRecord
		}
		if pages != d.pages || deltas != d.deltas {
			return 0, false, fmt.Errorf("pages: round %d: sender counted %d pages and %d deltas, received %d and %d",
				round, pages, deltas, d.pages, d.deltas)
		}
		d.pages, d.deltas = 0, 0
		return int(round), true, nil
	}

	k, err := d.key(tag&recSeq != 0)
	if err != nil {
		return 0, false, err
	}
	if kind == recPage {
		if len(d.rest) < PageSize {
			return 0, false, errRecord
		}
		if err := s.roomFor(k); err != nil {
			return 0, false, err
		}
		s.Put(k, d.rest[:PageSize])
		d.rest = d.rest[PageSize:]
		d.pages++
		return 0, false, nil
	}
	n, ok := d.uvarint(PageSize)
	if !ok || uint64(len(d.rest)) < n {
		return 0, false, errRecord
	}
	delta := d.rest[:n]
	d.rest = d.rest[n:]
	old, _, ok := s.Get(k)
	if !ok {
		return 0, false, fmt.Errorf("pages: delta for page %d:%#x that was never sent", k.PID, k.Addr)
	}
	page, err := ApplyDelta(old, delta, d.page)
	if err != nil {
		return 0, false, fmt.Errorf("pages: page %d:%#x: %w", k.PID, k.Addr, err)
	}
	s.Put(k, page)
	d.deltas++
	return 0, false, nil
}

func (d *Decoder) key(seq bool) (Key, error) {
	var k Key
	if seq {
		if !d.hasPrev || d.prev.Addr/PageSize >= maxPageNo {
			return k, errRecord
		}
		k = Key{PID: d.prev.PID, Addr: d.prev.Addr + PageSize}
	} else {
		pid, ok1 := d.uvarint(math.MaxUint32)
		pageNo, ok2 := d.uvarint(maxPageNo)
		if !ok1 || !ok2 {
			return k, errRecord
		}
		k = Key{PID: uint32(pid), Addr: pageNo * PageSize}
	}
	d.prev, d.hasPrev = k, true
	return k, nil
}

// uvarint takes a minimal varint of at most max from the pending records.
func (d *Decoder) uvarint(max uint64) (uint64, bool) {
	v, n := binary.Uvarint(d.rest)
	if n <= 0 || v > max || (n > 1 && d.rest[n-1] == 0) {
		return 0, false
	}
	d.rest = d.rest[n:]
	return v, true
}

// readChunk reads the next chunk, byte-exact so that nothing after the
// stream is consumed.
func (d *Decoder) readChunk() error {
	var b [1]byte
	if _, err := io.ReadFull(d.r, b[:]); err != nil {
		return err
	}
	kind := b[0]
	if kind != chunkRaw && (kind != chunkZstd || !d.zstdOK) {
		return fmt.Errorf("pages: unknown chunk kind %d", kind)
	}
	rawLen, err := d.readUvarint(maxChunk)
	if err != nil {
		return err
	}
	if rawLen == 0 {
		return errors.New("pages: empty chunk")
	}
	if cap(d.buf) < int(rawLen) {
		d.buf = make([]byte, 0, rawLen)
	}
	if kind == chunkRaw {
		d.buf = d.buf[:rawLen]
		if _, err := io.ReadFull(d.r, d.buf); err != nil {
			return unexpected(err)
		}
		d.rest = d.buf
		return nil
	}
	zlen, err := d.readUvarint(rawLen - 1)
	if err != nil {
		return err
	}
	if zlen == 0 {
		return errors.New("pages: empty compressed chunk")
	}
	if cap(d.zbuf) < int(zlen) {
		d.zbuf = make([]byte, 0, zlen)
	}
	d.zbuf = d.zbuf[:zlen]
	if _, err := io.ReadFull(d.r, d.zbuf); err != nil {
		return unexpected(err)
	}
	if d.zd == nil {
		d.zd, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxMemory(maxChunk), zstd.WithDecoderMaxWindow(maxChunk),
			zstd.WithDecodeAllCapLimit(true))
		if err != nil {
			return err
		}
	}
	out, err := d.zd.DecodeAll(d.zbuf, d.buf[:0:rawLen])
	if err != nil {
		return fmt.Errorf("pages: decompressing chunk: %w", err)
	}
	if uint64(len(out)) != rawLen {
		return fmt.Errorf("pages: chunk decompressed to %d bytes, header says %d", len(out), rawLen)
	}
	d.rest = out
	return nil
}

// readUvarint reads a minimal varint of at most max straight from the reader.
func (d *Decoder) readUvarint(max uint64) (uint64, error) {
	var v uint64
	var b [1]byte
	for i := 0; i < binary.MaxVarintLen64; i++ {
		if _, err := io.ReadFull(d.r, b[:]); err != nil {
			return 0, unexpected(err)
		}
		c := b[0]
		if i > 0 && c == 0 {
			return 0, errors.New("pages: non-minimal varint in chunk header")
		}
		if i == 9 && c > 1 {
			break
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			if v > max {
				return 0, fmt.Errorf("pages: chunk length %d over %d", v, max)
			}
			return v, nil
		}
		if v > max {
			return 0, fmt.Errorf("pages: chunk length over %d", max)
		}
	}
	return 0, errors.New("pages: varint overflow in chunk header")
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

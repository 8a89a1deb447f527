package pagestream

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// Expand reads ferry's encoded stream from src and writes the original CRIU
// byte stream to dst, taking referenced pages from have. A reference whose
// key is missing, whose stored hash differs from the one in the reference, or
// whose stored data does not hash to it is an error (ErrPageMismatch): the
// destination must never use a page that does not match the final dump.
// It returns after the end record; input that ends before it is an error.
func Expand(dst io.Writer, src io.Reader, have Source) (ExpandStats, error) {
	cw := &countWriter{w: dst}
	e := &expand{
		r:    bufio.NewReaderSize(src, bufSize),
		w:    bufio.NewWriterSize(cw, bufSize),
		have: have,
	}
	err := e.run()
	e.st.BytesOut = cw.n
	return e.st, err
}

type expand struct {
	r    *bufio.Reader
	w    *bufio.Writer
	have Source
	st   ExpandStats

	// Payload still owed by the last header.
	left  uint64
	pid   uint32
	keyed bool
	addr  uint64
}

func (e *expand) run() error {
	b, err := e.peek(len(magic))
	if err != nil {
		return readErr("stream magic", err)
	}
	if [4]byte(b) != magic {
		return fmt.Errorf("%w: bad magic %q", ErrMalformed, b)
	}
	e.discard(len(magic))
	for {
		b, err := e.peek(1)
		if err != nil {
			return readErr("record tag", err)
		}
		tag := b[0]
		e.discard(1)
		switch tag {
		case tagHeader:
			err = e.header()
		case tagPages:
			err = e.fullPages()
		case tagRef:
			err = e.ref()
		case tagEnd:
			if e.left != 0 {
				return fmt.Errorf("%w: end with %d pages of payload owed", ErrMalformed, e.left)
			}
			return e.w.Flush()
		default:
			err = fmt.Errorf("%w: unknown record tag %#x", ErrMalformed, tag)
		}
		if err != nil {
			return err
		}
	}
}

func (e *expand) header() error {
	if e.left != 0 {
		return fmt.Errorf("%w: header with %d pages of payload owed", ErrMalformed, e.left)
	}
	b, err := e.peek(headerSize)
	if err != nil {
		return readErr("page-server header", err)
	}
	h := parseHeader(b)
	if err := h.check(); err != nil {
		return err
	}
	if _, err := e.w.Write(b); err != nil {
		return err
	}
	e.discard(headerSize)
	e.left = h.payloadPages()
	e.pid, e.keyed = h.pid()
	e.addr = h.vaddr
	if h.wantsReply() {
		// CRIU's page server answers this before the client goes on.
		return e.w.Flush()
	}
	return nil
}

func (e *expand) fullPages() error {
	b, err := e.peek(4)
	if err != nil {
		return readErr("page run", err)
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	e.discard(4)
	if n == 0 || n > e.left {
		return fmt.Errorf("%w: run of %d pages where %d are owed", ErrMalformed, n, e.left)
	}
	for rest := n * PageSize; rest > 0; {
		if _, err := e.peek(1); err != nil {
			return readErr("page data", err)
		}
		b, _ := e.r.Peek(int(min(rest, uint64(e.r.Buffered()))))
		if _, err := e.w.Write(b); err != nil {
			return err
		}
		e.discard(len(b))
		rest -= uint64(len(b))
	}
	e.advance(n)
	return nil
}

func (e *expand) ref() error {
	b, err := e.peek(refSize)
	if err != nil {
		return readErr("page reference", err)
	}
	k := PageKey{PID: binary.LittleEndian.Uint32(b), Addr: binary.LittleEndian.Uint64(b[4:])}
	want := Hash{Hi: binary.LittleEndian.Uint64(b[12:]), Lo: binary.LittleEndian.Uint64(b[20:])}
	e.discard(refSize)
	if e.left == 0 || !e.keyed || k != (PageKey{PID: e.pid, Addr: e.addr}) {
		return fmt.Errorf("%w: reference to %d/%#x out of place", ErrMalformed, k.PID, k.Addr)
	}
	if e.have == nil {
		return fmt.Errorf("%w: %d/%#x: no page source", ErrPageMismatch, k.PID, k.Addr)
	}
	data, h, ok := e.have(k)
	switch {
	case !ok:
		return fmt.Errorf("%w: %d/%#x: not held", ErrPageMismatch, k.PID, k.Addr)
	case h != want:
		return fmt.Errorf("%w: %d/%#x: held with another hash", ErrPageMismatch, k.PID, k.Addr)
	case len(data) != PageSize:
		return fmt.Errorf("%w: %d/%#x: held copy is %d bytes", ErrPageMismatch, k.PID, k.Addr, len(data))
	case HashPage(data) != want:
		// A stale or damaged store must not slip into the image.
		return fmt.Errorf("%w: %d/%#x: held data does not match its hash", ErrPageMismatch, k.PID, k.Addr)
	}
	if _, err := e.w.Write(data); err != nil {
		return err
	}
	e.st.Referenced++
	e.advance(1)
	return nil
}

func (e *expand) advance(n uint64) {
	e.left -= n
	e.addr += n * PageSize
	e.st.Pages += n
}

// peek returns the next n input bytes, flushing the output first when they
// are not buffered yet, so CRIU never waits on bytes held here.
func (e *expand) peek(n int) ([]byte, error) {
	if e.r.Buffered() < n {
		if err := e.w.Flush(); err != nil {
			return nil, writeError{err}
		}
	}
	return e.r.Peek(n)
}

func (e *expand) discard(n int) {
	e.r.Discard(n)
	e.st.BytesIn += int64(n)
}

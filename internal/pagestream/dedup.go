package pagestream

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Dedup reads CRIU's client stream from src and writes ferry's encoded stream
// to dst: headers and non-page bytes pass through; each page of a PE_PRESENT
// add whose key the destination holds with an equal hash becomes a reference
// record carrying the key and the hash; other pages go in full. It returns
// when src ends (EOF) at a header boundary and reports counts.
func Dedup(dst io.Writer, src io.Reader, have Lookup) (DedupStats, error) {
	cw := &countWriter{w: dst}
	d := &dedup{
		r:    bufio.NewReaderSize(src, bufSize),
		w:    bufio.NewWriterSize(cw, bufSize),
		have: have,
	}
	err := d.run()
	d.st.BytesOut = cw.n
	return d.st, err
}

type dedup struct {
	r    *bufio.Reader
	w    *bufio.Writer
	have Lookup
	st   DedupStats
	rec  [1 + refSize]byte
}

func (d *dedup) run() error {
	if _, err := d.w.Write(magic[:]); err != nil {
		return err
	}
	for {
		b, err := d.peek(headerSize)
		if len(b) == 0 && errors.Is(err, io.EOF) {
			d.w.WriteByte(tagEnd)
			return d.w.Flush()
		}
		if err != nil {
			return readErr("page-server header", err)
		}
		h := parseHeader(b)
		if err := h.check(); err != nil {
			return err
		}
		d.w.WriteByte(tagHeader)
		if _, err := d.w.Write(b); err != nil {
			return err
		}
		d.discard(headerSize)
		if h.wantsReply() {
			// CRIU sends nothing more until the reply comes back.
			if err := d.w.Flush(); err != nil {
				return err
			}
		}
		if n := h.payloadPages(); n > 0 {
			if err := d.pages(h, n); err != nil {
				return err
			}
		}
	}
}

// pages encodes the n pages following header h, a chunk of whole pages at a
// time straight out of the read buffer.
func (d *dedup) pages(h header, n uint64) error {
	pid, keyed := h.pid()
	keyed = keyed && d.have != nil
	addr := h.vaddr
	for n > 0 {
		// Take what is buffered, but never ask for more than the payload:
		// bytes past it may not be sent until CRIU gets a reply.
		c := min(uint64(max(d.r.Buffered()/PageSize, 1)), n, bufSize/PageSize)
		buf, err := d.peek(int(c) * PageSize)
		if err != nil {
			return readErr("page data", err)
		}
		run := 0 // first page of the pending full-page run
		for i := 0; keyed && i < int(c); i++ {
			page := buf[i*PageSize : (i+1)*PageSize]
			k := PageKey{PID: pid, Addr: addr + uint64(i)*PageSize}
			want, ok := d.have(k)
			if !ok || HashPage(page) != want {
				continue
			}
			if err := d.fullPages(buf[run*PageSize : i*PageSize]); err != nil {
				return err
			}
			if err := d.ref(k, want); err != nil {
				return err
			}
			run = i + 1
		}
		if err := d.fullPages(buf[run*PageSize : int(c)*PageSize]); err != nil {
			return err
		}
		d.st.Pages += c
		d.discard(int(c) * PageSize)
		addr += c * PageSize
		n -= c
	}
	return nil
}

func (d *dedup) fullPages(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	d.rec[0] = tagPages
	binary.LittleEndian.PutUint32(d.rec[1:], uint32(len(b)/PageSize))
	d.w.Write(d.rec[:5])
	_, err := d.w.Write(b) // bufio errors are sticky: this reports both
	return err
}

func (d *dedup) ref(k PageKey, h Hash) error {
	d.rec[0] = tagRef
	binary.LittleEndian.PutUint32(d.rec[1:], k.PID)
	binary.LittleEndian.PutUint64(d.rec[5:], k.Addr)
	binary.LittleEndian.PutUint64(d.rec[13:], h.Hi)
	binary.LittleEndian.PutUint64(d.rec[21:], h.Lo)
	d.st.Referenced++
	_, err := d.w.Write(d.rec[:])
	return err
}

// peek returns the next n input bytes, flushing the output first when they
// are not buffered yet: whatever is held back may be what the other side
// needs before it sends more.
func (d *dedup) peek(n int) ([]byte, error) {
	if d.r.Buffered() < n {
		if err := d.w.Flush(); err != nil {
			return nil, writeError{err}
		}
	}
	return d.r.Peek(n)
}

func (d *dedup) discard(n int) {
	d.r.Discard(n)
	d.st.BytesIn += int64(n)
}

// writeError marks a failed flush met while waiting for input.
type writeError struct{ err error }

func (e writeError) Error() string { return "pagestream: writing: " + e.err.Error() }
func (e writeError) Unwrap() error { return e.err }

// readErr turns an end of input inside a unit into a truncation error.
func readErr(what string, err error) error {
	if errors.As(err, new(writeError)) {
		return err
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("pagestream: reading %s: %w", what, err)
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

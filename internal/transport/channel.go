package transport

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// dataChunk is the largest piece Write puts in one data frame.
const dataChunk = 256 << 10

// RemoteError is an error the peer reported on a channel.
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string { return e.Msg }

// Channel is one multiplexed, full-duplex stream of frames: control
// messages (Send/Recv) and a byte stream (Write/Read/CloseWrite). Writes are
// safe from several goroutines; reads belong to one goroutine.
type Channel struct {
	Kind string

	rwc io.ReadWriteCloser

	wmu  sync.Mutex
	wseq uint64
	wbuf []byte

	rseq    uint64
	rbuf    []byte
	pending []byte
	rerr    error
	eof     bool // the peer ended its byte stream; control messages may follow
}

func newChannel(rwc io.ReadWriteCloser) *Channel { return &Channel{rwc: rwc} }

func (c *Channel) writeFrame(t FrameType, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := headerSize + len(p)
	if cap(c.wbuf) < n {
		c.wbuf = make([]byte, n)
	}
	buf := c.wbuf[:n]
	putHeader(buf, Frame{Type: t, Seq: c.wseq, Payload: p})
	copy(buf[headerSize:], p)
	c.wseq++
	_, err := c.rwc.Write(buf)
	return err
}

// readFrame returns the next frame, checking its sequence number.
func (c *Channel) readFrame() (Frame, error) {
	if c.rerr != nil {
		return Frame{}, c.rerr
	}
	f, err := ReadFrame(c.rwc, c.rbuf)
	if err != nil {
		c.rerr = err
		return Frame{}, err
	}
	c.rbuf = f.Payload[:0]
	if f.Seq != c.rseq {
		c.rerr = fmt.Errorf("transport: frame %d arrived where %d was due", f.Seq, c.rseq)
		return Frame{}, c.rerr
	}
	c.rseq++
	if f.Type == FrameError {
		c.rerr = &RemoteError{Msg: string(f.Payload)}
		return Frame{}, c.rerr
	}
	return f, nil
}

// Send writes one control message, JSON-encoded.
func (c *Channel) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.writeFrame(FrameControl, b)
}

// Recv reads the next control message into v. A data frame in its place is
// a protocol error.
func (c *Channel) Recv(v any) error {
	f, err := c.readFrame()
	if err != nil {
		return err
	}
	if f.Type != FrameControl {
		return fmt.Errorf("transport: expected a control message on %q, got a %s frame", c.Kind, f.Type)
	}
	if err := json.Unmarshal(f.Payload, v); err != nil {
		return fmt.Errorf("transport: bad control message on %q: %w", c.Kind, err)
	}
	return nil
}

// Write sends p as data frames.
func (c *Channel) Write(p []byte) (int, error) {
	done := 0
	for len(p) > 0 {
		n := min(len(p), dataChunk)
		if err := c.writeFrame(FrameData, p[:n]); err != nil {
			return done, err
		}
		done += n
		p = p[n:]
	}
	return done, nil
}

// CloseWrite ends this side's byte stream; the peer's Read returns io.EOF.
func (c *Channel) CloseWrite() error { return c.writeFrame(FrameEnd, nil) }

// Fail tells the peer this side gave up, with the reason.
func (c *Channel) Fail(err error) error { return c.writeFrame(FrameError, []byte(err.Error())) }

// Read reads the byte stream until the peer's CloseWrite (io.EOF).
func (c *Channel) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.eof {
			return 0, io.EOF
		}
		f, err := c.readFrame()
		if err != nil {
			return 0, err
		}
		switch f.Type {
		case FrameEnd:
			c.eof = true
			return 0, io.EOF
		case FrameData:
			c.pending = f.Payload
		default:
			c.rerr = fmt.Errorf("transport: expected data on %q, got a %s frame", c.Kind, f.Type)
			return 0, c.rerr
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// Close closes the channel in both directions.
func (c *Channel) Close() error { return c.rwc.Close() }

// IsRemote reports whether err came from the peer.
func IsRemote(err error) bool {
	var re *RemoteError
	return errors.As(err, &re)
}

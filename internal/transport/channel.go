package transport

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// dataChunk is the largest piece Write puts in one data frame (which
// reaches the stream in writes of at most maxStreamWrite).
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

	// maxControl bounds one control message Recv reassembles; 0 means
	// MaxControlMessage. A channel whose peer is not yet trusted (the
	// handshake's) may lower it.
	maxControl int
}

func newChannel(rwc io.ReadWriteCloser) *Channel { return &Channel{rwc: rwc} }

func (c *Channel) writeFrame(t FrameType, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeFrameLocked(t, p)
}

// writeFrameLocked writes one frame; c.wmu is held.
func (c *Channel) writeFrameLocked(t FrameType, p []byte) error {
	n := headerSize + len(p)
	if cap(c.wbuf) < n {
		c.wbuf = make([]byte, n)
	}
	buf := c.wbuf[:n]
	putHeader(buf, Frame{Type: t, Seq: c.wseq, Payload: p})
	copy(buf[headerSize:], p)
	c.wseq++
	for len(buf) > 0 {
		n := min(len(buf), maxStreamWrite)
		if _, err := c.rwc.Write(buf[:n]); err != nil {
			return err
		}
		buf = buf[n:]
	}
	return nil
}

// maxStreamWrite bounds one write into a channel's stream, and so one
// yamux data frame. yamux holds a stream's receive lock while it reads a
// frame's body off the connection, so the channel's reader cannot take
// what already arrived until the whole frame has crossed the link. With
// 256 KiB frames a reader behind by a little stayed behind (it could take
// about one frame per frame that arrived) until the stream's window ran
// out and the sender stopped: pre-copy's first round ran at 1.10-1.15x the
// link, with the link idle for 20-40 ms at a time. 128 KiB is about a
// millisecond of a 1 Gbit/s link; larger control messages are cut too.
const maxStreamWrite = 128 << 10

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

// Send writes one control message, JSON-encoded. A message larger than
// MaxPayload goes out as FrameControlMore frames of MaxPayload bytes and a
// last FrameControl frame, all under the write lock, so that no other
// goroutine's frames land between them. A message larger than
// MaxControlMessage is refused here, as the peer would refuse it.
func (c *Channel) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxControlMessage {
		return fmt.Errorf("transport: control message of %d bytes on %q exceeds %d", len(b), c.Kind, MaxControlMessage)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(b) > MaxPayload {
		if err := c.writeFrameLocked(FrameControlMore, b[:MaxPayload]); err != nil {
			return err
		}
		b = b[MaxPayload:]
	}
	return c.writeFrameLocked(FrameControl, b)
}

// Recv reads the next control message into v, reassembling it when it
// spans several frames. A data or end frame in its place, or in the middle
// of it, is a protocol error; an error frame is the peer's RemoteError.
func (c *Channel) Recv(v any) error {
	f, err := c.readFrame()
	if err != nil {
		return err
	}
	msg := f.Payload
	switch f.Type {
	case FrameControl:
	case FrameControlMore:
		if msg, err = c.reassemble(f.Payload); err != nil {
			return err
		}
	default:
		return fmt.Errorf("transport: expected a control message on %q, got a %s frame", c.Kind, f.Type)
	}
	if err := json.Unmarshal(msg, v); err != nil {
		return fmt.Errorf("transport: bad control message on %q: %w", c.Kind, err)
	}
	return nil
}

// reassemble reads the rest of a control message whose first piece came in
// a FrameControlMore frame, up to and including its FrameControl frame. The
// message grows with what actually arrives, never beyond the channel's
// bound. Any failure leaves the channel broken (c.rerr), since its next
// frame would be in the middle of a message.
func (c *Channel) reassemble(first []byte) ([]byte, error) {
	limit := c.maxControl
	if limit <= 0 {
		limit = MaxControlMessage
	}
	var msg []byte
	piece, last := first, false
	for {
		if len(piece) == 0 && !last {
			c.rerr = fmt.Errorf("transport: empty control-continues frame on %q", c.Kind)
			return nil, c.rerr
		}
		if len(piece) > limit-len(msg) {
			c.rerr = fmt.Errorf("transport: control message on %q exceeds %d bytes", c.Kind, limit)
			return nil, c.rerr
		}
		if len(msg)+len(piece) > cap(msg) {
			grown := make([]byte, len(msg), min(limit, max(2*cap(msg), len(msg)+len(piece), 4*MaxPayload)))
			copy(grown, msg)
			msg = grown
		}
		msg = append(msg, piece...)
		if last {
			return msg, nil
		}
		f, err := c.readFrame()
		if err != nil {
			if errors.Is(err, io.EOF) {
				c.rerr = fmt.Errorf("transport: control message on %q cut short after %d bytes: %w", c.Kind, len(msg), io.ErrUnexpectedEOF)
				return nil, c.rerr
			}
			return nil, err // the peer's RemoteError among them
		}
		switch f.Type {
		case FrameControlMore:
		case FrameControl:
			last = true
		default:
			c.rerr = fmt.Errorf("transport: %s frame in the middle of a control message on %q", f.Type, c.Kind)
			return nil, c.rerr
		}
		piece = f.Payload
	}
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

// Ended says whether the peer ended its byte stream (CloseWrite). A
// channel closed or cut off without that also reads as io.EOF.
func (c *Channel) Ended() bool { return c.eof }

// Close closes the channel in both directions.
func (c *Channel) Close() error { return c.rwc.Close() }

// IsRemote reports whether err came from the peer.
func IsRemote(err error) bool {
	var re *RemoteError
	return errors.As(err, &re)
}

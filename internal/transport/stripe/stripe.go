// Package stripe carries one reliable, ordered, full-duplex byte stream (a
// net.Conn) over several sub-connections, for paths where MPTCP is not
// available. Writes are cut into numbered chunks that any live sub-connection
// may carry; the receiver puts them back in order. A sub-connection that
// errors, or stays silent for PathTimeout (a cut path often just hangs), is
// dropped and its unacknowledged chunks are resent on the others, so a
// transfer survives losing paths, and even losing all of them for up to
// OutageTimeout if one comes back (the dialing side re-dials by itself).
//
// Both ends must use the same Window: the receiver enforces it as the bound of
// what it buffers for the reader. Stripe has no session identifier of its own:
// the accepting side must hand a re-dialed sub-connection to the right Conn's
// Add (ferry's authenticated handshake names the migration).
package stripe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// ErrOutage is returned (wrapped) by Read and Write once no sub-connection has
// been alive for Options.OutageTimeout.
var ErrOutage = errors.New("stripe: outage: no sub-connection alive")

// ErrPeerClosed is returned by Write after the peer has closed the Conn: it
// will not read anything more (the equivalent of EPIPE).
var ErrPeerClosed = errors.New("stripe: peer closed the connection")

var errSilent = errors.New("stripe: path silent for too long")

// Options tune a Conn. Zero fields take the defaults.
type Options struct {
	// ChunkSize is the largest DATA payload (default 64 KiB, at most 1 MiB).
	ChunkSize int
	// Window bounds the bytes written but not yet read by the peer; Write
	// blocks beyond it (default 16 MiB). Must match on both ends.
	Window int
	// KeepAlive is how often an idle sub-connection sends a PING (default
	// 250ms, at most PathTimeout/4 so that idle paths never look dead).
	KeepAlive time.Duration
	// PathTimeout declares a sub-connection dead once nothing at all was read
	// from it for this long (default 2s).
	PathTimeout time.Duration
	// OutageTimeout fails the Conn once no sub-connection has been alive for
	// this long (default 30s). After Close, it also bounds how long the Conn
	// keeps delivering unacknowledged data in the background.
	OutageTimeout time.Duration
	// Redial, set on the dialing side only, opens a replacement
	// sub-connection whenever fewer are alive than the most the Conn has had.
	// Its context is canceled when the Conn ends or after 5*PathTimeout.
	Redial func(ctx context.Context) (net.Conn, error)
}

func (o Options) withDefaults() Options {
	if o.ChunkSize <= 0 {
		o.ChunkSize = 64 << 10
	}
	o.ChunkSize = min(o.ChunkSize, maxPayload)
	if o.Window <= 0 {
		o.Window = 16 << 20
	}
	o.Window = max(o.Window, o.ChunkSize)
	if o.PathTimeout <= 0 {
		o.PathTimeout = 2 * time.Second
	}
	o.PathTimeout = max(o.PathTimeout, 10*time.Millisecond) // keeps the timers sane
	if o.KeepAlive <= 0 {
		o.KeepAlive = 250 * time.Millisecond
	}
	o.KeepAlive = min(o.KeepAlive, o.PathTimeout/4)
	if o.OutageTimeout <= 0 {
		o.OutageTimeout = 30 * time.Second
	}
	return o
}

const (
	ackDelay   = 20 * time.Millisecond // upper bound on how long a read goes unacknowledged
	minBackoff = 200 * time.Millisecond
	maxBackoff = time.Second
)

// PathStats describes one sub-connection ever attached to a Conn.
type PathStats struct {
	Remote   string
	Alive    bool
	Sent     int64 // bytes written to the sub-connection, framing included
	Received int64 // bytes read from it, framing included
	Err      error // why it was dropped, if it was
}

// chunk is one DATA frame, kept until the peer acknowledges it. buf holds the
// header followed by the payload, so a (re)send is a single Write.
type chunk struct {
	seq     uint64
	buf     []byte
	sealed  bool  // header written; the payload may no longer grow
	path    *path // sub-conn it was last handed to; nil while queued
	sending int   // writers still writing buf; it is recycled only after
	acked   bool
}

func (ch *chunk) size() int { return len(ch.buf) - hdrLen }

// signal is a broadcast wake-up that, unlike sync.Cond, can be combined with
// timers in a select. Both methods need the Conn's lock.
type signal struct{ ch chan struct{} }

func (s *signal) wait() <-chan struct{} {
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// Conn is a byte stream striped over sub-connections. It implements net.Conn.
type Conn struct {
	opts     Options
	ackEvery int       // consumed bytes that trigger an immediate ACK
	bufs     sync.Pool // of *[]byte with capacity hdrLen+ChunkSize

	ctx     context.Context // canceled when the Conn ends; bounds Redial
	cancel  context.CancelFunc
	quit    chan struct{} // closed when the Conn ends
	done    chan struct{} // closed once every goroutine has exited
	wg      sync.WaitGroup
	writeMu sync.Mutex // keeps each Write contiguous, as on a socket

	mu          sync.Mutex
	closed      bool  // Close was called
	ended       bool  // nothing more will be sent or delivered
	hardEnd     bool  // ended by failure: drop paths at once, no flush
	err         error // why it ended; nil after a clean close
	paths       []*path
	alive       int
	target      int       // most sub-conns alive at once; Redial restores it
	outageSince time.Time // when the last path died; zero while one is alive
	lingerUntil time.Time // after Close, deadline for the peer to ack everything
	rdl, wdl    time.Time
	readSig     signal // data, EOF, error or read deadline change
	writeSig    signal // window space, error or write deadline change
	workSig     signal // something for path writers to send
	pathSig     signal // paths added or lost

	// Send side.
	nextSeq      uint64
	acked        uint64   // every chunk below this was read by the peer
	unacked      []*chunk // in seq order
	unackedBytes int
	queue        []*chunk // waiting for a path writer, lowest seq first
	tail         *chunk   // newest chunk, which small writes may still fill
	finSeq       uint64   // nextSeq at Close

	// Receive side.
	recv        map[uint64][]byte // reorder buffer, including the chunk being read
	recvNext    uint64            // seq of the chunk Read is consuming
	recvOff     int               // how much of it was consumed
	recvBytes   int
	peerFin     bool
	peerFinSeq  uint64
	ackWanted   bool
	ackSent     uint64 // last ack value handed to a writer
	unackedRead int    // bytes consumed since then
	ackTimer    *time.Timer
}

// New returns a Conn with no sub-connections yet; attach them with Add. If
// none is attached within OutageTimeout the Conn fails.
func New(opts Options) *Conn {
	opts = opts.withDefaults()
	c := &Conn{
		opts:        opts,
		ackEvery:    max(1, min(opts.Window/4, 1<<20)),
		quit:        make(chan struct{}),
		done:        make(chan struct{}),
		recv:        make(map[uint64][]byte),
		outageSince: time.Now(),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.supervise()
	if opts.Redial != nil {
		c.wg.Add(1)
		go c.redialLoop()
	}
	return c
}

// Add attaches an established sub-connection, initially or to replace a lost
// one. The Conn owns sub from then on, even when Add fails because the Conn
// has ended.
func (c *Conn) Add(sub net.Conn) error {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		sub.Close()
		return net.ErrClosed
	}
	p := &path{conn: sub}
	if a := sub.RemoteAddr(); a != nil {
		p.remote = a.String()
	}
	p.lastRead.Store(time.Now().UnixNano())
	c.paths = append(c.paths, p)
	c.alive++
	c.target = max(c.target, c.alive)
	c.outageSince = time.Time{}
	c.pathSig.fire()
	c.wg.Add(2)
	c.mu.Unlock()
	go c.readLoop(p)
	go c.writeLoop(p)
	return nil
}

// Read reads data in order. After the peer's Close it returns io.EOF once
// everything the peer wrote has been read.
func (c *Conn) Read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return 0, net.ErrClosed
		}
		if len(b) == 0 {
			return 0, nil
		}
		if n := c.readLocked(b); n > 0 {
			return n, nil
		}
		if c.peerFin && c.recvNext == c.peerFinSeq {
			return 0, io.EOF
		}
		if c.err != nil {
			return 0, c.err
		}
		if err := c.waitLocked(&c.readSig, c.rdl); err != nil {
			return 0, err
		}
	}
}

// readLocked copies contiguous data into b and schedules an ACK for it.
func (c *Conn) readLocked(b []byte) int {
	n := 0
	for n < len(b) {
		data, ok := c.recv[c.recvNext]
		if !ok {
			break
		}
		k := copy(b[n:], data[c.recvOff:])
		n += k
		c.recvOff += k
		if c.recvOff == len(data) {
			delete(c.recv, c.recvNext)
			c.putBuf(data)
			c.recvNext++
			c.recvOff = 0
			c.recvBytes -= len(data)
			c.unackedRead += len(data)
		}
	}
	switch {
	case c.peerFin && c.recvNext == c.peerFinSeq, c.unackedRead >= c.ackEvery:
		c.wantAckLocked() // EOF reached, or enough to reopen the peer's window
	case c.ackValueLocked() > c.ackSent && c.ackTimer == nil:
		c.ackTimer = time.AfterFunc(ackDelay, c.ackTimerFired)
	}
	return n
}

func (c *Conn) ackTimerFired() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ackTimer = nil
	if !c.ended && c.ackValueLocked() > c.ackSent {
		c.wantAckLocked()
	}
}

func (c *Conn) wantAckLocked() {
	c.ackWanted = true
	c.workSig.fire()
}

// ackValueLocked is what we tell the peer: chunks consumed, plus one for the
// peer's CLOSE once everything before it was consumed (so the peer knows we
// reached EOF and can stop).
func (c *Conn) ackValueLocked() uint64 {
	if c.peerFin && c.recvNext == c.peerFinSeq {
		return c.recvNext + 1
	}
	return c.recvNext
}

// Write queues b for sending, blocking while Window bytes are unacknowledged.
func (c *Conn) Write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for {
		switch {
		case c.closed:
			return n, net.ErrClosed
		case c.err != nil:
			return n, c.err
		case c.peerFin:
			return n, ErrPeerClosed
		case n == len(b):
			return n, nil
		}
		if room := c.opts.Window - c.unackedBytes; room > 0 {
			k := min(room, len(b)-n)
			c.enqueueLocked(b[n : n+k])
			n += k
			continue
		}
		if err := c.waitLocked(&c.writeSig, c.wdl); err != nil {
			return n, err
		}
	}
}

// enqueueLocked cuts p into chunks. Bytes go into the newest chunk while no
// writer has taken it yet, so small writes coalesce when the paths are busy
// and still leave at once when they are idle.
func (c *Conn) enqueueLocked(p []byte) {
	for len(p) > 0 {
		t := c.tail
		if t == nil || t.sealed || t.size() == c.opts.ChunkSize {
			t = &chunk{seq: c.nextSeq}
			if len(p) >= c.opts.ChunkSize {
				t.buf = c.getBuf(hdrLen)
			} else {
				t.buf = make([]byte, hdrLen, hdrLen+len(p)) // small writes stay small
			}
			c.nextSeq++
			c.unacked = append(c.unacked, t)
			c.queue = append(c.queue, t)
			c.tail = t
		}
		k := min(c.opts.ChunkSize-t.size(), len(p))
		t.buf = append(t.buf, p[:k]...)
		c.unackedBytes += k
		p = p[k:]
	}
	c.workSig.fire()
}

// getBuf and putBuf recycle full-size chunk buffers, which are the bulk of a
// transfer's allocations (and of its GC and page-fault cost).
func (c *Conn) getBuf(n int) []byte {
	if n > hdrLen+c.opts.ChunkSize {
		return make([]byte, n)
	}
	if b, ok := c.bufs.Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, hdrLen+c.opts.ChunkSize)
}

func (c *Conn) putBuf(b []byte) {
	if cap(b) == hdrLen+c.opts.ChunkSize {
		b = b[:0]
		c.bufs.Put(&b)
	}
}

// waitLocked releases the lock until s fires or the deadline passes; the
// caller re-checks its condition afterwards.
func (c *Conn) waitLocked(s *signal, deadline time.Time) error {
	var expired <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	ch := s.wait()
	c.mu.Unlock()
	defer c.mu.Lock()
	select {
	case <-ch:
	case <-expired:
	}
	return nil
}

// Close ends the Conn: local Read and Write fail at once. Like a TCP close it
// does not block; unacknowledged data keeps being delivered in the background
// (for up to OutageTimeout), then the peer's Read returns io.EOF. Done closes
// when that is over, and Err reports whether it went well.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.closed = true
	c.finSeq = c.nextSeq
	c.lingerUntil = time.Now().Add(c.opts.OutageTimeout)
	c.recv, c.recvBytes = nil, 0 // nobody will read it
	c.readSig.fire()
	c.writeSig.fire()
	c.workSig.fire() // writers now send CLOSE on every path
	if c.peerFin || c.target == 0 {
		c.endLocked(nil, false) // nobody to deliver to
	}
	return nil
}

// endLocked stops the Conn. A graceful end lets writers flush pending control
// frames and half-close their paths; readers drain until the peer closes too
// (so no RST destroys frames in flight), both bounded by PathTimeout.
func (c *Conn) endLocked(err error, hard bool) {
	if c.ended {
		return
	}
	c.ended, c.hardEnd = true, hard
	if c.err == nil {
		c.err = err
	}
	c.cancel()
	close(c.quit)
	if c.ackTimer != nil {
		c.ackTimer.Stop()
	}
	c.queue, c.unacked, c.tail, c.unackedBytes = nil, nil, nil, 0
	deadline := time.Now().Add(c.opts.PathTimeout)
	if hard {
		deadline = time.Unix(1, 0) // unblocks every read and write now
	}
	for _, p := range c.paths {
		if !p.dead {
			p.conn.SetDeadline(deadline)
		}
	}
	c.readSig.fire()
	c.writeSig.fire()
	c.workSig.fire()
	c.pathSig.fire()
	go func() {
		c.wg.Wait()
		close(c.done)
	}()
}

// needPathsLocked says whether the Conn still has anything to exchange.
func (c *Conn) needPathsLocked() bool {
	return !c.ended && !(c.peerFin && (c.closed || c.recvNext == c.peerFinSeq))
}

// Done is closed once the Conn has ended (outage, or Close completed) and all
// its goroutines have exited.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err reports why the Conn ended: nil after a Close whose data all reached
// the peer's reader, otherwise the failure. It is meaningful once Done is
// closed.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Paths reports every sub-connection ever attached, in order.
func (c *Conn) Paths() []PathStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]PathStats, len(c.paths))
	for i, p := range c.paths {
		out[i] = PathStats{Remote: p.remote, Alive: !p.dead, Sent: p.sent.Load(), Received: p.received.Load(), Err: p.err}
	}
	return out
}

type stripeAddr struct{}

func (stripeAddr) Network() string { return "stripe" }
func (stripeAddr) String() string  { return "stripe" }

// LocalAddr is the local address of the first sub-connection.
func (c *Conn) LocalAddr() net.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.paths) > 0 && c.paths[0].conn.LocalAddr() != nil {
		return c.paths[0].conn.LocalAddr()
	}
	return stripeAddr{}
}

// RemoteAddr is the remote address of the first sub-connection.
func (c *Conn) RemoteAddr() net.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.paths) > 0 && c.paths[0].conn.RemoteAddr() != nil {
		return c.paths[0].conn.RemoteAddr()
	}
	return stripeAddr{}
}

func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl, c.wdl = t, t
	c.readSig.fire()
	c.writeSig.fire()
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl = t
	c.readSig.fire()
	return nil
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wdl = t
	c.writeSig.fire()
	return nil
}

func outageError(d time.Duration) error {
	return fmt.Errorf("%w for %v", ErrOutage, d)
}

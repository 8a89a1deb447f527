package stripe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"
)

// path is one sub-connection, served by a reader and a writer goroutine.
type path struct {
	conn   net.Conn
	remote string
	ctl    [hdrLen]byte // control frame being written; writer goroutine only

	sent, received atomic.Int64
	lastRead       atomic.Int64 // unix nanoseconds of the last byte read

	// Guarded by Conn.mu.
	dead    bool
	err     error // why it died
	finSent bool
}

// Read stamps liveness on every byte that arrives, so a path carrying one
// slow, large frame is not mistaken for a silent one.
func (p *path) Read(b []byte) (int, error) {
	n, err := p.conn.Read(b)
	if n > 0 {
		p.received.Add(int64(n))
		p.lastRead.Store(time.Now().UnixNano())
	}
	return n, err
}

func (c *Conn) readLoop(p *path) {
	defer c.wg.Done()
	r := bufio.NewReaderSize(p, 32<<10)
	for {
		f, err := readFrame(r, c.getBuf)
		if err == nil {
			err = c.handle(f)
		}
		if err != nil {
			c.killPath(p, err)
			return
		}
	}
}

// handle applies one received frame. An error condemns the path it came on.
func (c *Conn) handle(f frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil // draining before close
	}
	switch f.typ {
	case frameData:
		return c.handleDataLocked(f.num, f.payload)
	case frameAck, framePing:
		return c.handleAckLocked(f.num)
	case frameClose:
		return c.handleCloseLocked(f.num)
	}
	return nil
}

func (c *Conn) handleDataLocked(seq uint64, data []byte) error {
	if c.closed {
		c.putBuf(data)
		return nil
	}
	if _, dup := c.recv[seq]; dup || seq < c.recvNext {
		// A resend: the peer may have missed our last ACK, repeat it.
		c.putBuf(data)
		c.wantAckLocked()
		return nil
	}
	if c.peerFin && seq >= c.peerFinSeq {
		return fmt.Errorf("stripe: DATA %d after CLOSE at %d", seq, c.peerFinSeq)
	}
	if c.recvBytes+len(data) > c.opts.Window {
		c.endLocked(errors.New("stripe: peer overran the receive window (Window must match on both ends)"), true)
		return nil
	}
	c.recv[seq] = data
	c.recvBytes += len(data)
	if seq == c.recvNext {
		c.readSig.fire()
	}
	return nil
}

func (c *Conn) handleAckLocked(n uint64) error {
	limit := c.nextSeq
	if c.closed {
		limit++ // our CLOSE counts as one more
	}
	if n > limit {
		return fmt.Errorf("stripe: ACK %d beyond %d sent", n, limit)
	}
	if n <= c.acked {
		return nil
	}
	c.acked = n
	i := 0
	for ; i < len(c.unacked) && c.unacked[i].seq < n; i++ {
		ch := c.unacked[i]
		c.unackedBytes -= ch.size()
		if ch == c.tail {
			c.tail = nil
		}
		ch.acked = true
		c.recycleLocked(ch)
		c.unacked[i] = nil
	}
	c.unacked = c.unacked[i:]
	c.writeSig.fire()
	if c.closed && n > c.finSeq {
		c.endLocked(nil, false) // the peer has read everything and seen EOF
	}
	return nil
}

// recycleLocked returns an acknowledged chunk's buffer once no writer is still
// writing it (an ACK can overtake a resend of a chunk already delivered).
func (c *Conn) recycleLocked(ch *chunk) {
	if ch.acked && ch.sending == 0 && ch.buf != nil {
		c.putBuf(ch.buf)
		ch.buf = nil
	}
}

func (c *Conn) handleCloseLocked(fin uint64) error {
	if c.peerFin {
		if fin != c.peerFinSeq {
			return fmt.Errorf("stripe: CLOSE at %d, earlier at %d", fin, c.peerFinSeq)
		}
		return nil // the same CLOSE via another path
	}
	if fin < c.recvNext {
		return fmt.Errorf("stripe: CLOSE at %d but %d chunks read", fin, c.recvNext)
	}
	c.peerFin, c.peerFinSeq = true, fin
	if c.closed {
		c.endLocked(nil, false)
		return nil
	}
	// The peer reads nothing more: drop what we still hold for it.
	c.queue, c.unacked, c.tail, c.unackedBytes = nil, nil, nil, 0
	if c.recvNext == fin {
		c.wantAckLocked()
	}
	c.readSig.fire()
	c.writeSig.fire()
	c.pathSig.fire()
	return nil
}

// killPath declares p dead: its unacknowledged chunks go back to the front of
// the queue for the other paths, and the sub-connection is closed.
func (c *Conn) killPath(p *path, err error) {
	c.mu.Lock()
	if p.dead {
		c.mu.Unlock()
		return
	}
	p.dead, p.err = true, err
	c.alive--
	if !c.ended {
		n := len(c.queue)
		for _, ch := range c.unacked {
			if ch.path == p {
				ch.path = nil
				c.queue = append(c.queue, ch)
			}
		}
		if len(c.queue) > n {
			slices.SortFunc(c.queue, func(a, b *chunk) int { return cmpSeq(a.seq, b.seq) })
		}
		if c.ackSent > 0 && !c.closed {
			c.ackWanted = true // our last ACK may have been lost with p
		}
		if c.alive == 0 {
			c.outageSince = time.Now()
		}
		c.pathSig.fire()
	}
	c.workSig.fire() // wakes p's writer so it exits
	c.mu.Unlock()
	// Outside the lock: closing a TLS conn may try to send an alert.
	p.conn.Close()
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (c *Conn) writeLoop(p *path) {
	defer c.wg.Done()
	timer := time.NewTimer(c.opts.KeepAlive)
	defer timer.Stop()
	lastWrite := time.Now()
	var sent *chunk
	for {
		buf, closeWrite, ch := c.nextFrame(p, lastWrite, timer, sent)
		if buf == nil {
			if cw, ok := p.conn.(interface{ CloseWrite() error }); ok && closeWrite {
				cw.CloseWrite() // tells the peer's reader we are done, without an RST
			}
			return
		}
		if _, err := p.conn.Write(buf); err != nil {
			c.killPath(p, err)
			return // ch is not recycled: dropping it to the GC is fine
		}
		p.sent.Add(int64(len(buf)))
		lastWrite = time.Now()
		sent = ch
	}
}

// nextFrame waits for something to send on p: control frames first, then the
// lowest queued chunk, else a PING once p was idle for KeepAlive. It returns
// nil when the writer should stop, with closeWrite set after a clean end.
// sent is the chunk the writer just finished writing, if any.
func (c *Conn) nextFrame(p *path, lastWrite time.Time, timer *time.Timer, sent *chunk) (buf []byte, closeWrite bool, ch *chunk) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sent != nil {
		sent.sending--
		c.recycleLocked(sent)
	}
	for {
		if p.dead || c.hardEnd {
			return nil, false, nil
		}
		if c.closed && !p.finSent {
			p.finSent = true
			return c.control(p, frameClose, c.finSeq), false, nil
		}
		if c.ackWanted {
			c.ackWanted = false
			c.ackSent = c.ackValueLocked()
			c.unackedRead = 0
			return c.control(p, frameAck, c.ackSent), false, nil
		}
		if c.ended {
			return nil, true, nil
		}
		if ch := c.popLocked(p); ch != nil {
			ch.sending++
			return ch.buf, false, ch
		}
		idle := time.Since(lastWrite)
		if idle >= c.opts.KeepAlive {
			return c.control(p, framePing, c.ackValueLocked()), false, nil
		}
		timer.Reset(c.opts.KeepAlive - idle)
		ch := c.workSig.wait()
		c.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
		}
		c.mu.Lock()
	}
}

func (c *Conn) control(p *path, typ frameType, num uint64) []byte {
	putHeader(p.ctl[:], typ, num, nil)
	return p.ctl[:]
}

// popLocked hands the lowest queued chunk to p, sealing it on first send.
func (c *Conn) popLocked(p *path) *chunk {
	for len(c.queue) > 0 {
		ch := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		if ch.seq < c.acked {
			continue // acknowledged while waiting for a resend
		}
		if !ch.sealed {
			ch.sealed = true
			putHeader(ch.buf[:hdrLen], frameData, ch.seq, ch.buf[hdrLen:])
			if c.tail == ch {
				c.tail = nil
			}
		}
		ch.path = p
		return ch
	}
	return nil
}

// supervise declares silent paths dead and ends the Conn after an outage, or
// after Close once the peer failed to confirm in time.
func (c *Conn) supervise() {
	defer c.wg.Done()
	tick := time.NewTicker(c.opts.PathTimeout / 4)
	defer tick.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-tick.C:
		}
		now := time.Now()
		var silent []*path
		c.mu.Lock()
		for _, p := range c.paths {
			if !p.dead && now.Sub(time.Unix(0, p.lastRead.Load())) > c.opts.PathTimeout {
				silent = append(silent, p)
			}
		}
		switch {
		case c.alive == 0 && c.needPathsLocked() && now.Sub(c.outageSince) >= c.opts.OutageTimeout:
			c.endLocked(outageError(c.opts.OutageTimeout), true)
		case c.closed && now.After(c.lingerUntil):
			c.endLocked(errors.New("stripe: closed before the peer read all data"), true)
		}
		c.mu.Unlock()
		for _, p := range silent {
			c.killPath(p, errSilent)
		}
	}
}

// redialLoop restores the number of paths, one dial at a time, backing off
// between attempts (also after a success, so a peer that keeps refusing new
// paths does not cause a busy loop).
func (c *Conn) redialLoop() {
	defer c.wg.Done()
	backoff := minBackoff
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if !c.waitForDial() {
			return
		}
		timer.Reset(backoff)
		select {
		case <-c.quit:
			return
		case <-timer.C:
		}
		if !c.waitForDial() { // still needed after the backoff?
			return
		}
		ctx, cancel := context.WithTimeout(c.ctx, 5*c.opts.PathTimeout)
		sub, err := c.opts.Redial(ctx)
		cancel()
		if err != nil {
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		if c.Add(sub) != nil {
			return
		}
		backoff = minBackoff
	}
}

// waitForDial blocks until a path is missing; false once the Conn has ended.
func (c *Conn) waitForDial() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.ended && !(c.needPathsLocked() && c.alive < c.target) {
		ch := c.pathSig.wait()
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
	return !c.ended
}

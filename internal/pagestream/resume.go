package pagestream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
)

// A post-copy pull that outlives the destination's agent. CRIU's
// lazy-pages daemon asks for pages over one connection and reads the
// replies in the order it asked; a destination agent that dies mid-pull
// takes with it the requests it had read and the part of a reply it had
// written, and a new agent could not tell where the daemon's stream
// stands. So the daemon's connection is held by a Relay, in a process of
// its own: it keeps every request until its whole reply has come, passes
// the daemon only whole replies, and hands the requests still unanswered
// to the next agent that connects. At the source, a LazyProxy holds the
// connection to CRIU's page server the same way: whole requests in, whole
// replies out, the last reply kept for a destination that asks again.

// Relay serves a lazy-pages daemon through one agent connection after
// another (Serve).
type Relay struct {
	daemon io.ReadWriter

	mu      sync.Mutex
	pending []header // asked, not yet answered; oldest first
	err     error    // why the daemon's stream ended (io.EOF: it closed)
	closed  bool     // its closing command was answered
	asked   chan struct{}
	ended   chan struct{} // closed once the daemon's stream ended

	// wmu orders writes to the agent: a request read from the daemon and
	// a new agent's resend of those pending.
	wmu   sync.Mutex
	agent io.Writer
}

// NewRelay starts reading the daemon's requests.
func NewRelay(daemon io.ReadWriter) *Relay {
	r := &Relay{daemon: daemon, asked: make(chan struct{}, 1), ended: make(chan struct{})}
	go r.readRequests()
	return r
}

func (r *Relay) readRequests() {
	in := bufio.NewReaderSize(r.daemon, 64<<10)
	b := make([]byte, headerSize)
	for {
		var err error
		if _, err = io.ReadFull(in, b); err == nil {
			h := parseHeader(b)
			if !h.lazyRequest() {
				err = fmt.Errorf("%w: lazy-pages daemon sent command %#x", ErrMalformed, h.cmd)
			}
			if err == nil {
				r.wmu.Lock()
				r.mu.Lock()
				r.pending = append(r.pending, h)
				r.mu.Unlock()
				if r.agent != nil {
					// A failed write is the agent gone: Serve hears it
					// reading the reply, and the next agent gets this
					// request again.
					_, _ = r.agent.Write(b)
				}
				r.wmu.Unlock()
				select {
				case r.asked <- struct{}{}:
				default:
				}
				continue
			}
		}
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
		close(r.ended)
		return
	}
}

// Ended is closed once the daemon's stream has ended.
func (r *Relay) Ended() <-chan struct{} { return r.ended }

// Err says how the daemon's stream ended: nil when it closed after its
// last request was answered (the pull is complete).
func (r *Relay) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if errors.Is(r.err, io.EOF) && len(r.pending) == 0 {
		return nil
	}
	if r.err == nil || errors.Is(r.err, io.EOF) {
		return fmt.Errorf("%w with %d requests unanswered", ErrDaemonGone, len(r.pending))
	}
	return r.err
}

// ErrDaemonGone is Serve's answer once the daemon's stream has ended.
var ErrDaemonGone = errors.New("pagestream: the lazy-pages daemon's connection ended")

// Serve sends agent every request not yet answered, then each new one,
// and passes each whole reply to the daemon, until agent fails (its
// error) or the daemon's stream ends (ErrDaemonGone). A reply cut short
// is dropped whole: its request goes to the next agent. A daemon that
// ends while agent owes a reply closes agent: no reply could reach the
// daemon any more, and the agent may be waiting for that page itself.
func (r *Relay) Serve(agent io.ReadWriteCloser) error {
	served := make(chan struct{})
	defer close(served)
	go func() {
		select {
		case <-r.ended:
			agent.Close()
		case <-served:
		}
	}()
	r.wmu.Lock()
	r.mu.Lock()
	resend := append([]header{}, r.pending...)
	r.mu.Unlock()
	for _, h := range resend {
		b := h.encode()
		if _, err := agent.Write(b[:]); err != nil {
			r.wmu.Unlock()
			return err
		}
	}
	r.agent = agent
	r.wmu.Unlock()
	defer func() {
		r.wmu.Lock()
		if r.agent == agent {
			r.agent = nil
		}
		r.wmu.Unlock()
	}()
	in := bufio.NewReaderSize(agent, 256<<10)
	var reply []byte
	for {
		r.mu.Lock()
		n := len(r.pending)
		// A close is asked once every page came: while a GET is pending,
		// the next reply is a GET's, whichever (getAnyOrder).
		next := header{cmd: psIOVClose}
		for _, h := range r.pending {
			if h.isGet() {
				next = h
				break
			}
		}
		r.mu.Unlock()
		if n == 0 {
			select {
			case <-r.asked:
				continue
			case <-r.ended:
				return ErrDaemonGone
			}
		}
		var err error
		if reply, err = readReply(in, next, reply[:0]); err != nil {
			select {
			case <-r.ended:
				return ErrDaemonGone
			default:
				return err
			}
		}
		if _, err := r.daemon.Write(reply); err != nil {
			return fmt.Errorf("%w: %v", ErrDaemonGone, err)
		}
		r.mu.Lock()
		i := r.answered(next, reply)
		r.pending = append(r.pending[:i], r.pending[i+1:]...)
		r.closed = r.closed || !next.isGet()
		r.mu.Unlock()
	}
}

// answered finds the pending request reply answers: the close, or the GET
// of the same task and first page, else the first GET (a reply in order
// that names no page, as CRIU's daemon takes it). Called with r.mu held.
func (r *Relay) answered(kind header, reply []byte) int {
	get := kind.isGet()
	var rh header
	if get {
		rh = parseHeader(reply)
	}
	first := -1
	for i, h := range r.pending {
		if h.isGet() != get {
			continue
		}
		if !get || h.vaddr == rh.vaddr && h.dstID == rh.dstID {
			return i
		}
		if first < 0 {
			first = i
		}
	}
	return first
}

// readReply reads, into buf, the whole reply to request req: a header and
// the pages it announces for a GET, a 4-byte status for a close.
func readReply(in io.Reader, req header, buf []byte) ([]byte, error) {
	switch req.cmd & (1<<psCmdBits - 1) {
	case psIOVClose, psIOVForceClose:
		buf = append(buf, make([]byte, 4)...)
		_, err := io.ReadFull(in, buf)
		return buf, err
	}
	buf = append(buf, make([]byte, headerSize)...)
	if _, err := io.ReadFull(in, buf); err != nil {
		return buf, err
	}
	n := parseHeader(buf).payloadPages()
	if n > maxLazyPages {
		return buf, fmt.Errorf("%w: a reply of %d pages", ErrMalformed, n)
	}
	buf = append(buf, make([]byte, n*PageSize)...)
	_, err := io.ReadFull(in, buf[headerSize:])
	return buf, err
}

// ServeRelay runs a Relay for daemon, serving each agent that connects to
// l in turn, until the daemon's stream ends. It returns nil once the
// daemon closed after its last answer; closed says whether its closing
// command was among those answered: CRIU's daemon sends it once every page
// it asked for is in place, so the copy's memory is whole.
func ServeRelay(daemon io.ReadWriter, l net.Listener) (closed bool, err error) {
	r := NewRelay(daemon)
	// Accept waits for an agent that may never come: the daemon's end
	// stops it.
	go func() { <-r.ended; l.Close() }()
	for {
		conn, err := l.Accept()
		if err != nil {
			select {
			case <-r.ended:
				return r.Closed(), r.Err()
			default:
				return r.Closed(), err
			}
		}
		err = r.Serve(conn)
		conn.Close()
		if errors.Is(err, ErrDaemonGone) {
			<-r.ended
			return r.Closed(), r.Err()
		}
	}
}

// Closed says whether the daemon's closing command was answered.
func (r *Relay) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// LazyProxy holds the source's connection to CRIU's lazy page server for
// a destination that may ask over more than one connection: a request
// reaches CRIU only whole, a reply is read from CRIU whole before it is
// passed on, and the last one is kept. The destination's relay asks again
// for what it did not receive whole, at most the last request (the
// destination asks one at a time): that is answered from the reply kept,
// and CRIU's connection always stands between two requests.
type LazyProxy struct {
	criu io.ReadWriter
	in   *bufio.Reader

	mu        sync.Mutex
	last      [headerSize]byte
	lastReply []byte
	closed    bool
	fault     func(pid uint32, addr, pages uint64)
}

// OnFault has f told of every page request CRIU answered (a process's
// pid, the first page's address, the pages sent), before the answer is
// passed on; f must not block.
func (p *LazyProxy) OnFault(f func(pid uint32, addr, pages uint64)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

// NewLazyProxy serves through the page server connection criu.
func NewLazyProxy(criu io.ReadWriter) *LazyProxy {
	return &LazyProxy{criu: criu, in: bufio.NewReaderSize(criu, 256<<10)}
}

// Quiet returns once no request is being answered: a reply being made is
// written by then. A sender sharing the destination's connection (the
// push) waits here, so a fault's page does not queue behind its data.
func (p *LazyProxy) Quiet() {
	p.mu.Lock()
	defer p.mu.Unlock()
}

// ErrPageServer wraps a failure of CRIU's side of a LazyProxy: the page
// server is gone, and no destination can be served again.
var ErrPageServer = errors.New("source page server")

// Serve answers peer's requests until peer ends or fails (its error), or
// the page server's close was passed on (closed true: CRIU's dump ends).
func (p *LazyProxy) Serve(peer io.ReadWriter) (closed bool, err error) {
	in := bufio.NewReaderSize(peer, 64<<10)
	b := make([]byte, headerSize)
	for {
		if _, err := io.ReadFull(in, b); err != nil {
			return false, err
		}
		done, err := p.answer(peer, b)
		if err != nil || done {
			return done, err
		}
	}
}

// answer passes one whole request to CRIU, or answers it from the last
// reply when it asks the same again.
func (p *LazyProxy) answer(peer io.Writer, req []byte) (closed bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return true, fmt.Errorf("%w: asked after its close", ErrPageServer)
	}
	h := parseHeader(req)
	if !h.lazyRequest() {
		return false, fmt.Errorf("%w: the destination sent command %#x", ErrMalformed, h.cmd)
	}
	if p.lastReply == nil || string(req) != string(p.last[:]) {
		if _, err := p.criu.Write(req); err != nil {
			return false, fmt.Errorf("%w: %v", ErrPageServer, err)
		}
		reply, err := readReply(p.in, h, p.lastReply[:0])
		if err != nil {
			p.lastReply = nil
			return false, fmt.Errorf("%w: %v", ErrPageServer, err)
		}
		copy(p.last[:], req)
		p.lastReply = reply
		// A lazy request names the process by its bare pid (lazy.go).
		if p.fault != nil && h.isGet() && h.dstID <= math.MaxUint32 {
			p.fault(uint32(h.dstID), h.vaddr, parseHeader(reply).payloadPages())
		}
	}
	p.closed = !h.isGet()
	_, err = peer.Write(p.lastReply)
	return p.closed, err
}

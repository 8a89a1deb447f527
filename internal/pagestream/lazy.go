package pagestream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// LazyStats counts what ServeLazy answered.
type LazyStats struct {
	Requests  uint64 // GET requests from the daemon
	Local     uint64 // answered from the destination's copy
	Forwarded uint64 // passed on to the source
	Pages     uint64 // pages sent to the daemon
	// LocalPages were sent from the destination's copy.
	LocalPages uint64
	// Closed: the daemon's close was answered (it has every page).
	Closed bool
}

// ServeLazy plays CRIU's page server for a destination's lazy-pages daemon
// (hybrid migration): a GET is answered from have when the destination
// holds its first page, with the pages held from there on (a page server
// may answer fewer pages than asked: the daemon asks again for the rest);
// any other request goes to upstream, the source's CRIU page server, and
// its reply is relayed (for a background request, only the pages missing
// from its first on). The daemon's closing command goes upstream too, so
// the source's page server ends cleanly.
//
// Stock CRIU reads the replies in the order it asked (criu/page-xfer.c
// keeps its pending reads in a FIFO), so its requests are served one after
// another. ferry's CRIU marks its GETs getAnyOrder: it matches each reply
// to its request by address, so each is answered as soon as it can be, a
// fault before a background request still waiting for its pages.
//
// In a GET, dst_id is the task's pid itself, not an encoded pagemap id.
func ServeLazy(daemon io.ReadWriter, upstream io.ReadWriter, have Source) (LazyStats, error) {
	return ServeLazyAwaiting(daemon, upstream, have, nil, nil)
}

// getAnyOrder is the flag of a GET from ferry's CRIU
// (scripts/criu-patches/0004): its replies may come in any order. It is
// the daemon's word to this server; the source's page server never sees it.
const getAnyOrder = 1 << 15

// Await waits until the page k is in the destination's copy, and says
// whether it is (false: not soon, ask the source). hint is how many pages
// from k on a request of ferry's CRIU waits for, which the copy's filler
// may fetch next; 0 for stock CRIU's, whose requests follow the filling
// anyway and hold up the daemon's other replies.
type Await func(k PageKey, hint uint64) bool

// ServeLazyAwaiting is ServeLazy for a copy still filling (post-copy's
// push): a background request (more than one page) waits through await
// for pages not there yet instead of asking the source for what is on its
// way (its first page, then the pages held from there on; stock CRIU's,
// all of its pages). A request for one page is a fault: the source is
// asked at once. served, if not nil, is told of each page sent from have
// once its reply is out: the daemon asks for no page twice, so the copy
// need not keep it (one asked again would be the source's to answer).
func ServeLazyAwaiting(daemon io.ReadWriter, upstream io.ReadWriter, have Source, await Await, served func(PageKey)) (LazyStats, error) {
	s := &lazyServer{
		out:    bufio.NewWriterSize(daemon, 256<<10),
		upW:    upstream,
		up:     bufio.NewReaderSize(upstream, 256<<10),
		have:   have,
		await:  await,
		served: served,
		bad:    make(chan struct{}),
		now:    time.Now,
	}
	reqs := make(chan header)
	readErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		in := bufio.NewReaderSize(daemon, 64<<10)
		hdr := make([]byte, headerSize)
		for {
			if _, err := io.ReadFull(in, hdr); err != nil {
				readErr <- err
				return
			}
			select {
			case reqs <- parseHeader(hdr):
			case <-stop:
				return
			}
		}
	}()
	var inFlight sync.WaitGroup
	ended := func(err error) (LazyStats, error) {
		inFlight.Wait()
		st, ferr := s.result()
		return st, errors.Join(err, ferr)
	}
	for {
		var h header
		select {
		case h = <-reqs:
		case err := <-readErr:
			if errors.Is(err, io.EOF) {
				return ended(nil)
			}
			return ended(fmt.Errorf("lazy-pages daemon: %w", err))
		case <-s.bad:
			return ended(nil)
		}
		switch h.cmd & (1<<psCmdBits - 1) {
		case psIOVGet:
			if h.cmd>>psCmdBits&getAnyOrder != 0 {
				h.cmd = psIOVGet
				inFlight.Add(1)
				go func() {
					defer inFlight.Done()
					s.get(h, false)
				}()
				continue
			}
			s.get(h, true)
		case psIOVClose, psIOVForceClose:
			// The daemon closes once every request was answered.
			inFlight.Wait()
			err := s.forward(h)
			s.mu.Lock()
			s.st.Closed = err == nil
			s.mu.Unlock()
			return ended(err)
		default:
			return ended(fmt.Errorf("%w: lazy-pages daemon sent command %#x", ErrMalformed, h.cmd))
		}
	}
}

// lazyServer answers one daemon's requests, some at once (getAnyOrder).
type lazyServer struct {
	have   Source
	await  Await
	served func(PageKey)

	// mu: the daemon's side (whole replies) and the stats.
	mu  sync.Mutex
	out *bufio.Writer
	st  LazyStats
	err error
	bad chan struct{} // closed at the first error

	// upMu: one request at a time to the source, its reply read whole
	// before it is passed on, so the source's round trip holds up no
	// answer from here.
	upMu sync.Mutex
	upW  io.Writer
	up   *bufio.Reader

	firstFault atomic.Int64 // unix nanoseconds of the first fault asked about
	now        func() time.Time
}

// For startWindow after the copy's first fault, when it touches again
// what it was working on and its clients wait for it, a background request
// is answered with at most startPages (the daemon asks again for the
// rest): its reply travels ahead of the faults' through the same
// connections, and the relay reads each reply whole before it passes it
// on. A hybrid copy's first faults waited up to 16 ms behind three replies
// of 2.4 MiB each. Later faults (memhog's, at random, one a millisecond)
// do not shrink them: the pull's pace is what ends the source's part.
const (
	startPages  = 32
	startWindow = 100 * time.Millisecond
)

// shrink is how many of n pages a request may be answered with: a request
// for one page is a fault, and for startWindow after the first a
// background request gets at most startPages.
func (s *lazyServer) shrink(n uint64) uint64 {
	now := s.now().UnixNano()
	if n == 1 {
		s.firstFault.CompareAndSwap(0, now)
		return n
	}
	if first := s.firstFault.Load(); first != 0 && time.Duration(now-first) < startWindow {
		return min(n, startPages)
	}
	return n
}

// forward passes a request to the source's page server and its whole
// reply to the daemon.
func (s *lazyServer) forward(h header) error {
	s.upMu.Lock()
	_, err := s.upW.Write(h.encodeBytes())
	var reply []byte
	if err == nil {
		reply, err = readReply(s.up, h, nil)
	}
	s.upMu.Unlock()
	if err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.out.Write(reply); err != nil {
		return err
	}
	return s.out.Flush()
}

// get answers a GET from the pages held here, or from the source.
//
// inOrder: the daemon is stock CRIU's, which reads replies in order and,
// after a partial one, goes back to its lowest missing page with a small
// request: a request is answered from here only whole (waiting for the
// pages on their way), else the source answers all of it.
func (s *lazyServer) get(h header, inOrder bool) {
	s.mu.Lock()
	s.st.Requests++
	s.mu.Unlock()
	if inOrder && !s.holdsAll(h) {
		s.fail(s.forwardCounted(h))
		return
	}
	if !inOrder {
		h.nrPages = s.shrink(h.nrPages)
	}
	if _, ok := h.storeGet(); ok && s.await != nil && h.nrPages > 1 {
		if _, _, held := s.have(h.page(0)); !held {
			s.await(h.page(0), h.nrPages)
		}
	}
	s.mu.Lock()
	n, err := serveLocal(s.out, h, s.have)
	if err == nil && s.served != nil {
		// Out: the store's data aliased in the reply is not needed again.
		for i := range n {
			s.served(h.page(i))
		}
	}
	if n > 0 {
		s.st.Local++
		s.st.Pages += n
		s.st.LocalPages += n
	}
	s.mu.Unlock()
	if err != nil || n > 0 {
		s.fail(err)
		return
	}
	if h.nrPages > 1 {
		h.nrPages = missingRun(h, s.have, s.await != nil)
	}
	s.fail(s.forwardCounted(h))
}

// holdsAll says whether every page of a GET is here, waiting (through
// await, for a background request) for those on their way.
func (s *lazyServer) holdsAll(h header) bool {
	if _, ok := h.storeGet(); !ok {
		return false
	}
	for i := range h.nrPages {
		k := h.page(i)
		if _, _, ok := s.have(k); !ok && (s.await == nil || h.nrPages == 1 || !s.await(k, 0)) {
			return false
		}
	}
	return true
}

// forwardCounted is forward, counted in the stats.
func (s *lazyServer) forwardCounted(h header) error {
	err := s.forward(h)
	s.mu.Lock()
	s.st.Forwarded++
	s.st.Pages += h.nrPages
	s.mu.Unlock()
	return err
}

// fail records the first error; nil is no error.
func (s *lazyServer) fail(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
		close(s.bad)
	}
}

func (s *lazyServer) result() (LazyStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st, s.err
}

// maxLazyPages bounds one GET: the daemon asks for at most its transfer
// chunk, far below this.
const maxLazyPages = 1 << 16

// storeGet says whether the destination's copy may answer GET h, and the
// task it names (dst_id is the bare pid): a pid, and a length within
// maxLazyPages. Any other request goes to the source as it is.
func (h header) storeGet() (uint32, bool) {
	if h.nrPages == 0 || h.nrPages > maxLazyPages || h.dstID > 1<<32-1 {
		return 0, false
	}
	return uint32(h.dstID), true
}

// page is the key of the i-th page GET h asks for.
func (h header) page(i uint64) PageKey {
	return PageKey{PID: uint32(h.dstID), Addr: h.vaddr + i*PageSize}
}

// serveLocal answers a GET from have with the pages held from its first
// on, and says how many it sent (0: none held, the caller forwards it).
func serveLocal(out *bufio.Writer, h header, have Source) (uint64, error) {
	pid, ok := h.storeGet()
	if !ok {
		return 0, nil
	}
	var held [][]byte
	for i := range h.nrPages {
		data, _, ok := have(h.page(i))
		if !ok {
			break
		}
		if len(data) != PageSize {
			return 0, fmt.Errorf("page %#x of pid %d is %d bytes in the store", h.vaddr+i*PageSize, pid, len(data))
		}
		held = append(held, data)
	}
	if len(held) == 0 {
		return 0, nil
	}
	n := uint64(len(held))
	rh := header{cmd: pePresent<<psCmdBits | psIOVAddF, nrPages: n, vaddr: h.vaddr, dstID: h.dstID}.encode()
	if _, err := out.Write(rh[:]); err != nil {
		return 0, err
	}
	for _, data := range held {
		if _, err := out.Write(data); err != nil {
			return 0, err
		}
	}
	return n, out.Flush()
}

// maxForwardPages bounds what a background request asks of the source
// while the push fills the destination's copy: the daemon's faults wait
// behind the reply, and the source pushes the pages after it next anyway.
const maxForwardPages = 16

// missingRun is how many pages of a background request, from its first
// on, to ask of the source: those the destination does not hold, and
// while the push runs at most maxForwardPages. The daemon asks again for
// the rest.
func missingRun(h header, have Source, pushing bool) uint64 {
	if _, ok := h.storeGet(); !ok {
		return h.nrPages // not ours to shorten: the source refuses it
	}
	limit := h.nrPages
	if pushing {
		limit = min(limit, maxForwardPages)
	}
	n := uint64(1)
	for n < limit {
		if _, _, ok := have(h.page(n)); ok {
			break
		}
		n++
	}
	return n
}

// LazyClient asks a lazy dump's page server for pages the way CRIU's
// lazy-pages daemon does: GET requests answered in order, then a close.
// Pre-copy's switchover uses it for the few pages its rounds never saw.
type LazyClient struct {
	conn io.ReadWriter
	in   *bufio.Reader
}

// NewLazyClient speaks to the page server on conn.
func NewLazyClient(conn io.ReadWriter) *LazyClient {
	return &LazyClient{conn: conn, in: bufio.NewReaderSize(conn, 256<<10)}
}

// Get fills dst (whole pages, at most maxLazyPages) with the pages of task
// pid from vaddr on.
func (c *LazyClient) Get(pid uint32, vaddr uint64, dst []byte) error {
	n := uint64(len(dst) / PageSize)
	if n == 0 || len(dst)%PageSize != 0 || n > maxLazyPages {
		return fmt.Errorf("pagestream: GET of %d bytes", len(dst))
	}
	req := header{cmd: psIOVGet, nrPages: n, vaddr: vaddr, dstID: uint64(pid)}.encode()
	if _, err := c.conn.Write(req[:]); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	reply := make([]byte, headerSize)
	if _, err := io.ReadFull(c.in, reply); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	rh := parseHeader(reply)
	if got := rh.payloadPages(); got != n || rh.vaddr != vaddr {
		return fmt.Errorf("%w: asked for %d pages at %#x, the page server answered %d at %#x", ErrMalformed, n, vaddr, got, rh.vaddr)
	}
	if _, err := io.ReadFull(c.in, dst); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	return nil
}

// Close ends the page server's session: the dump on the source then
// finishes.
func (c *LazyClient) Close() error {
	req := header{cmd: psIOVClose}.encode()
	if _, err := c.conn.Write(req[:]); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	var status [4]byte
	if _, err := io.ReadFull(c.in, status[:]); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	return nil
}

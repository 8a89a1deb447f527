package pagestream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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
// from its first on: the daemon asks again for the rest). The daemon reads
// replies in the order it asked
// (criu/page-xfer.c keeps its pending reads in a FIFO), so requests are
// served strictly one after another. The daemon's closing command goes
// upstream too, so the source's page server ends cleanly.
//
// In a GET, dst_id is the task's pid itself, not an encoded pagemap id.
func ServeLazy(daemon io.ReadWriter, upstream io.ReadWriter, have Source) (LazyStats, error) {
	return ServeLazyAwaiting(daemon, upstream, have, nil)
}

// Await waits until the page k is in the destination's copy, and says
// whether it is (false: not soon, ask the source).
type Await func(k PageKey) bool

// ServeLazyAwaiting is ServeLazy for a copy still filling (post-copy's
// push): a background request (more than one page) whose first page is
// not there yet waits for it through await (briefly: faults queue behind
// it) instead of asking the source for what is on its way, then takes the
// pages held from there on. A request for one page is a fault: the source
// is asked at once.
func ServeLazyAwaiting(daemon io.ReadWriter, upstream io.ReadWriter, have Source, await Await) (LazyStats, error) {
	var st LazyStats
	in := bufio.NewReaderSize(daemon, 64<<10)
	out := bufio.NewWriterSize(daemon, 256<<10)
	up := bufio.NewReaderSize(upstream, 256<<10)
	hdr := make([]byte, headerSize)
	for {
		if _, err := io.ReadFull(in, hdr); err != nil {
			if errors.Is(err, io.EOF) {
				return st, nil
			}
			return st, fmt.Errorf("lazy-pages daemon: %w", err)
		}
		h := parseHeader(hdr)
		switch h.cmd & (1<<psCmdBits - 1) {
		case psIOVGet:
			st.Requests++
			if n, err := serveLocal(out, h, have, await); err != nil {
				return st, err
			} else if n > 0 {
				st.Local++
				st.Pages += n
				st.LocalPages += n
				continue
			}
			st.Forwarded++
			if h.nrPages > 1 {
				h.nrPages = missingRun(h, have, await != nil)
				b := h.encode()
				copy(hdr, b[:])
			}
			if err := forward(upstream, up, out, hdr); err != nil {
				return st, err
			}
			st.Pages += h.nrPages
		case psIOVClose, psIOVForceClose:
			// The reply is a 4-byte status.
			if err := forwardReply(upstream, up, out, hdr, 4); err != nil {
				return st, err
			}
			st.Closed = true
			return st, nil
		default:
			return st, fmt.Errorf("%w: lazy-pages daemon sent command %#x", ErrMalformed, h.cmd)
		}
	}
}

// maxLazyPages bounds one GET: the daemon asks for at most its transfer
// chunk, far below this.
const maxLazyPages = 1 << 16

// serveLocal answers a GET from have with the pages held from its first
// on, and says how many it sent (0: none held, the caller forwards it).
func serveLocal(out *bufio.Writer, h header, have Source, await Await) (uint64, error) {
	if h.nrPages == 0 || h.nrPages > maxLazyPages || h.dstID > 1<<32-1 {
		return 0, nil
	}
	pid := uint32(h.dstID)
	key := func(i uint64) PageKey { return PageKey{PID: pid, Addr: h.vaddr + i*PageSize} }
	if _, _, ok := have(key(0)); !ok && (await == nil || h.nrPages == 1 || !await(key(0))) {
		return 0, nil
	}
	n := uint64(1)
	for n < h.nrPages {
		if _, _, ok := have(key(n)); !ok {
			break
		}
		n++
	}
	rh := header{cmd: pePresent<<psCmdBits | psIOVAddF, nrPages: n, vaddr: h.vaddr, dstID: h.dstID}.encode()
	if _, err := out.Write(rh[:]); err != nil {
		return 0, err
	}
	for i := range n {
		data, _, ok := have(key(i))
		if !ok || len(data) != PageSize {
			return 0, fmt.Errorf("page %#x of pid %d vanished from the store", h.vaddr+i*PageSize, pid)
		}
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
	if h.nrPages > maxLazyPages || h.dstID > 1<<32-1 {
		return h.nrPages // not ours to shorten: the source refuses it
	}
	limit := h.nrPages
	if pushing {
		limit = min(limit, maxForwardPages)
	}
	n := uint64(1)
	for n < limit {
		if _, _, ok := have(PageKey{PID: uint32(h.dstID), Addr: h.vaddr + n*PageSize}); ok {
			break
		}
		n++
	}
	return n
}

// forward sends a GET upstream and relays the reply: a header, then the
// pages it announces.
func forward(upstream io.Writer, up *bufio.Reader, out *bufio.Writer, hdr []byte) error {
	if _, err := upstream.Write(hdr); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	reply := make([]byte, headerSize)
	if _, err := io.ReadFull(up, reply); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	rh := parseHeader(reply)
	n := rh.payloadPages()
	if n > maxLazyPages {
		return fmt.Errorf("%w: source page server announced %d pages", ErrMalformed, n)
	}
	if _, err := out.Write(reply); err != nil {
		return err
	}
	if _, err := io.CopyN(out, up, int64(n)*PageSize); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	return out.Flush()
}

// forwardReply sends a header upstream and relays a fixed-size reply.
func forwardReply(upstream io.Writer, up *bufio.Reader, out *bufio.Writer, hdr []byte, n int64) error {
	if _, err := upstream.Write(hdr); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	if _, err := io.CopyN(out, up, n); err != nil {
		return fmt.Errorf("source page server: %w", err)
	}
	return out.Flush()
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

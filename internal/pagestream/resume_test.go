package pagestream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// getReq is a lazy-pages daemon's GET of n pages of pid at vaddr.
func getReq(pid uint32, vaddr, n uint64) []byte {
	b := header{cmd: psIOVGet, nrPages: n, vaddr: vaddr, dstID: uint64(pid)}.encode()
	return b[:]
}

// pageReply is a page server's whole reply to getReq: every byte of the
// pages says which page it is, so a reply from elsewhere shows.
func pageReply(pid uint32, vaddr, n uint64) []byte {
	h := header{cmd: pePresent<<psCmdBits | psIOVAddF, nrPages: n, vaddr: vaddr, dstID: uint64(pid)}.encode()
	b := append([]byte{}, h[:]...)
	for i := uint64(0); i < n; i++ {
		b = append(b, bytes.Repeat([]byte{byte(vaddr/PageSize + i + uint64(pid))}, PageSize)...)
	}
	return b
}

var closeReq = func() []byte { b := header{cmd: psIOVClose}.encode(); return b[:] }()

// relayUnder starts ServeRelay for a daemon on a socketpair, listening in
// a test directory; it returns the daemon's end, the socket and the
// relay's outcome.
func relayUnder(t *testing.T) (net.Conn, string, <-chan relayEnd) {
	t.Helper()
	daemon, ours := socketpair(t)
	sock := filepath.Join(t.TempDir(), "relay.socket")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan relayEnd, 1)
	go func() {
		closed, err := ServeRelay(ours, l)
		out <- relayEnd{closed, err}
		ours.Close()
	}()
	return daemon, sock, out
}

// relayEnd is what ServeRelay returned.
type relayEnd struct {
	closed bool
	err    error
}

func socketpair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "pair"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func readN(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return b
}

// closeThrough has the daemon close through the relay: agent receives
// the close and answers its status, which reaches the daemon.
func closeThrough(t *testing.T, daemon, agent net.Conn) {
	t.Helper()
	if _, err := daemon.Write(closeReq); err != nil {
		t.Fatal(err)
	}
	readN(t, agent, headerSize)
	if _, err := agent.Write([]byte{0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	readN(t, daemon, 4)
}

func dialRelay(t *testing.T, sock string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The agent dies with a request read and its reply half written: the
// daemon sees none of that reply, and the next agent is asked again for
// everything unanswered, in order, then for what the daemon asks next.
func TestRelayHandsUnansweredRequestsToTheNextAgent(t *testing.T) {
	daemon, sock, out := relayUnder(t)
	a, b, c := getReq(7, 0x1000, 1), getReq(7, 0x8000, 3), getReq(9, 0x4000, 2)
	for _, r := range [][]byte{a, b} {
		if _, err := daemon.Write(r); err != nil {
			t.Fatal(err)
		}
	}

	first := dialRelay(t, sock)
	if got := readN(t, first, 2*headerSize); !bytes.Equal(got, append(append([]byte{}, a...), b...)) {
		t.Fatal("the first agent did not get the daemon's requests as sent")
	}
	if _, err := first.Write(pageReply(7, 0x1000, 1)); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, daemon, len(pageReply(7, 0x1000, 1))); !bytes.Equal(got, pageReply(7, 0x1000, 1)) {
		t.Fatal("the daemon did not get the first reply whole")
	}
	// Half of b's reply, then the agent is gone.
	if _, err := first.Write(pageReply(7, 0x8000, 3)[:headerSize+PageSize+100]); err != nil {
		t.Fatal(err)
	}
	first.Close()

	second := dialRelay(t, sock)
	if got := readN(t, second, headerSize); !bytes.Equal(got, b) {
		t.Fatalf("the next agent was not asked again for the unanswered request")
	}
	if _, err := daemon.Write(c); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, second, headerSize); !bytes.Equal(got, c) {
		t.Fatal("the next agent did not get the daemon's new request")
	}
	if _, err := second.Write(append(pageReply(7, 0x8000, 3), pageReply(9, 0x4000, 2)...)); err != nil {
		t.Fatal(err)
	}
	want := append(pageReply(7, 0x8000, 3), pageReply(9, 0x4000, 2)...)
	if got := readN(t, daemon, len(want)); !bytes.Equal(got, want) {
		t.Fatal("the daemon's stream holds more or other than the whole replies, in order")
	}

	// The daemon's close, answered, then its end: the relay is done, and
	// says the daemon closed.
	closeThrough(t, daemon, second)
	daemon.Close()
	select {
	case end := <-out:
		if end.err != nil || !end.closed {
			t.Fatalf("relay after a clean close: closed %v, %v", end.closed, end.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the relay did not end with the daemon")
	}
}

// A daemon that ends with requests unanswered (killed) ends the relay
// with an error, also while no agent is connected.
func TestRelayEndsWithTheDaemon(t *testing.T) {
	daemon, _, out := relayUnder(t)
	if _, err := daemon.Write(getReq(1, 0x1000, 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	daemon.Close()
	endsWithDaemonGone(t, out, "the relay waited on for an agent after its daemon ended")
}

// endsWithDaemonGone waits for the relay's outcome: ErrDaemonGone, within
// 5 s (stuck says what waited instead).
func endsWithDaemonGone(t *testing.T, out <-chan relayEnd, stuck string) {
	t.Helper()
	select {
	case end := <-out:
		if !errors.Is(end.err, ErrDaemonGone) || end.closed {
			t.Fatalf("relay ended with %v (closed %v), want ErrDaemonGone", end.err, end.closed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal(stuck)
	}
}

// A daemon killed while its agent still owes a reply ends the relay too:
// the agent may never answer (it may be waiting for that page itself),
// and nothing it could answer would reach anyone.
func TestRelayEndsWithTheDaemonWhileAnAgentOwesAReply(t *testing.T) {
	daemon, sock, out := relayUnder(t)
	agent, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	if _, err := daemon.Write(getReq(1, 0x1000, 1)); err != nil {
		t.Fatal(err)
	}
	readN(t, agent, headerSize) // the request reached the agent, which stays silent
	daemon.Close()
	endsWithDaemonGone(t, out, "the relay waited on its agent's reply after its daemon ended")
	// The agent hears the end: its connection closes.
	_ = agent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := agent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("agent's read after the daemon ended: %v, want EOF", err)
	}
}

// fakePageServer answers GETs with pageReply and a close with a status,
// and counts what it was asked.
type fakePageServer struct {
	mu    sync.Mutex
	asked [][]byte
}

func (f *fakePageServer) serve(conn io.ReadWriter) {
	b := make([]byte, headerSize)
	for {
		if _, err := io.ReadFull(conn, b); err != nil {
			return
		}
		f.mu.Lock()
		f.asked = append(f.asked, append([]byte{}, b...))
		f.mu.Unlock()
		h := parseHeader(b)
		if h.cmd == psIOVClose {
			_, _ = conn.Write([]byte{0, 0, 0, 0})
			return
		}
		_, _ = conn.Write(pageReply(uint32(h.dstID), h.vaddr, h.nrPages))
	}
}

func (f *fakePageServer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

// A destination that loses a reply asks again over a new connection: the
// proxy answers from the reply it kept, so CRIU is asked once; a request
// cut short never reaches CRIU; the close ends it.
func TestLazyProxyAsksThePageServerOnce(t *testing.T) {
	criuEnd, proxyEnd := net.Pipe()
	defer criuEnd.Close()
	defer proxyEnd.Close()
	ps := &fakePageServer{}
	go ps.serve(criuEnd)
	p := NewLazyProxy(proxyEnd)
	var (
		fmu    sync.Mutex
		faults []string
	)
	p.OnFault(func(pid uint32, addr, n uint64) {
		fmu.Lock()
		defer fmu.Unlock()
		faults = append(faults, fmt.Sprintf("%d:%#x:%d", pid, addr, n))
	})

	serve := func(peer net.Conn) <-chan error {
		out := make(chan error, 1)
		go func() { _, err := p.Serve(peer); out <- err }()
		return out
	}
	// First connection: the reply is read halfway, then the link is gone.
	dst, src := net.Pipe()
	ended := serve(src)
	req := getReq(5, 0x20000, 4)
	if _, err := dst.Write(req); err != nil {
		t.Fatal(err)
	}
	readN(t, dst, headerSize+PageSize)
	dst.Close()
	if err := <-ended; err == nil {
		t.Fatal("Serve returned nil for a connection that broke")
	}

	// Second: a request cut short, then gone.
	dst, src = net.Pipe()
	ended = serve(src)
	if _, err := dst.Write(req[:10]); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	<-ended

	// Third: the same request again, then another, then the close.
	dst, src = net.Pipe()
	out := make(chan struct {
		closed bool
		err    error
	}, 1)
	go func() {
		closed, err := p.Serve(src)
		out <- struct {
			closed bool
			err    error
		}{closed, err}
	}()
	for _, r := range []struct {
		req, want []byte
	}{{req, pageReply(5, 0x20000, 4)}, {getReq(5, 0x40000, 1), pageReply(5, 0x40000, 1)}, {closeReq, []byte{0, 0, 0, 0}}} {
		if _, err := dst.Write(r.req); err != nil {
			t.Fatal(err)
		}
		if got := readN(t, dst, len(r.want)); !bytes.Equal(got, r.want) {
			t.Fatalf("reply to %x is not the page server's", r.req[:8])
		}
	}
	if r := <-out; !r.closed || r.err != nil {
		t.Fatalf("after the close: closed %v, %v", r.closed, r.err)
	}
	if n := ps.count(); n != 3 {
		t.Errorf("the page server was asked %d times, want 3 (the lost reply's request once)", n)
	}
	// The push hears of each page request CRIU answers, once: not of the
	// one answered again from the kept reply, nor of the close.
	fmu.Lock()
	defer fmu.Unlock()
	if want := []string{"5:0x20000:4", "5:0x40000:1"}; !slices.Equal(faults, want) {
		t.Errorf("faults told %q, want %q", faults, want)
	}
	dst.Close()
}

// Quiet waits out a fault being answered: by the time it returns, the
// reply is written, so a sender on the same connection goes after it.
func TestLazyProxyQuietWaitsForTheReply(t *testing.T) {
	criuEnd, proxyEnd := net.Pipe()
	defer criuEnd.Close()
	defer proxyEnd.Close()
	p := NewLazyProxy(proxyEnd)
	p.Quiet() // nothing asked: at once
	dst, src := net.Pipe()
	defer dst.Close()
	go func() { _, _ = p.Serve(src) }()
	req := getReq(5, 0x20000, 1)
	if _, err := dst.Write(req); err != nil {
		t.Fatal(err)
	}
	// The page server has the request and has not answered yet.
	readN(t, criuEnd, headerSize)
	quiet := make(chan struct{})
	go func() { p.Quiet(); close(quiet) }()
	select {
	case <-quiet:
		t.Fatal("Quiet returned while a fault was being answered")
	case <-time.After(50 * time.Millisecond):
	}
	go func() { _, _ = criuEnd.Write(pageReply(5, 0x20000, 1)) }()
	readN(t, dst, headerSize+PageSize) // the reply reaches the destination first
	select {
	case <-quiet:
	case <-time.After(5 * time.Second):
		t.Fatal("Quiet did not return once the reply was written")
	}
}

// Replies that come in another order than their requests (getAnyOrder)
// reach the daemon whole, each settles its own request, and a new agent
// is asked again for the one left unanswered only.
func TestRelayMatchesRepliesInAnyOrder(t *testing.T) {
	daemon, sock, out := relayUnder(t)
	a, b, c := getReq(7, 0x1000, 4), getReq(7, 0x9000, 1), getReq(9, 0x2000, 1)
	for _, r := range [][]byte{a, b, c} {
		if _, err := daemon.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	first := dialRelay(t, sock)
	readN(t, first, 3*headerSize)
	// c, then a in part (fewer pages than asked), then the agent is gone.
	replies := append(pageReply(9, 0x2000, 1), pageReply(7, 0x1000, 2)...)
	if _, err := first.Write(replies); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, daemon, len(replies)); !bytes.Equal(got, replies) {
		t.Fatal("the daemon did not get the replies whole, as they came")
	}
	first.Close()

	second := dialRelay(t, sock)
	if got := readN(t, second, headerSize); !bytes.Equal(got, b) {
		t.Fatalf("the next agent was asked %x, want only the unanswered request at 0x9000", got)
	}
	if _, err := second.Write(pageReply(7, 0x9000, 1)); err != nil {
		t.Fatal(err)
	}
	readN(t, daemon, len(pageReply(7, 0x9000, 1)))
	closeThrough(t, daemon, second)
	daemon.Close()
	if end := <-out; end.err != nil || !end.closed {
		t.Fatalf("relay: closed %v, %v", end.closed, end.err)
	}
}

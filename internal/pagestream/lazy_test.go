package pagestream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

func getHeader(pid uint32, addr, n uint64) []byte {
	h := make([]byte, headerSize)
	binary.LittleEndian.PutUint32(h[0:], psIOVGet)
	binary.LittleEndian.PutUint64(h[8:], n)
	binary.LittleEndian.PutUint64(h[16:], addr)
	binary.LittleEndian.PutUint64(h[24:], uint64(pid))
	return h
}

func closeHeader() []byte {
	h := make([]byte, headerSize)
	binary.LittleEndian.PutUint32(h[0:], psIOVClose)
	return h
}

// fakeStore holds pages 0x1000 and 0x2000 of pid 7.
func fakeStore(k PageKey) ([]byte, Hash, bool) {
	if k.PID != 7 || (k.Addr != 0x1000 && k.Addr != 0x2000) {
		return nil, Hash{}, false
	}
	p := bytes.Repeat([]byte{byte(k.Addr >> 12)}, PageSize)
	return p, HashPage(p), true
}

// fakeUpstream answers one forwarded GET for pid 7 at 0x3000 with a page
// of 3s, then a CLOSE with status 0.
type fakeUpstream struct {
	in  bytes.Buffer
	out bytes.Buffer
}

func (u *fakeUpstream) Write(p []byte) (int, error) { return u.in.Write(p) }
func (u *fakeUpstream) Read(p []byte) (int, error)  { return u.out.Read(p) }

type duplex struct {
	io.Reader
	io.Writer
}

func TestServeLazyLocalAndForwarded(t *testing.T) {
	var req bytes.Buffer
	req.Write(getHeader(7, 0x1000, 2)) // both held
	req.Write(getHeader(7, 0x3000, 1)) // not held: forwarded
	req.Write(closeHeader())
	up := &fakeUpstream{}
	up.out.Write(replyHeader(7, 0x3000, 1))
	up.out.Write(bytes.Repeat([]byte{3}, PageSize))
	up.out.Write([]byte{0, 0, 0, 0})
	var out bytes.Buffer
	st, err := ServeLazy(duplex{&req, &out}, up, fakeStore)
	if err != nil {
		t.Fatal(err)
	}
	if st.Local != 1 || st.Forwarded != 1 || st.LocalPages != 2 || st.Pages != 3 {
		t.Fatalf("stats %+v", st)
	}
	b := out.Bytes()
	// local reply: header + 2 pages; forwarded: header + 1 page; status.
	if len(b) != 2*headerSize+3*PageSize+4 {
		t.Fatalf("daemon got %d bytes", len(b))
	}
	if b[headerSize] != 1 || b[headerSize+PageSize] != 2 || b[2*headerSize+2*PageSize] != 3 {
		t.Fatal("pages out of order")
	}
	if !bytes.Equal(up.in.Bytes()[:headerSize], getHeader(7, 0x3000, 1)) {
		t.Fatal("the forwarded request changed on its way")
	}
}

// FuzzServeLazy: whatever a daemon or an upstream sends, no panic.
func FuzzServeLazy(f *testing.F) {
	f.Add(append(getHeader(7, 0x1000, 1), closeHeader()...), []byte{0, 0, 0, 0})
	f.Add(getHeader(7, 0x9000, 1), []byte("short"))
	f.Fuzz(func(t *testing.T, daemon, upstream []byte) {
		var out bytes.Buffer
		up := &fakeUpstream{}
		up.out.Write(upstream)
		ServeLazy(duplex{bytes.NewReader(daemon), &out}, up, fakeStore)
	})
}

// TestLazyClient asks ServeLazy (standing in for a lazy dump's page server:
// it answers GETs the same way) for pages, then closes.
func TestLazyClient(t *testing.T) {
	cli, srv := net.Pipe()
	defer cli.Close()
	done := make(chan error, 1)
	up := &fakeUpstream{}
	up.out.Write(make([]byte, 4)) // the CLOSE's status, forwarded upstream
	go func() {
		_, err := ServeLazy(srv, up, fakeStore)
		srv.Close()
		done <- err
	}()
	c := NewLazyClient(cli)
	buf := make([]byte, 2*PageSize)
	if err := c.Get(7, 0x1000, buf); err != nil {
		t.Fatal(err)
	}
	if buf[0] != 1 || buf[PageSize] != 2 {
		t.Fatalf("pages hold %d and %d, want 1 and 2", buf[0], buf[PageSize])
	}
	if err := c.Get(7, 0x1000, make([]byte, 100)); err == nil {
		t.Error("a GET of a partial page went out")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestLazyClientRefusesAWrongReply: a reply for other pages is an error,
// not data.
func TestLazyClientRefusesAWrongReply(t *testing.T) {
	cli, srv := net.Pipe()
	defer cli.Close()
	go func() {
		defer srv.Close()
		req := make([]byte, headerSize)
		if _, err := io.ReadFull(srv, req); err != nil {
			return
		}
		reply := make([]byte, headerSize)
		binary.LittleEndian.PutUint32(reply[0:], pePresent<<psCmdBits|psIOVAddF)
		binary.LittleEndian.PutUint64(reply[8:], 1)
		binary.LittleEndian.PutUint64(reply[16:], 0x9000) // not what was asked
		_, _ = srv.Write(append(reply, make([]byte, PageSize)...))
	}()
	if err := NewLazyClient(cli).Get(7, 0x1000, make([]byte, PageSize)); err == nil || !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
}

// Stock CRIU's daemon (replies in order): a background request waits for
// its pages still on their way and is answered whole; a fault (one page)
// does not wait; a page that will not come sends the request upstream whole.
func TestServeLazyAwaiting(t *testing.T) {
	var req bytes.Buffer
	req.Write(getHeader(7, 0x3000, 2)) // background: both pages arrive while it waits
	req.Write(getHeader(7, 0x5000, 1)) // a fault on a page not there: upstream at once
	req.Write(getHeader(7, 0x6000, 2)) // background, 0x6000 never comes: upstream
	req.Write(closeHeader())
	arrived := map[PageKey]bool{}
	have := func(k PageKey) ([]byte, Hash, bool) {
		if arrived[k] {
			return bytes.Repeat([]byte{9}, PageSize), Hash{}, true
		}
		return fakeStore(k)
	}
	var awaited []uint64
	await := func(k PageKey, _ uint64) bool {
		awaited = append(awaited, k.Addr)
		if k.Addr == 0x3000 || k.Addr == 0x4000 {
			arrived[k] = true
			return true
		}
		return false
	}
	up := &fakeUpstream{}
	for _, r := range []struct{ addr, n uint64 }{{0x5000, 1}, {0x6000, 2}} {
		up.out.Write(replyHeader(7, r.addr, r.n))
		up.out.Write(bytes.Repeat([]byte{5}, int(r.n)*PageSize))
	}
	up.out.Write([]byte{0, 0, 0, 0})
	var out bytes.Buffer
	st, err := ServeLazyAwaiting(duplex{&req, &out}, up, have, await, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Local != 1 || st.Forwarded != 2 || st.LocalPages != 2 {
		t.Fatalf("stats %+v", st)
	}
	if len(awaited) != 3 || awaited[0] != 0x3000 || awaited[1] != 0x4000 || awaited[2] != 0x6000 {
		t.Fatalf("awaited %#x: want 0x3000 and 0x4000 (arrived) and 0x6000 (never), not the fault's 0x5000", awaited)
	}
	if !bytes.Equal(up.in.Bytes()[:headerSize], getHeader(7, 0x5000, 1)) || !bytes.Equal(up.in.Bytes()[headerSize:2*headerSize], getHeader(7, 0x6000, 2)) {
		t.Fatal("the forwarded requests changed on their way")
	}
}

// A request of ferry's CRIU whose first pages are held is answered with
// those alone, however far it reaches; the daemon asks again for the rest.
func TestServeLazyAnswersTheHeldPrefix(t *testing.T) {
	var req bytes.Buffer
	req.Write(anyOrderGet(7, 0x2000, 16)) // 0x2000 held, 0x3000 not
	req.Write(closeHeader())
	up := &fakeUpstream{}
	up.out.Write([]byte{0, 0, 0, 0})
	var out bytes.Buffer
	st, err := ServeLazy(duplex{&req, &out}, up, fakeStore)
	if err != nil {
		t.Fatal(err)
	}
	if st.Local != 1 || st.Forwarded != 0 || st.Pages != 1 {
		t.Fatalf("stats %+v", st)
	}
	b := out.Bytes()
	if len(b) != headerSize+PageSize+4 || !bytes.Equal(b[:headerSize], replyHeader(7, 0x2000, 1)) || b[headerSize] != 2 {
		t.Fatalf("daemon got %d bytes, header %x", len(b), b[:headerSize])
	}
	if !bytes.Equal(up.in.Bytes(), closeHeader()) {
		t.Fatal("only the close should have gone upstream")
	}
}

// What a background request the destination cannot answer asks of the
// source: the pages missing from its first on; while the push runs, at
// most maxForwardPages of them; a request not ours to read, unchanged.
func TestMissingRun(t *testing.T) {
	for _, c := range []struct {
		h       header
		pushing bool
		want    uint64
	}{
		{header{cmd: psIOVGet, nrPages: 8, vaddr: 0x0, dstID: 7}, false, 1},                            // 0x1000 held
		{header{cmd: psIOVGet, nrPages: 40, vaddr: 0x3000, dstID: 7}, false, 40},                       // nothing held
		{header{cmd: psIOVGet, nrPages: 40, vaddr: 0x3000, dstID: 7}, true, maxForwardPages},           // the push runs
		{header{cmd: psIOVGet, nrPages: 3, vaddr: 0x3000, dstID: 7}, true, 3},                          // fewer than the bound
		{header{cmd: psIOVGet, nrPages: 40, vaddr: 0x3000, dstID: 1 << 40}, true, 40},                  // no pid of ours
		{header{cmd: psIOVGet, nrPages: maxLazyPages + 1, vaddr: 0, dstID: 7}, true, maxLazyPages + 1}, // too long: the source refuses it
	} {
		if got := missingRun(c.h, fakeStore, c.pushing); got != c.want {
			t.Errorf("%d pages at %#x of %d, pushing %v: asked %d, want %d", c.h.nrPages, c.h.vaddr, c.h.dstID, c.pushing, got, c.want)
		}
	}
}

func replyHeader(pid uint32, addr, n uint64) []byte {
	h := make([]byte, headerSize)
	binary.LittleEndian.PutUint32(h[0:], pePresent<<psCmdBits|psIOVAddF)
	binary.LittleEndian.PutUint64(h[8:], n)
	binary.LittleEndian.PutUint64(h[16:], addr)
	binary.LittleEndian.PutUint64(h[24:], uint64(pid))
	return h
}

// anyOrderGet is ferry's CRIU's GET: replies may come in any order.
func anyOrderGet(pid uint32, addr, n uint64) []byte {
	b := header{cmd: getAnyOrder<<psCmdBits | psIOVGet, nrPages: n, vaddr: addr, dstID: uint64(pid)}.encode()
	return b[:]
}

// With a daemon that matches replies by address, a fault is answered
// while a background request before it still waits for its first page;
// the source is asked without the daemon's flag; the close waits for the
// background request's answer.
func TestServeLazyAnswersAFaultBeforeAWaitingRequest(t *testing.T) {
	daemon, ours := net.Pipe()
	defer daemon.Close()
	daemon.SetDeadline(time.Now().Add(10 * time.Second)) // served in order, the faults would wait for good
	release := make(chan struct{})
	var mu sync.Mutex
	arrived := false
	have := func(k PageKey) ([]byte, Hash, bool) {
		mu.Lock()
		defer mu.Unlock()
		if k.PID == 7 && k.Addr == 0x3000 && arrived {
			return bytes.Repeat([]byte{3}, PageSize), Hash{}, true
		}
		return fakeStore(k)
	}
	await := func(k PageKey, n uint64) bool {
		if n != 2 {
			t.Errorf("awaited %d pages, want the request's 2", n)
		}
		<-release
		mu.Lock()
		defer mu.Unlock()
		arrived = true
		return true
	}
	upDaemon, upOurs := net.Pipe() // the source's page server
	defer upDaemon.Close()
	done := make(chan error, 1)
	go func() {
		_, err := ServeLazyAwaiting(ours, upOurs, have, await, nil)
		ours.Close()
		done <- err
	}()
	go func() { // the source: one fault of pid 7 at 0x9000, then the close
		if got := readN(t, upDaemon, headerSize); !bytes.Equal(got, getReq(7, 0x9000, 1)) {
			t.Errorf("the source was asked %x, want a plain GET of 0x9000", got)
		}
		upDaemon.Write(pageReply(7, 0x9000, 1))
		if got := readN(t, upDaemon, headerSize); !bytes.Equal(got, closeReq) {
			t.Errorf("the source was asked %x, want the close", got)
		}
		upDaemon.Write([]byte{0, 0, 0, 0})
	}()
	for _, r := range [][]byte{anyOrderGet(7, 0x3000, 2), anyOrderGet(7, 0x1000, 1), anyOrderGet(7, 0x9000, 1)} {
		if _, err := daemon.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	// The held fault and the forwarded one come first, in either order.
	got := map[uint64]bool{}
	for range 2 {
		h := parseHeader(readN(t, daemon, headerSize))
		readN(t, daemon, int(h.nrPages)*PageSize)
		got[h.vaddr] = true
	}
	if !got[0x1000] || !got[0x9000] {
		t.Fatalf("first replies at %v, want the faults at 0x1000 and 0x9000", got)
	}
	close(release)
	if h := parseHeader(readN(t, daemon, headerSize)); h.vaddr != 0x3000 || h.nrPages != 1 {
		t.Fatalf("the background request's reply: %d pages at %#x, want the one page that came at 0x3000", h.nrPages, h.vaddr)
	}
	readN(t, daemon, PageSize)
	if _, err := daemon.Write(closeHeader()); err != nil {
		t.Fatal(err)
	}
	readN(t, daemon, 4)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Each page sent from the copy is reported served once its reply is out,
// and the copy may drop it: a request for it again goes to the source.
func TestServeLazyReportsServed(t *testing.T) {
	var req bytes.Buffer
	req.Write(getHeader(7, 0x1000, 2)) // both held: sent, then served
	req.Write(getHeader(7, 0x1000, 1)) // dropped since: the source answers
	req.Write(closeHeader())
	held := map[PageKey]bool{{PID: 7, Addr: 0x1000}: true, {PID: 7, Addr: 0x2000}: true}
	have := func(k PageKey) ([]byte, Hash, bool) {
		if !held[k] {
			return nil, Hash{}, false
		}
		return fakeStore(k)
	}
	var out bytes.Buffer
	var served []PageKey
	report := func(k PageKey) {
		if out.Len() < headerSize+2*PageSize {
			t.Errorf("page %#x reported served before its reply was out (%d bytes)", k.Addr, out.Len())
		}
		served = append(served, k)
		delete(held, k)
	}
	up := &fakeUpstream{}
	up.out.Write(replyHeader(7, 0x1000, 1))
	up.out.Write(bytes.Repeat([]byte{8}, PageSize))
	up.out.Write([]byte{0, 0, 0, 0})
	st, err := ServeLazyAwaiting(duplex{&req, &out}, up, have, nil, report)
	if err != nil {
		t.Fatal(err)
	}
	if len(served) != 2 || served[0].Addr != 0x1000 || served[1].Addr != 0x2000 {
		t.Fatalf("served %v, want 0x1000 and 0x2000", served)
	}
	if st.Local != 1 || st.LocalPages != 2 || st.Forwarded != 1 {
		t.Fatalf("stats %+v", st)
	}
	if !bytes.Equal(up.in.Bytes()[:headerSize], getHeader(7, 0x1000, 1)) {
		t.Fatal("the page asked again was not forwarded")
	}
	if b := out.Bytes(); b[2*headerSize+2*PageSize] != 8 {
		t.Fatal("the page asked again is not the source's")
	}
}

// TestServeLazyOverASocket: on a unix socket, as the daemon's and the
// relay's are, a reply from the copy larger than the server's buffer
// reaches the daemon whole and in order.
func TestServeLazyOverASocket(t *testing.T) {
	daemon, ours := socketPair(t)
	if _, ok := ours.(*net.UnixConn); !ok {
		t.Fatalf("socketpair end is %T, not a unix connection", ours)
	}
	const pages = 2500 // 10 MB: many times the reply buffer
	held := func(k PageKey) ([]byte, Hash, bool) {
		if k.PID != 7 || k.Addr < 0x10000 || k.Addr >= 0x10000+pages*PageSize {
			return nil, Hash{}, false
		}
		p := make([]byte, PageSize)
		binary.LittleEndian.PutUint64(p, k.Addr)
		return p, HashPage(p), true
	}
	done := make(chan error, 1)
	up := &fakeUpstream{}
	up.out.Write(make([]byte, 4)) // the CLOSE's status
	go func() {
		_, err := ServeLazy(ours, up, held)
		done <- err
	}()
	c := NewLazyClient(daemon)
	buf := make([]byte, pages*PageSize)
	if err := c.Get(7, 0x10000, buf); err != nil {
		t.Fatal(err)
	}
	for i := range pages {
		if got, want := binary.LittleEndian.Uint64(buf[i*PageSize:]), uint64(0x10000+i*PageSize); got != want {
			t.Fatalf("page %d holds the page of %#x, want %#x", i, got, want)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// For startWindow after the first fault, background requests are answered
// with at most startPages; before any fault, and after the window, whole.
func TestShrinkAtTheCopysStart(t *testing.T) {
	now := time.Unix(1000, 0)
	s := &lazyServer{now: func() time.Time { return now }}
	if n := s.shrink(256); n != 256 {
		t.Errorf("before any fault: %d pages, want 256", n)
	}
	if n := s.shrink(1); n != 1 {
		t.Errorf("a fault: %d pages", n)
	}
	now = now.Add(startWindow / 2)
	if n := s.shrink(256); n != startPages {
		t.Errorf("just after the first fault: %d pages, want %d", n, startPages)
	}
	if n := s.shrink(8); n != 8 {
		t.Errorf("a small request: %d pages, want 8", n)
	}
	s.shrink(1) // a later fault does not move the window
	now = now.Add(startWindow/2 + time.Millisecond)
	if n := s.shrink(256); n != 256 {
		t.Errorf("after the window: %d pages, want 256", n)
	}
}

package clientrtt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/privnet"
	"github.com/ferry-migrate/ferry/internal/testroot"
)

// The addresses of the test's two namespaces, a (the service's) and b
// (its clients'), on the veth between them: b has several, so that its
// connections come from several clients.
var (
	addrA   = netip.MustParseAddr("10.213.0.1")
	addrA6  = netip.MustParseAddr("fd00:213::1")
	client1 = netip.MustParseAddr("10.213.0.2")
	client2 = netip.MustParseAddr("10.213.0.3")
	client6 = netip.MustParseAddr("fd00:213::2")
	backend = netip.MustParseAddr("10.213.0.4") // b's server, a's outgoing connection's peer
)

// A generous ceiling: a veth's round trip is tens of microseconds.
const plausible = 10 * time.Millisecond

var nsSeq atomic.Int32

// topology is two network namespaces of the test's own, named
// crtt-test-PID-N-a and -b, joined by a veth.
type topology struct {
	a, b  netns.NsHandle
	pathA string
}

func newTopology(t *testing.T) *topology {
	t.Helper()
	testroot.Require(t, "needs root: makes network namespaces and a veth pair")
	n := nsSeq.Add(1)
	name := func(side string) string { return fmt.Sprintf("crtt-test-%d-%d-%s", os.Getpid(), n, side) }
	top := &topology{a: namedNS(t, name("a")), b: namedNS(t, name("b"))}
	top.pathA = filepath.Join("/run/netns", name("a"))

	ha, err := netlink.NewHandleAt(top.a, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ha.Close)
	hb, err := netlink.NewHandleAt(top.b, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hb.Close)
	// Made in a with its peer in b: the link never shows in the host's
	// namespace, so its names cannot clash with anyone's.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "crtt-a"}, PeerName: "crtt-b", PeerNamespace: netlink.NsFd(int(top.b))}
	if err := ha.LinkAdd(veth); err != nil {
		t.Fatalf("veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := ha.LinkByName("crtt-a"); err == nil {
			_ = ha.LinkDel(l)
		}
	})
	up(t, ha, "crtt-a", addrA, addrA6)
	up(t, hb, "crtt-b", client1, client2, client6, backend)
	// Until the kernel sees the carrier (linkwatch, up to a second later)
	// a link's queue drops what is sent: a probe's first SYN would be
	// lost and sent again a second later.
	running(t, ha, "crtt-a")
	running(t, hb, "crtt-b")
	return top
}

func running(t *testing.T, h *netlink.Handle, link string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := h.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not running: %v", link, l.Attrs().OperState)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// namedNS makes a named network namespace, removed when the test ends.
func namedNS(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	type made struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan made, 1)
	go func() {
		// NewNamed moves this thread into the new namespace, so it goes
		// back before it is unlocked. One that cannot stays locked and
		// Go ends it (or, the main thread, never runs Go on it again).
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- made{err: err}
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if serr := netns.Set(orig); serr != nil {
			ch <- made{h, errors.Join(err, serr)}
			return
		}
		runtime.UnlockOSThread()
		ch <- made{h, err}
	}()
	m := <-ch
	if m.err != nil && !m.h.IsOpen() {
		t.Fatalf("network namespace %s: %v", name, m.err)
	}
	t.Cleanup(func() {
		m.h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("remove network namespace %s: %v", name, err)
		}
	})
	if m.err != nil {
		t.Fatalf("network namespace %s: %v", name, m.err)
	}
	return m.h
}

// up brings lo and the link up, with addrs (/24 or /64, IPv6 without
// duplicate address detection: usable at once).
func up(t *testing.T, h *netlink.Handle, link string, addrs ...netip.Addr) {
	t.Helper()
	for _, name := range []string{"lo", link} {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("%s up: %v", name, err)
		}
	}
	l, _ := h.LinkByName(link)
	for _, a := range addrs {
		bits, flags := 24, 0
		if a.Is6() {
			bits, flags = 64, unix.IFA_F_NODAD
		}
		pfx := netip.PrefixFrom(a, bits)
		ipn := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipn, Flags: flags}); err != nil {
			t.Fatalf("address %s on %s: %v", pfx, link, err)
		}
	}
}

// in runs f on a thread inside ns.
func in(t *testing.T, ns netns.NsHandle, f func() error) {
	t.Helper()
	if err := privnet.FromHandle(ns).Do(f); err != nil {
		t.Fatal(err)
	}
}

// echoServer listens on addr in ns and echoes what each connection sends,
// until the test ends.
func echoServer(t *testing.T, ns netns.NsHandle, addr string) *net.TCPAddr {
	t.Helper()
	var l net.Listener
	in(t, ns, func() (err error) { l, err = net.Listen("tcp", addr); return err })
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = io.Copy(c, c) }()
		}
	}()
	return l.Addr().(*net.TCPAddr)
}

// dial connects from ns (from the local address from, if valid) to
// to, and sends a few messages each way, so that the connection's RTT
// has samples beyond the handshake's.
func dial(t *testing.T, ns netns.NsHandle, from netip.Addr, to netip.AddrPort) net.Conn {
	t.Helper()
	var c net.Conn
	in(t, ns, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		if from.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		}
		c, err = d.Dial("tcp", to.String())
		return err
	})
	t.Cleanup(func() { c.Close() })
	buf := make([]byte, 64)
	for range 5 {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf[:4]); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func TestClients(t *testing.T) {
	home, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	top := newTopology(t)
	srv := echoServer(t, top.a, ":0") // both families
	port := uint16(srv.Port)
	to4, to6 := netip.AddrPortFrom(addrA, port), netip.AddrPortFrom(addrA6, port)
	dial(t, top.b, client1, to4)
	dial(t, top.b, client1, to4)
	dial(t, top.b, client2, to4)
	dial(t, top.b, client6, to6)
	// a's own outgoing connection, to a server in b: not a client.
	back := echoServer(t, top.b, netip.AddrPortFrom(backend, 0).String())
	dial(t, top.a, netip.Addr{}, netip.AddrPortFrom(backend, uint16(back.Port)))

	want := map[netip.Addr]int{client1: 2, client2: 1, client6: 1}
	check := func(name string, cs []Client, want map[netip.Addr]int) {
		t.Helper()
		if len(cs) != len(want) {
			t.Errorf("%s: %d clients, want %d: %+v", name, len(cs), len(want), cs)
		}
		for _, c := range cs {
			n, ok := want[c.Addr]
			if !ok {
				t.Errorf("%s: %s is no client: %+v", name, c.Addr, c)
				continue
			}
			if c.Conns != n {
				t.Errorf("%s: %s has %d connections, want %d", name, c.Addr, c.Conns, n)
			}
			if c.RTT <= 0 || c.RTT >= plausible || c.MinRTT <= 0 || c.MinRTT > c.RTT || c.MinRTT >= plausible {
				t.Errorf("%s: %s: RTT %v, min %v: not a veth's", name, c.Addr, c.RTT, c.MinRTT)
			}
			// What was acked waits on delayed ACKs; what arrived is exact.
			if c.BytesReceived != uint64(n)*5*4 || c.BytesAcked == 0 {
				t.Errorf("%s: %s: %d bytes received (want %d), %d acked", name, c.Addr, c.BytesReceived, n*5*4, c.BytesAcked)
			}
			t.Logf("%s: %+v", name, c)
		}
	}

	cs, err := Clients(top.a, Options{Inbound: true})
	if err != nil {
		t.Fatal(err)
	}
	check("inbound", cs, want)
	if len(cs) > 0 && cs[0].Addr != client1 {
		t.Errorf("the client with most connections is not first: %+v", cs)
	}
	cs, err = ClientsAt(top.pathA, Options{LocalPorts: []uint16{port}})
	if err != nil {
		t.Fatal(err)
	}
	check("port", cs, want)

	cs, err = Clients(top.a, Options{})
	if err != nil {
		t.Fatal(err)
	}
	all := map[netip.Addr]int{backend: 1}
	for a, n := range want {
		all[a] = n
	}
	check("unfiltered", cs, all)

	// b's view: its one client is a's outgoing connection.
	cs, err = Clients(top.b, Options{Inbound: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Addr != addrA || cs[0].Conns != 1 {
		t.Errorf("b's clients: %+v, want one connection from %s", cs, addrA)
	}

	// The host's own namespace is not the one read, and no thread of
	// this process stayed in another.
	if err := threadsHome(home); err != nil {
		t.Error(err)
	}
}

// threadsHome checks that every thread of this process is in the
// network namespace home (a thread left locked in another is ended by Go:
// given a moment).
func threadsHome(home string) error {
	var stray error
	for range 50 {
		stray = nil
		tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
		for _, p := range tasks {
			if ns, err := os.Readlink(p); err == nil && ns != home {
				stray = fmt.Errorf("%s is %s, not %s", p, ns, home)
			}
		}
		if stray == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return stray
}

func TestProbe(t *testing.T) {
	top := newTopology(t)
	srv := echoServer(t, top.a, ":0")
	// A port nothing listens on: one that was free a moment ago.
	var closed int
	in(t, top.a, func() error {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return err
		}
		closed = l.Addr().(*net.TCPAddr).Port
		return l.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quick := ProbeOptions{Count: 4, Interval: 10 * time.Millisecond, Timeout: time.Second}

	for _, tc := range []struct {
		name    string
		addr    netip.Addr
		port    int
		refused bool
	}{
		{"tcp", addrA, srv.Port, false},
		{"tcp6", addrA6, srv.Port, false},
		{"tcp refused", addrA, closed, true},
		{"tcp6 refused", addrA6, closed, true},
		{"icmp", addrA, 0, false},
		{"icmp6", addrA6, 0, false},
	} {
		o := quick
		o.Port = uint16(tc.port)
		var r ProbeResult
		var err error
		in(t, top.b, func() error { r, err = Probe(ctx, tc.addr, o); return nil })
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		t.Logf("%s: median %v, min %v, samples %v", tc.name, r.Median, r.Min, r.Samples)
		if r.Sent != o.Count || r.Received != o.Count || len(r.Samples) != o.Count {
			t.Errorf("%s: %d sent, %d answered, %d samples; want %d", tc.name, r.Sent, r.Received, len(r.Samples), o.Count)
		}
		if tc.refused && r.Refused != o.Count || !tc.refused && r.Refused != 0 {
			t.Errorf("%s: %d refused", tc.name, r.Refused)
		}
		if r.Min <= 0 || r.Min > r.Median || r.Median >= plausible {
			t.Errorf("%s: median %v, min %v: not a veth's", tc.name, r.Median, r.Min)
		}
	}

	// Nobody at the address (no ARP answer): no sample, and it says so.
	nobody := netip.MustParseAddr("10.213.0.99")
	for _, port := range []uint16{srv.AddrPort().Port(), 0} {
		o := ProbeOptions{Port: port, Count: 2, Interval: 10 * time.Millisecond, Timeout: 200 * time.Millisecond}
		var r ProbeResult
		var err error
		in(t, top.b, func() error { r, err = Probe(ctx, nobody, o); return nil })
		if !errors.Is(err, ErrNoAnswer) || r.Sent != 2 || r.Received != 0 {
			t.Errorf("port %d, nobody there: %+v, %v", port, r, err)
		}
	}

	// A cancelled context ends a probe at once.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	var err error
	in(t, top.b, func() error {
		_, err = Probe(cctx, nobody, ProbeOptions{Timeout: time.Minute})
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled probe: %v", err)
	}
}

package delayline

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/testroot"
)

// The integration test builds its own three namespaces: a and b, each with
// an eth0 whose peer (ma, mb) sits in m, where the relay joins ma and mb.
// Nothing else reaches them.
const (
	addrA = "10.250.0.1"
	addrB = "10.250.0.2"
)

type testNet struct {
	a, b, m string // namespace names
}

func nsPath(name string) string { return filepath.Join("/run/netns", name) }

// newTestNet makes the namespaces and links, removed again when t ends;
// bridged joins ma and mb with a bridge in m instead, a link without the
// line to compare with.
func newTestNet(t *testing.T, tag string, bridged bool) *testNet {
	t.Helper()
	prefix := fmt.Sprintf("fdl-test-%d-%s-", os.Getpid(), tag)
	n := &testNet{a: prefix + "a", b: prefix + "b", m: prefix + "m"}
	for _, name := range []string{n.a, n.b, n.m} {
		if err := inNewThread(func() error {
			h, err := netns.NewNamed(name)
			if err != nil {
				return err
			}
			return h.Close()
		}); err != nil {
			t.Fatalf("create netns %s: %v", name, err)
		}
		t.Cleanup(func() {
			if err := netns.DeleteNamed(name); err != nil {
				t.Errorf("delete netns %s: %v", name, err)
			}
		})
		h := handle(t, name)
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatalf("%s: lo up: %v", name, err)
		}
	}
	m := handle(t, n.m)
	for _, side := range []struct{ ns, port, addr string }{{n.a, "ma", addrA}, {n.b, "mb", addrB}} {
		peerNS, err := netns.GetFromPath(nsPath(side.ns))
		if err != nil {
			t.Fatal(err)
		}
		err = m.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: side.port}, PeerName: "eth0", PeerNamespace: netlink.NsFd(peerNS)})
		peerNS.Close()
		if err != nil {
			t.Fatalf("add veth %s: %v", side.port, err)
		}
		port, err := m.LinkByName(side.port)
		if err == nil {
			err = m.LinkSetUp(port)
		}
		if err != nil {
			t.Fatalf("%s up: %v", side.port, err)
		}
		h := handle(t, side.ns)
		eth, err := h.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(side.addr).To4(), Mask: net.CIDRMask(24, 32)}}
		if err := h.AddrAdd(eth, addr); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(eth); err != nil {
			t.Fatal(err)
		}
	}
	if bridged {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br"}}
		if err := m.LinkAdd(br); err != nil {
			t.Fatal(err)
		}
		for _, port := range []string{"ma", "mb"} {
			l, err := m.LinkByName(port)
			if err == nil {
				err = m.LinkSetMaster(l, br)
			}
			if err != nil {
				t.Fatalf("enslave %s: %v", port, err)
			}
		}
		if err := m.LinkSetUp(br); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func handle(t *testing.T, ns string) *netlink.Handle {
	t.Helper()
	nsh, err := netns.GetFromPath(nsPath(ns))
	if err != nil {
		t.Fatalf("open netns %s: %v", ns, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatalf("netlink in %s: %v", ns, err)
	}
	t.Cleanup(h.Close)
	return h
}

// inNewThread runs fn on a thread that Go throws away afterwards, since fn
// may leave it in another namespace.
func inNewThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		done <- fn()
	}()
	return <-done
}

// inNS runs fn on a throwaway thread inside namespace ns; sockets fn
// makes stay there.
func inNS(ns string, fn func() error) error {
	return inNewThread(func() error {
		h, err := netns.GetFromPath(nsPath(ns))
		if err != nil {
			return err
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			return err
		}
		return fn()
	})
}

// startRelay runs a relay between ma and mb in m until t ends.
func startRelay(t *testing.T, n *testNet, rtt time.Duration) *Relay {
	t.Helper()
	r, err := New(Config{Pairs: []Pair{{A: "ma", B: "mb"}}, RTT: rtt, NetNS: nsPath(n.m)})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	return r
}

// shape puts tbf at rate bps on both hosts' eth0, as the lab does, or
// takes it away (bps 0).
func shape(t *testing.T, n *testNet, bps uint64) {
	t.Helper()
	for _, ns := range []string{n.a, n.b} {
		h := handle(t, ns)
		eth, err := h.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		attrs := netlink.QdiscAttrs{LinkIndex: eth.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
		if bps == 0 {
			if err := h.QdiscDel(&netlink.Tbf{QdiscAttrs: attrs}); err != nil {
				t.Fatalf("%s: remove tbf: %v", ns, err)
			}
			continue
		}
		rate := bps / 8
		burst := max(rate/250, 32*1024)
		q := &netlink.Tbf{QdiscAttrs: attrs, Rate: rate, Limit: uint32(rate/20 + burst), Buffer: netlink.Xmittime(rate, uint32(burst))}
		if err := h.QdiscReplace(q); err != nil {
			t.Fatalf("%s: tbf: %v", ns, err)
		}
	}
}

// pingRTT is the median of count ICMP echo round trips from a to b.
func pingRTT(t *testing.T, n *testNet, count int) time.Duration {
	t.Helper()
	var rtts []time.Duration
	err := inNS(n.a, func() error {
		c, err := icmp.ListenPacket("ip4:icmp", addrA)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 1500)
		for seq := range count {
			msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: seq, Data: []byte("ferry delay line")}}
			wb, err := msg.Marshal(nil)
			if err != nil {
				return err
			}
			start := time.Now()
			if _, err := c.WriteTo(wb, &net.IPAddr{IP: net.ParseIP(addrB)}); err != nil {
				return err
			}
			for {
				if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
					return err
				}
				k, _, err := c.ReadFrom(buf)
				if err != nil {
					return fmt.Errorf("echo %d: %w", seq, err)
				}
				rm, err := icmp.ParseMessage(1, buf[:k])
				if err != nil {
					return err
				}
				if e, ok := rm.Body.(*icmp.Echo); ok && rm.Type == ipv4.ICMPTypeEchoReply && e.Seq == seq {
					break
				}
			}
			rtts = append(rtts, time.Since(start))
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ping: %v", err)
	}
	return median(rtts)
}

// tcpRTT is the median of count small request-and-reply round trips on one
// TCP connection from a to an echo server in b.
func tcpRTT(t *testing.T, n *testNet, count int) time.Duration {
	t.Helper()
	var ln net.Listener
	if err := inNS(n.b, func() (err error) {
		ln, err = net.Listen("tcp4", addrB+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	var rtts []time.Duration
	err := inNS(n.a, func() error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
			return err
		}
		msg := make([]byte, 64)
		for range count {
			start := time.Now()
			if _, err := c.Write(msg); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, msg); err != nil {
				return err
			}
			rtts = append(rtts, time.Since(start))
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("tcp echo: %v", err)
	}
	return median(rtts)
}

func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// checkMeasured fails unless got is within 10 % of want, plus a millisecond
// (the veths' and the sockets' own time).
func checkMeasured(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	t.Logf("%s: set %v, measured %v", what, want, got)
	if math.Abs(float64(got-want)) > 0.1*float64(want)+float64(time.Millisecond) {
		t.Errorf("%s: measured %v, set %v", what, got, want)
	}
}

// iperfResult is what the tests read of iperf3's JSON.
type iperfResult struct {
	Intervals []struct {
		Sum struct {
			Start, End    float64
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum"`
	} `json:"intervals"`
	End struct {
		SumSent struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			Retransmits   int     `json:"retransmits"`
		} `json:"sum_sent"`
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
}

// after is the sender's mean rate over the intervals that begin at from
// or later: past slow start.
func (r iperfResult) after(from time.Duration) float64 {
	var bits, secs float64
	for _, iv := range r.Intervals {
		if iv.Sum.Start >= from.Seconds()-1e-3 {
			bits += iv.Sum.BitsPerSecond * (iv.Sum.End - iv.Sum.Start)
			secs += iv.Sum.End - iv.Sum.Start
		}
	}
	if secs == 0 {
		return 0
	}
	return bits / secs
}

// startIperfServer runs a one-off iperf3 server in b, stopped by its PID
// when t ends.
func startIperfServer(t *testing.T, n *testNet, port int) {
	t.Helper()
	cmd := exec.Command("nsenter", "--net="+nsPath(n.b), "--", "iperf3", "-s", "-1", "-B", addrB, "-p", fmt.Sprint(port))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		if procs.Alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Wait()
	})
	// Ready once its socket listens (state 0A in its namespace's table):
	// a probing connection would use up the one-off server.
	want := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("iperf3 server did not start")
		}
	}
}

var iperfPort = 15201

// iperf runs one iperf3 transfer from a to b for d; during, if set, runs
// while it goes.
func iperf(t *testing.T, n *testNet, d time.Duration, during func()) iperfResult {
	t.Helper()
	iperfPort++
	startIperfServer(t, n, iperfPort)
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+nsPath(n.a), "--", "iperf3", "-c", addrB, "-p", fmt.Sprint(iperfPort),
		"-t", fmt.Sprintf("%.1f", d.Seconds()), "-i", "0.5", "-J")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil && procs.Alive(cmd.Process.Pid) {
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	if during != nil {
		during()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("iperf3: %v: %s", err, out.String())
	}
	var r iperfResult
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("iperf3 output: %v", err)
	}
	return r
}

func mbit(bps float64) string { return fmt.Sprintf("%.0f Mbit/s", bps/1e6) }

func TestDelayLine(t *testing.T) {
	testroot.Require(t, "the delay line test makes network namespaces and packet sockets (needs root)")
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("no iperf3")
	}
	n := newTestNet(t, "line", false)
	r := startRelay(t, n, 0)

	t.Run("rtt", func(t *testing.T) {
		for _, want := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond} {
			if err := r.SetRTT(want); err != nil {
				t.Fatal(err)
			}
			checkMeasured(t, "ping", pingRTT(t, n, 20), want)
			checkMeasured(t, "tcp", tcpRTT(t, n, 20), want)
		}
	})

	t.Run("port-down-and-up", func(t *testing.T) {
		// The lab takes a path down at the switch port (SetPath): the line
		// must carry frames again once it is back up.
		if err := r.SetRTT(10 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		m := handle(t, n.m)
		ma, err := m.LinkByName("ma")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.LinkSetDown(ma); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if err := m.LinkSetUp(ma); err != nil {
			t.Fatal(err)
		}
		checkMeasured(t, "ping after the port came back", pingRTT(t, n, 5), 10*time.Millisecond)
	})

	t.Run("change-during-transfer", func(t *testing.T) {
		if err := r.SetRTT(20 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		before := r.Stats()
		res := iperf(t, n, 6*time.Second, func() {
			time.Sleep(2 * time.Second)
			_ = r.SetRTT(80 * time.Millisecond)
			time.Sleep(2 * time.Second)
			_ = r.SetRTT(10 * time.Millisecond) // shrinking: nothing may overtake
		})
		var rates []float64
		for _, iv := range res.Intervals {
			rates = append(rates, iv.Sum.BitsPerSecond)
		}
		t.Logf("20 ms, 80 ms from 2 s, 10 ms from 4 s: %s, retransmits %d; per 0.5 s: %v",
			mbit(res.End.SumReceived.BitsPerSecond), res.End.SumSent.Retransmits, mbitList(rates))
		// After slow start, no half second may stall: a change moves the
		// frames in flight, it does not stop the flow.
		for i, v := range rates {
			if i >= 2 && v < 0.1*res.End.SumReceived.BitsPerSecond {
				t.Errorf("interval %d carried %s against %s overall", i, mbit(v), mbit(res.End.SumReceived.BitsPerSecond))
			}
		}
		logDrops(t, before, r.Stats())
	})

	t.Run("throughput", func(t *testing.T) {
		for _, link := range []struct {
			name string
			bps  uint64
		}{{"unshaped", 0}, {"tbf 1gbit", 1e9}} {
			if link.bps > 0 {
				shape(t, n, link.bps)
			}
			for _, rtt := range []time.Duration{0, 20 * time.Millisecond, 50 * time.Millisecond} {
				if err := r.SetRTT(rtt); err != nil {
					t.Fatal(err)
				}
				before := r.Stats()
				res := iperf(t, n, 4*time.Second, nil)
				t.Logf("%s, rtt %v: %s, retransmits %d", link.name, rtt, mbit(res.End.SumReceived.BitsPerSecond), res.End.SumSent.Retransmits)
				logDrops(t, before, r.Stats())
				if link.bps > 0 && rtt <= 20*time.Millisecond && res.End.SumReceived.BitsPerSecond < 0.8*float64(link.bps) {
					t.Errorf("%s, rtt %v: %s, want at least 80 %% of the link", link.name, rtt, mbit(res.End.SumReceived.BitsPerSecond))
				}
			}
			if link.bps > 0 {
				shape(t, n, 0)
			}
		}
	})
}

func mbitList(bps []float64) string {
	var s []string
	for _, v := range bps {
		s = append(s, fmt.Sprintf("%.0f", v/1e6))
	}
	return strings.Join(s, " ")
}

func logDrops(t *testing.T, before, after Stats) {
	t.Helper()
	for i, d := range after.Directions {
		b := before.Directions[i]
		t.Logf("%s: %d frames (%d MB), dropped %d, send errors %d, receive errors %d, socket drops %d",
			d.Name, d.Passed-b.Passed, (d.PassedBytes-b.PassedBytes)>>20, d.Dropped-b.Dropped, d.SendErrors-b.SendErrors,
			d.RecvErrors-b.RecvErrors, d.SocketDrops-b.SocketDrops)
	}
}

// TestDelayLineBench measures what docs/BENCHMARKS.md reports ("Delay
// line"): RTT set against measured, and throughput with and without the
// line at several rates. It takes a few minutes, so only when asked:
// FERRY_DELAYLINE_BENCH=1 go test ./internal/delayline/ -run Bench -v
func TestDelayLineBench(t *testing.T) {
	testroot.Require(t, "the delay line bench makes network namespaces and packet sockets (needs root)")
	if os.Getenv("FERRY_DELAYLINE_BENCH") == "" {
		t.Skip("set FERRY_DELAYLINE_BENCH=1 to measure the delay line (a few minutes)")
	}
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("no iperf3")
	}
	line := newTestNet(t, "line", false)
	r := startRelay(t, line, 0)
	for _, rtt := range []time.Duration{0, 1, 5, 10, 20, 50, 100, 200} {
		rtt *= time.Millisecond
		if err := r.SetRTT(rtt); err != nil {
			t.Fatal(err)
		}
		t.Logf("RTT set %v: ping %v, tcp %v", rtt, pingRTT(t, line, 30), tcpRTT(t, line, 30))
	}
	direct := newTestNet(t, "direct", true)
	t.Logf("without the line: ping %v, tcp %v", pingRTT(t, direct, 30), tcpRTT(t, direct, 30))

	for _, bps := range []uint64{0, 1e9, 100e6} {
		for _, n := range []*testNet{direct, line} {
			if bps > 0 {
				shape(t, n, bps)
			}
		}
		link := "unshaped"
		if bps > 0 {
			link = "tbf " + mbit(float64(bps))
		}
		res := iperf(t, direct, 5*time.Second, nil)
		t.Logf("%s, without the line: %s (%s after the first second), retransmits %d", link,
			mbit(res.End.SumReceived.BitsPerSecond), mbit(res.after(time.Second)), res.End.SumSent.Retransmits)
		for _, rtt := range []time.Duration{0, 20 * time.Millisecond, 50 * time.Millisecond} {
			if err := r.SetRTT(rtt); err != nil {
				t.Fatal(err)
			}
			before := r.Stats()
			cpu := cpuTime()
			res := iperf(t, line, 5*time.Second, nil)
			t.Logf("%s, line at %v: %s (%s after the first second), retransmits %d; the relay used %.0f %% of a core", link, rtt,
				mbit(res.End.SumReceived.BitsPerSecond), mbit(res.after(time.Second)), res.End.SumSent.Retransmits, 100*(cpuTime()-cpu).Seconds()/5)
			logDrops(t, before, r.Stats())
		}
		for _, n := range []*testNet{direct, line} {
			if bps > 0 {
				shape(t, n, 0)
			}
		}
	}

	// At 50 ms the default TCP buffers (tcp_rmem's 6 MB) hold less than
	// a round trip of 1 Gbit/s: the window, not the line, is the limit.
	// With buffers that hold it:
	for _, ns := range []string{line.a, line.b} {
		setTCPBuffers(t, ns, 64<<20)
	}
	shape(t, line, 1e9)
	for _, rtt := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond} {
		if err := r.SetRTT(rtt); err != nil {
			t.Fatal(err)
		}
		before := r.Stats()
		res := iperf(t, line, 8*time.Second, nil)
		t.Logf("tbf 1gbit, 64 MB TCP buffers, line at %v: %s, retransmits %d", rtt, mbit(res.End.SumReceived.BitsPerSecond), res.End.SumSent.Retransmits)
		logDrops(t, before, r.Stats())
	}
}

// setTCPBuffers lets TCP's buffers in namespace ns grow to size.
func setTCPBuffers(t *testing.T, ns string, size int) {
	t.Helper()
	err := inNS(ns, func() error {
		for _, f := range []string{"tcp_rmem", "tcp_wmem"} {
			v := fmt.Sprintf("4096 131072 %d", size)
			if err := os.WriteFile("/proc/sys/net/ipv4/"+f, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: TCP buffers: %v", ns, err)
	}
}

// cpuTime is the CPU time this process (in the bench: the relay, iperf3
// runs apart) has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

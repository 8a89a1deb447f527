package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/probe"
)

// TestLXCOnASharedBridge: an LXC container on a veth to a bridge on the
// segment both hosts share (the agents' --segment-bridge) keeps its
// address and a client's TCP connection in cold, pre-copy and post-copy
// (whose lazy dump runs in a private namespace, lxc-checkpoint outside
// it); the source's
// end of its veth goes down at the freeze, and comes back when a failed
// restore resumes the source.
func TestLXCOnASharedBridge(t *testing.T) {
	requireLXC(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	h1 := &l.Hosts[0]
	for i, c := range []struct {
		mode  string
		fault string
	}{{engine.ModeCold, ""}, {engine.ModePrecopy, ""}, {engine.ModeCold, "restore-fails@restore"}, {engine.ModePostcopy, ""}} {
		ip := fmt.Sprintf("%s%d", lab.SegmentSubnet, 80+i)
		name := fmt.Sprintf("lxs-%d", i)
		t.Run(c.mode+map[bool]string{true: "-fails", false: ""}[c.fault != ""], func(t *testing.T) {
			t.Cleanup(func() {
				for _, h := range l.Hosts[:2] {
					_ = l.RemoveFrom(context.Background(), "lxc", h.Name, name)
				}
			})
			args := append(memhogArgs("64M", "200"), "--echo-port", echoPort)
			if err := l.RunLXC(context.Background(), h1.Name, name, args, lab.Attachments{IP: ip}); err != nil {
				t.Fatal(err)
			}
			req := engine.Request{Container: name, Mode: c.mode, Runtime: "lxc"}
			if c.fault != "" {
				req.Faults = []string{c.fault}
			}
			m := moveHeld(t, l, bin, ip, req)
			rep, pr, perr, sr, serr := m.rep, m.pr, m.perr, m.sr, m.serr
			if serr != nil || !sr.OK {
				t.Errorf("the client's TCP connection did not carry on: %+v %v", sr, serr)
			}
			if c.fault != "" {
				if rep.OK || rep.SourceState != "resumed" {
					t.Errorf("failed restore: ok=%v source %q: %s", rep.OK, rep.SourceState, rep.Error)
				}
				if perr != nil || !pr.StateOK {
					t.Errorf("workload state after the resume: %+v %v", pr, perr)
				}
				t.Logf("lxc on the segment, failed restore: the TCP client's longest wait %.0f ms", sr.MaxGapMs)
				return
			}
			checkMoved(t, "lxc", c.mode, rep, pr, perr)
			if len(rep.Networks) != 1 || rep.Networks[0].HostLocal || rep.Networks[0].Address != ip || !strings.Contains(rep.Networks[0].Outcome, "kept") {
				t.Errorf("report's networks: %+v", rep.Networks)
			}
			t.Logf("lxc on the segment, %s: downtime %.0f ms, probe's gap %.0f ms, the TCP client's longest wait %.0f ms", c.mode, rep.DowntimeMs, pr.ClientDowntimeMs, sr.MaxGapMs)
		})
	}
}

// heldMove is what a migration did and what two clients on h3 saw of
// it: the probe of the workload, and a TCP connection held to its echo
// port throughout.
type heldMove struct {
	rep  engine.Report
	pr   probe.Result
	perr error
	sr   labtool.StreamResult
	serr error
}

// moveHeld migrates req from h1 to h2 while h3 probes the workload at ip
// and holds a connection to its echo port.
func moveHeld(t *testing.T, l *lab.Lab, bin, ip string, req engine.Request) heldMove {
	t.Helper()
	ctx := context.Background()
	p, _, err := bench.StartProbe(ctx, &l.Hosts[2], bin, []string{ip + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := bench.StartStream(ctx, &l.Hosts[2], bin, "stream", "--addr", ip+":"+echoPort)
	if err != nil {
		_, _ = p.Stop()
		t.Fatal(err)
	}
	req.To = l.Hosts[1].AgentAddr
	rep, err := client.Migrate(ctx, client.Socket(l.Hosts[0].ControlSock), req, nil)
	time.Sleep(300 * time.Millisecond) // answers after the switch
	m := heldMove{rep: rep}
	m.sr, m.serr = stream.Stop()
	m.pr, m.perr = p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLXCOnItsHostsBridge: an LXC container on its host's own bridge (as
// lxc-net's lxcbr0: the same subnet on every host, segments of their own)
// moves in cold and post-copy. It keeps its address on the destination's
// bridge of that name; the report says before the freeze that its
// connections close; a client of the source's bridge sees its connection
// end rather than hang, and a new client at the destination reaches the
// container, whose state carried over (the same run of memhog, verified).
func TestLXCOnItsHostsBridge(t *testing.T) {
	requireLXC(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	h1, h2 := &l.Hosts[0], &l.Hosts[1]
	for i, mode := range []string{engine.ModeCold, engine.ModePostcopy} {
		ip := fmt.Sprintf("%s%d", lab.HostBridgeSubnet, 10+i)
		name := fmt.Sprintf("lxb-%d", i)
		t.Run(mode, func(t *testing.T) {
			if mode == engine.ModePostcopy && !criu.ProbeFeatures(context.Background()).LazyPages {
				t.Skip("CRIU's lazy pages are unavailable here (see ferry check): no post-copy")
			}
			t.Cleanup(func() {
				for _, h := range l.Hosts[:2] {
					_ = l.RemoveFrom(context.Background(), "lxc", h.Name, name)
				}
			})
			args := append(memhogArgs("64M", "200"), "--echo-port", echoPort)
			if err := l.RunLXC(context.Background(), h1.Name, name, args, lab.Attachments{Bridge: true, IP: ip}); err != nil {
				t.Fatal(err)
			}
			before := queryOn(t, h1, ip, probe.ReqStat)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			conn, err := h1.Dial(ctx, "tcp", ip+":"+echoPort)
			if err != nil {
				t.Fatalf("a client on h1's bridge: %v", err)
			}
			defer conn.Close()
			var events []api.Progress
			rep, err := client.Migrate(ctx, client.Socket(h1.ControlSock), engine.Request{Container: name, Mode: mode, Runtime: "lxc", To: h2.AgentAddr},
				func(p api.Progress) { events = append(events, p) })
			if err != nil || !rep.OK {
				t.Fatalf("moving %s: %v %s (at %s)", name, err, rep.Error, rep.FailedAt)
			}
			if len(rep.Networks) != 1 || !rep.Networks[0].HostLocal || rep.Networks[0].Name != lab.HostBridge ||
				rep.Networks[0].Address != ip || !strings.Contains(rep.Networks[0].Outcome, "closed") {
				t.Errorf("report's networks: %+v", rep.Networks)
			}
			if !saidBeforeFreeze(events, "closed") {
				t.Errorf("no event said before the freeze that the connections close: %+v", events)
			}
			after := queryOn(t, h2, ip, probe.ReqVerify)
			if after.Boot != before.Boot || after.Counter < before.Counter || !after.VerifyOK {
				t.Errorf("memhog at h2: boot %s counter %d verify %v; at h1 before: boot %s counter %d", after.Boot, after.Counter, after.VerifyOK, before.Boot, before.Counter)
			}
			connectionEnded(t, conn, "the h1 client's connection")
			echoes(t, h2, ip+":"+echoPort, "a client on h2's bridge")
			if st := lxcState(t, h1, name); st != "absent" {
				t.Errorf("h1 still has the container: %s", st)
			}
			t.Logf("lxc on its host's bridge, %s: downtime %.0f ms, total %.0f ms", mode, rep.DowntimeMs, rep.TotalMs)
		})
	}

	// CRIU restores the address the container had: where another
	// container at the destination has it, the move is refused before
	// the freeze, saying which.
	t.Run("address taken", func(t *testing.T) {
		ip := lab.HostBridgeSubnet + "30"
		t.Cleanup(func() {
			for _, h := range l.Hosts[:2] {
				_ = l.RemoveFrom(context.Background(), "lxc", h.Name, "lxb-src")
				_ = l.RemoveFrom(context.Background(), "lxc", h.Name, "lxb-other")
			}
		})
		for _, c := range []struct{ host, name string }{{h1.Name, "lxb-src"}, {h2.Name, "lxb-other"}} {
			if err := l.RunLXC(context.Background(), c.host, c.name, memhogArgs("16M", "100"), lab.Attachments{Bridge: true, IP: ip}); err != nil {
				t.Fatal(err)
			}
		}
		expectRefused(t, l, []refusal{
			{engine.Request{Container: "lxb-src", Mode: engine.ModeCold, Runtime: "lxc"}, `container "lxb-other" here has ` + ip, "destination"},
		}, func() {
			if st := lxcState(t, h1, "lxb-src"); st != "RUNNING" {
				t.Fatalf("after the refusal the container is %s", st)
			}
		})
	})
}

// queryOn asks memhog at ip, from host h's namespace, for req's reply,
// once it is ready (it answers after filling its memory).
func queryOn(t *testing.T, h *lab.Host, ip, req string) probe.Stat {
	t.Helper()
	var st probe.Stat
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err = cnet.Do(h.NetNS, func() error {
			var err error
			st, err = probe.Query(context.Background(), ip+":"+memhogPort, req, 2*time.Second)
			return err
		})
		if err == nil && st.Ready || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !st.Ready {
		t.Fatalf("memhog at %s from %s: %+v %v", ip, h.Name, st, err)
	}
	return st
}

// saidBeforeFreeze says whether a progress event before the freeze told
// of a network whose outcome contains what.
func saidBeforeFreeze(events []api.Progress, what string) bool {
	for _, e := range events {
		switch e.Phase {
		case "freeze", "dump", "images", "restore", "lazy-pages", "commit", "cleanup":
			return false
		}
		for _, n := range e.Networks {
			if strings.Contains(n.Outcome, what) {
				return true
			}
		}
	}
	return false
}

// connectionEnded checks that conn, a client's connection to the
// container at the source, ends (EOF or a reset) within 5 s rather than
// hanging: the container's connections were closed by the move.
func connectionEnded(t *testing.T, conn net.Conn, what string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%s after the move: %v, want it closed", what, err)
	}
}

// echoes checks that a new client, from host h, gets its line back from
// the container's echo port at addr.
func echoes(t *testing.T, h *lab.Host, addr, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("again\n")); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "again\n" {
		t.Errorf("%s: echo %q %v", what, buf, err)
	}
}

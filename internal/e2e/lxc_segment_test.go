package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/probe"
)

// TestLXCOnASharedBridge: an LXC container on a veth to a bridge on the
// segment both hosts share (the agents' --segment-bridge) keeps its
// address and a client's TCP connection in cold and pre-copy; the source's
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
	}{{engine.ModeCold, ""}, {engine.ModePrecopy, ""}, {engine.ModeCold, "restore-fails@restore"}} {
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

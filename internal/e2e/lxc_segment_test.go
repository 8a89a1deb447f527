package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
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
	h1, h2 := &l.Hosts[0], &l.Hosts[1]
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
			p, _, err := bench.StartProbe(context.Background(), &l.Hosts[2], bin, []string{ip + ":" + memhogPort}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			stream, err := bench.StartStream(context.Background(), &l.Hosts[2], bin, "stream", "--addr", ip+":"+echoPort)
			if err != nil {
				_, _ = p.Stop()
				t.Fatal(err)
			}
			req := engine.Request{Container: name, To: h2.AgentAddr, Mode: c.mode, Runtime: "lxc"}
			if c.fault != "" {
				req.Faults = []string{c.fault}
			}
			rep, err := agent.Migrate(context.Background(), agent.Socket(h1.ControlSock), req, nil)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			sr, serr := stream.Stop()
			pr, perr := p.Stop()
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

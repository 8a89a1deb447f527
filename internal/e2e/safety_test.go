package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/engine"
)

// TestFrozenRootfsFailureResumesSource: the frozen rootfs sync fails while
// CRIU dumps beside it (the way a rootfs over the old 1 MiB control frame
// failed). The source must really run again, stay running (a CRIU left
// behind would freeze it again when it ends), answer its clients, and the
// report must say so.
func TestFrozenRootfsFailureResumesSource(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	for _, mode := range []string{engine.ModeCold, engine.ModePostcopy} {
		t.Run(mode, func(t *testing.T) {
			name := "rootfs-fail-" + mode
			p := startMemhog(t, l, bin, name)
			t.Cleanup(func() {
				_ = l.Hosts[0].Runc().Delete(context.Background(), name)
				_ = os.RemoveAll(l.Hosts[0].BundleDir(name))
			})
			rep, err := agent.Migrate(context.Background(), l.Hosts[0].ControlSock,
				engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: mode, Faults: []string{"rootfs-final"}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK || !strings.Contains(rep.FailedAt, "rootfs") || rep.SourceState != "resumed" {
				t.Errorf("report: ok=%v failed at %q source %q: %s", rep.OK, rep.FailedAt, rep.SourceState, rep.Error)
			}
			// Still running seconds later: nothing froze it again.
			for i := 0; i < 3; i++ {
				if got := status(t, &l.Hosts[0], name); got != "running" {
					t.Fatalf("source container is %s %d s after the report said resumed", got, i)
				}
				time.Sleep(time.Second)
			}
			pr, perr := p.Stop()
			if perr != nil || !pr.StateOK {
				t.Fatalf("workload after the resume: %+v %v", pr, perr)
			}
			if pr.ClientDowntimeMs > 5000 {
				t.Errorf("the workload was silent %.0f ms: it did not run after the resume", pr.ClientDowntimeMs)
			}
			if got := status(t, &l.Hosts[1], name); got != "absent" {
				t.Errorf("destination kept a container: %s", got)
			}
		})
	}
}

// TestDestinationAgentDiesAfterRestore: the destination agent is killed
// with the container restored there, before it could say so. The source
// cannot know whether the container runs at the destination: it must not
// resume its copy (that ran the container twice), and the report must say
// the source copy stays frozen.
func TestDestinationAgentDiesAfterRestore(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	const name = "hog-dies"
	p := startMemhog(t, l, bin, name)
	defer p.Stop()
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	rep, err := agent.Migrate(context.Background(), l.Hosts[0].ControlSock,
		engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold, Faults: []string{"kill-agent-after-restore"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.SourceState != "frozen" || !strings.Contains(rep.Error, "may run the container") {
		t.Errorf("report: ok=%v source %q at %q: %s", rep.OK, rep.SourceState, rep.FailedAt, rep.Error)
	}
	for i := 0; i < 3; i++ {
		src, dst := status(t, &l.Hosts[0], name), status(t, &l.Hosts[1], name)
		if src == "running" && dst == "running" {
			t.Fatalf("the container runs on both hosts")
		}
		if src != "paused" {
			t.Errorf("source copy is %s, want paused (frozen, in doubt)", src)
		}
		time.Sleep(time.Second)
	}
}

package e2e

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/lazyrelay"
	"github.com/ferry-migrate/ferry/internal/procs"
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
			rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
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

// waitStates polls both hosts until the container is as wanted there.
func waitStates(t *testing.T, l *lab.Lab, name, src, dst string, within time.Duration) {
	t.Helper()
	var s, d string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		s, d = status(t, &l.Hosts[0], name), status(t, &l.Hosts[1], name)
		if s == "running" && d == "running" {
			t.Fatalf("the container runs on both hosts")
		}
		if s == src && d == dst {
			return
		}
	}
	t.Fatalf("after %v the container is %s at the source and %s at the destination, want %s and %s", within, s, d, src, dst)
}

// TestDestinationAgentDiesAfterRestore: the destination agent is killed
// with the container restored there, before it could say so. The source
// cannot know whether the container runs at the destination: it must not
// resume its copy (that ran the container twice) and the report says the
// source copy stays frozen. The destination's copy was restored stopped
// (runc: CRIU's leave-stopped, until the commit), so it never ran: once
// the destination's agent is back it removes it, and the source, which
// kept asking, resumes its own. Nothing is rolled back: memhog's counter
// never goes backwards.
func TestDestinationAgentDiesAfterRestore(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	const name = "hog-dies"
	p := startMemhog(t, l, bin, name)
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
		engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold, Faults: []string{"kill-destination@restore"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.SourceState != "frozen" || !strings.Contains(rep.Error, "may run the container") {
		t.Errorf("report: ok=%v source %q at %q: %s", rep.OK, rep.SourceState, rep.FailedAt, rep.Error)
	}
	// The destination's agent is gone: nothing can be known, nothing runs twice.
	for i := 0; i < 3; i++ {
		waitStates(t, l, name, "paused", "running", 2*time.Second)
		time.Sleep(time.Second)
	}
	if err := l.RestartAgent(context.Background(), "h2"); err != nil {
		t.Fatal(err)
	}
	waitStates(t, l, name, "running", "absent", 30*time.Second)
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload after recovery: %+v %v", pr, perr)
	}
}

// TestSourceChecksTheDestinationsName: --to NAME@ADDR reaches the agent at
// ADDR only if its certificate names NAME; anything else is refused before
// a byte of the container moves, and the container runs on here.
func TestSourceChecksTheDestinationsName(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	const name = "hog-named"
	p := startMemhog(t, l, bin, name)
	defer p.Stop()
	t.Cleanup(func() { _ = l.Hosts[0].Runc().Delete(context.Background(), name) })
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
		engine.Request{Container: name, To: "h3@" + l.Hosts[1].AgentAddr, Mode: engine.ModeCold}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !strings.Contains(rep.FailedAt, "connect") || !strings.Contains(rep.Error, `"h3"`) || rep.SourceState != "" {
		t.Errorf("report: ok=%v at %q source %q: %s", rep.OK, rep.FailedAt, rep.SourceState, rep.Error)
	}
	if got := status(t, &l.Hosts[0], name); got != "running" {
		t.Errorf("source container is %s", got)
	}
	rep, err = client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
		engine.Request{Container: name, To: "h2@" + l.Hosts[1].AgentAddr, Mode: engine.ModeCold}, nil)
	if err != nil || !rep.OK {
		t.Fatalf("the right name refused: %v %s", err, rep.Error)
	}
	for _, w := range rep.Warnings {
		if strings.Contains(w, "not named") {
			t.Errorf("a named destination still warned: %s", w)
		}
	}
	t.Cleanup(func() { _ = l.Hosts[1].Runc().Delete(context.Background(), name) })
}

// TestSIGTERMDrains: SIGTERM to the source agent during pre-copy's rounds
// cancels the migration before anything is frozen, the report reaches the
// CLI, and the agent exits with the container running where it was.
func TestSIGTERMDrains(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upShapedLab(t, bin, 100_000_000) // 64 MiB take ~5 s a round
	const name = "hog-term"
	p := startMemhog(t, l, bin, name)
	t.Cleanup(func() { _ = l.Hosts[0].Runc().Delete(context.Background(), name) })
	pid := l.Hosts[0].AgentPID
	go func() {
		time.Sleep(time.Second)
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}()
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
		engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModePrecopy}, nil)
	if err != nil {
		t.Fatalf("the stopping agent sent no report: %v", err)
	}
	// Cancelled in the rounds (never frozen) or after the freeze (resumed).
	if rep.OK || !strings.Contains(rep.Error, "cancelled") || (rep.SourceState != "" && rep.SourceState != "resumed") {
		t.Errorf("report: ok=%v source %q at %q: %s", rep.OK, rep.SourceState, rep.FailedAt, rep.Error)
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent did not exit after SIGTERM")
		}
	}
	waitStates(t, l, name, "running", "absent", 5*time.Second)
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload after the drain: %+v %v", pr, perr)
	}
}

// TestPostcopyDestinationAgentDiesMidPull: the destination's agent is
// SIGKILLed while its lazy-pages daemon pulls memory. The pull pauses: the
// daemon does not take that for its page server closing (if it exited,
// the kernel would fill the copy's missing pages with zeros), its relay
// keeps the requests the agent had not answered, and the copy's faults
// wait. Once the agent is back it takes the pull over, the source (which
// kept its page server) asks it to go on, and the migration completes:
// the container runs once, at the destination, its memory whole.
func TestPostcopyDestinationAgentDiesMidPull(t *testing.T) {
	const name = "hog-pull-dies"
	l, p := slowPullLab(t, name)
	defer p.Stop()
	done := migrateAsync(l, engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModePostcopy, Faults: []string{"kill-destination@lazy-pages"}})
	// The fault kills the agent once the pull has begun.
	for deadline := time.Now().Add(60 * time.Second); agentAlive(l.Hosts[1].AgentPID); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the destination agent was not killed mid-pull")
		}
	}
	for i := 0; i < 3; i++ {
		if lazyDaemons() == 0 {
			t.Fatalf("%d s after its agent died, the destination's lazy-pages daemon is gone: its copy's missing pages read as zeros", i)
		}
		time.Sleep(time.Second)
	}
	if err := l.RestartAgent(context.Background(), "h2"); err != nil {
		t.Fatal(err)
	}
	var r migrated
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the migration did not end within 2 minutes of the restart")
	}
	if r.err != nil || !r.rep.OK || r.rep.SourceState != "removed" {
		t.Fatalf("report: ok=%v source %q at %q: %s %v", r.rep.OK, r.rep.SourceState, r.rep.FailedAt, r.rep.Error, r.err)
	}
	if !slices.ContainsFunc(r.rep.Warnings, func(w string) bool { return strings.Contains(w, "restarted during the pull") }) {
		t.Errorf("the report does not say the pull went on after a restart: %q", r.rep.Warnings)
	}
	t.Logf("pages faulted %d, pushed %d; total %.0f ms", r.rep.PagesFaulted, r.rep.PagesPushed, r.rep.TotalMs)
	waitStates(t, l, name, "absent", "running", 30*time.Second)
	if n := lazyDaemons(); n != 0 {
		t.Errorf("%d lazy-pages daemons outlived the pull", n)
	}
	if pids := relays(); len(pids) != 0 {
		t.Errorf("lazy-pages relays outlived the pull: %v", pids)
	}
	if pr, err := p.Stop(); err != nil || !pr.StateOK {
		t.Fatalf("workload after the pull went on: %+v %v", pr, err)
	}
}

// TestPostcopySourceAgentDiesMidPull: the source's agent is SIGKILLed
// while the destination's copy pulls its memory. CRIU's page server, which
// serves one connection in its life, is held by the dump's page keeper, not
// by the agent: it does not end with it, and the copy's faults wait. The
// destination, having lost its source, keeps the pull for it; the
// restarted source agent finds the keeper in its journal and serves the
// rest, then removes its copy: the container runs once, at the
// destination, its memory whole, and ferry ps --all says how it ended.
func TestPostcopySourceAgentDiesMidPull(t *testing.T) {
	const name = "hog-src-dies"
	const id = "5c0dd1e5feed"
	l, p := slowPullLab(t, name)
	defer p.Stop()
	done := migrateAsync(l, engine.Request{ID: id, Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModePostcopy, Faults: []string{"kill-source@lazy-pages"}})
	for deadline := time.Now().Add(60 * time.Second); agentAlive(l.Hosts[0].AgentPID); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the source agent was not killed mid-pull")
		}
	}
	if r := <-done; r.err == nil {
		t.Fatalf("a report came from a dead agent: %+v", r.rep)
	}
	for i := 0; i < 3; i++ {
		if len(keepers()) == 0 {
			t.Fatalf("%d s after its agent died, the source's page keeper is gone: the pull cannot go on", i)
		}
		if lazyDaemons() == 0 {
			t.Fatalf("%d s after the source's agent died, the destination's lazy-pages daemon is gone", i)
		}
		time.Sleep(time.Second)
	}
	if err := l.RestartAgent(context.Background(), "h1"); err != nil {
		t.Fatal(err)
	}
	waitStates(t, l, name, "absent", "running", 2*time.Minute)
	if pr, err := p.Stop(); err != nil || !pr.StateOK {
		t.Fatalf("workload after the pull went on: %+v %v", pr, err)
	}
	checkSettledJob(t, client.Socket(l.Hosts[0].ControlSock), id, journal.Removed)
	if n := lazyDaemons(); n != 0 {
		t.Errorf("%d lazy-pages daemons outlived the pull", n)
	}
	if pids := append(relays(), keepers()...); len(pids) != 0 {
		t.Errorf("relays or keepers outlived the pull: %v", pids)
	}
}

// keepers lists the host's ferry page-keeper processes.
func keepers() []int { return ferryRunning(lazyrelay.KeeperCommand) }

// migrated is a migration's outcome as the CLI's call returned it.
type migrated struct {
	rep engine.Report
	err error
}

// migrateAsync asks h1's agent for req and returns at once; the outcome
// comes on the channel.
func migrateAsync(l *lab.Lab, req engine.Request) <-chan migrated {
	done := make(chan migrated, 1)
	go func() {
		rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), req, nil)
		done <- migrated{rep, err}
	}()
	return done
}

// agentAlive says whether pid runs (a killed agent the lab has not yet
// reaped is a zombie).
func agentAlive(pid int) bool {
	st, ok := procs.State(pid)
	return ok && st != 'Z'
}

// relays lists the host's ferry lazy-relay processes.
func relays() []int { return ferryRunning(lazyrelay.Command) }

// ferryRunning lists the host's ferry processes running subcommand cmd.
func ferryRunning(cmd string) []int {
	var pids []int
	for _, pid := range procs.Named("ferry") {
		if procs.CmdlineHas(pid, cmd) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// slowPullLab brings up a lab whose link takes ~5 s to carry memhog's 64
// MiB and starts memhog as name on h1, removed from both hosts at the end.
func slowPullLab(t *testing.T, name string) (*lab.Lab, *bench.ProbeProc) {
	t.Helper()
	requireLab(t)
	bin := ferryBin(t)
	l := upShapedLab(t, bin, 100_000_000)
	p := startMemhog(t, l, bin, name)
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	return l, p
}

// lazyDaemons counts the host's `criu lazy-pages` processes.
func lazyDaemons() int {
	n := 0
	for _, pid := range procs.Named("criu") {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.Contains(string(b), "lazy-pages") {
			n++
		}
	}
	return n
}

// TestPostcopyAgentHoldsFaults: while post-copy pulls, the destination's
// agent holds a copy of each userfaultfd of the restored copy, so that the
// lazy-pages daemon dying (the OOM killer, a kill) leaves the copy's faults
// waiting instead of filled with zeros; it lets go once every page is in.
func TestPostcopyAgentHoldsFaults(t *testing.T) {
	const name = "hog-held"
	l, p := slowPullLab(t, name)
	defer p.Stop()
	done := migrateAsync(l, engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModePostcopy})
	most := 0
	var r migrated
wait:
	for {
		select {
		case r = <-done:
			break wait
		case <-time.After(20 * time.Millisecond):
			most = max(most, userfaultfds(l.Hosts[1].AgentPID))
		}
	}
	if r.err != nil || !r.rep.OK {
		t.Fatalf("migration: %v %s", r.err, r.rep.Error)
	}
	if most == 0 {
		t.Error("the destination agent never held the restored copy's userfaultfds during the pull")
	}
	if n := userfaultfds(l.Hosts[1].AgentPID); n != 0 {
		t.Errorf("the destination agent still holds %d userfaultfds after the pull", n)
	}
	if pr, err := p.Stop(); err != nil || !pr.StateOK {
		t.Fatalf("workload: %+v %v", pr, err)
	}
}

// userfaultfds counts a process's userfaultfd descriptors.
func userfaultfds(pid int) int {
	n := 0
	for _, l := range procs.OpenFiles(pid) {
		if l == "anon_inode:[userfaultfd]" {
			n++
		}
	}
	return n
}

// Package e2e runs whole migrations with the real thing: a lab of network
// namespaces, ferry agents as separate processes, runc and CRIU.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/filelock"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/units"
)

const (
	memhogPort    = "7000"
	memhogPortNum = 7000
)

// TestMain points the ferry commands the tests run at the lab's hosts by
// name (ferry migrate --from h1): ferry reads the lab's state file only
// when $FERRY_HOSTS names it.
func TestMain(m *testing.M) {
	if os.Getenv("FERRY_HOSTS") == "" {
		os.Setenv("FERRY_HOSTS", lab.StateFile)
	}
	os.Exit(m.Run())
}

// ferryBin returns a ferry binary with memhog and ferry-lab (whose
// lab-tool the lab runs) beside it: FERRY_BIN (set by `make test`, with
// FERRY_LAB_BIN) or ones built for this test run.
func ferryBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("FERRY_BIN"); b != "" {
		return b
	}
	dir := t.TempDir()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]string{{"-o", filepath.Join(dir, "ferry"), "./cmd/ferry"}, {"-o", filepath.Join(dir, "ferry-lab"), "./cmd/ferry-lab"}, {"-o", filepath.Join(dir, "memhog"), "./workloads/memhog"}} {
		cmd := exec.Command("go", append([]string{"build"}, b...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
	}
	return filepath.Join(dir, "ferry")
}

func requireLab(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
	testroot.Require(t, "integration test: needs root for namespaces, runc and CRIU")
	for _, tool := range []string{"criu", "runc", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("integration test: %s not installed (run `make setup`)", tool)
		}
	}
}

// upLab brings up a 3-host lab (h1 source, h2 destination, h3 client) and
// tears it down when the test ends, pass or fail.
func upLab(t *testing.T, bin string) *lab.Lab { return upShapedLab(t, bin, 0) }

// upShapedLab is upLab with links shaped to bps (0: unshaped).
func upShapedLab(t *testing.T, bin string, bps int64) *lab.Lab {
	return upLabWith(t, lab.Options{Hosts: 3, FerryBin: bin, BandwidthBps: bps})
}

// upLabWith brings up the lab o describes, torn down when the test ends.
func upLabWith(t *testing.T, o lab.Options) *lab.Lab {
	t.Helper()
	ctx := context.Background()
	if err := lab.Down(ctx); err != nil {
		t.Fatalf("clearing an old lab: %v", err)
	}
	l, err := lab.Up(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// benchMigrate runs `ferry-lab bench migrate` (which brings up a lab of its
// own) with this build's binaries, clearing an old lab first and the lab
// afterwards, pass or fail.
func benchMigrate(t *testing.T, o bench.MigrateOptions) bench.MigrateResult {
	t.Helper()
	requireLab(t)
	o.FerryBin = ferryBin(t)
	if err := lab.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lab.Down(context.Background()) })
	res, err := bench.Migrate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// startMemhog runs memhog on h1 and a probe on h3, returning the probe once
// the memory is filled.
func startMemhog(t *testing.T, l *lab.Lab, bin, name string) *bench.ProbeProc {
	t.Helper()
	return startWorkload(t, l, bin, name, "64M", "200")
}

// startWorkload is startMemhog with a memory size and dirty rate.
func startWorkload(t *testing.T, l *lab.Lab, bin, name, memory, dirtyRate string, extra ...string) *bench.ProbeProc {
	t.Helper()
	ctx := context.Background()
	args := append([]string{"/bin/memhog", "--memory", memory, "--dirty-rate", dirtyRate, "--port", memhogPort}, extra...)
	if err := l.Run(ctx, "h1", name, args); err != nil {
		t.Fatal(err)
	}
	p, st, err := bench.StartProbe(ctx, &l.Hosts[2], bin,
		[]string{l.Hosts[0].Addr + ":" + memhogPort, l.Hosts[1].Addr + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := units.ParseBytes(memory); int64(st.MemoryBytes) != want {
		t.Fatalf("memhog holds %d bytes, want %s", st.MemoryBytes, memory)
	}
	time.Sleep(200 * time.Millisecond)
	return p
}

func status(t *testing.T, h *lab.Host, name string) string {
	t.Helper()
	st, err := h.Runc().State(context.Background(), name)
	if errors.Is(err, runc.ErrNotFound) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.Status
}

func TestColdMigration(t *testing.T) { testMigration(t, engine.ModeCold) }

func TestPostcopyMigration(t *testing.T) {
	rep := testMigration(t, engine.ModePostcopy)
	// This container shares its lab host's network namespace, so CRIU's
	// lazy page server could not be hidden in a private one: the report
	// must say so (TestKeepsAddressAndConnections covers the private one).
	said := false
	for _, w := range rep.Warnings {
		said = said || strings.Contains(w, "page server listened on the host's loopback")
	}
	if !said {
		t.Errorf("the report does not say the page server was on the host's loopback: %q", rep.Warnings)
	}
	// The push brought the memory: the daemon's background requests were
	// answered at the destination, not one by one from the source.
	if rep.PagesReferenced == 0 {
		t.Errorf("no page was served from the pushed copy (faulted %d, pushed %d)", rep.PagesFaulted, rep.PagesPushed)
	}
	// memhog writes all the time: what it wrote while its root filesystem
	// synced came beside the dump, and the restore wrote it (the state
	// check found it right).
	if rep.PagesLastWritten == 0 {
		t.Error("the restore wrote none of the container's last writes")
	}
}

// TestPrecopyMigration runs content-based pre-copy with each switchover:
// rebuild (memory-less dump, frozen last round, images completed at the
// destination) and dump (a full dump referring to the pages sent before).
func TestPrecopyMigration(t *testing.T) {
	t.Run("rebuild", func(t *testing.T) {
		rep := testMigrationWith(t, engine.Request{Mode: engine.ModePrecopy, Precopy: engine.PrecopyOptions{Switchover: engine.SwitchoverRebuild}})
		if len(rep.Rounds) < 2 || !rep.Rounds[len(rep.Rounds)-1].Final {
			t.Errorf("pre-copy rounds: %+v", rep.Rounds)
		}
		// memhog's 64 MiB come from the destination's copy, not the source.
		if rep.PagesReferenced < 64<<20/4096 || rep.PagesFetched > rep.PagesReferenced/10 || rep.FillMs <= 0 {
			t.Errorf("images completed with %d pages held, %d fetched, in %.0f ms", rep.PagesReferenced, rep.PagesFetched, rep.FillMs)
		}
		// The restore left the memory to a lazy-pages daemon reading those
		// images (most of their pages in the rounds' parent image); the
		// workload's digest above says every page arrived.
		if !rep.RestoreFromOwnImages {
			t.Error("the destination copied the memory in at the restore: runc restores lazily here")
		}
	})
	// Pages the destination lacks at the switchover come from the source's
	// CRIU page server, through the session (a test fault drops every 16th
	// page the rounds brought).
	t.Run("rebuild fetching", func(t *testing.T) {
		rep := testMigrationWith(t, engine.Request{Mode: engine.ModePrecopy, Faults: []string{"forget-pages"},
			Precopy: engine.PrecopyOptions{Switchover: engine.SwitchoverRebuild}})
		if rep.PagesFetched < 64<<20/4096/20 {
			t.Errorf("only %d pages fetched from the source", rep.PagesFetched)
		}
	})
	// Every round reads and hashes all memory, as where the kernel cannot
	// track writes.
	t.Run("rebuild without write tracking", func(t *testing.T) {
		rep := testMigrationWith(t, engine.Request{Mode: engine.ModePrecopy,
			Precopy: engine.PrecopyOptions{Switchover: engine.SwitchoverRebuild, WriteTracking: engine.TrackingOff}})
		for _, r := range rep.Rounds {
			if r.UnchangedPages != 0 {
				t.Errorf("round %d skipped %d pages with tracking off", r.Index, r.UnchangedPages)
			}
		}
	})
	t.Run("dump", func(t *testing.T) {
		rep := testMigrationWith(t, engine.Request{Mode: engine.ModePrecopy, Precopy: engine.PrecopyOptions{Switchover: engine.SwitchoverDump}})
		if len(rep.Rounds) < 2 || rep.PagesReferenced < 64<<20/4096 {
			t.Errorf("pre-copy ran %d rounds and the final dump reused %d pages", len(rep.Rounds), rep.PagesReferenced)
		}
	})
}

// TestPrecopyNative runs CRIU's own pre-dump chain, which needs the kernel's
// soft-dirty tracking; where it is missing the content-based engine above
// is the one tested, and this test says why it skipped.
func TestPrecopyNative(t *testing.T) {
	requireLab(t)
	if f := criu.ProbeFeatures(context.Background()); !f.DirtyTracking {
		t.Skip("kernel without soft-dirty page tracking (CONFIG_MEM_SOFT_DIRTY is off): CRIU pre-dump cannot run here; content-based pre-copy is tested instead")
	}
	bin := ferryBin(t)
	l := upLab(t, bin)
	p := startMemhog(t, l, bin, "hog")
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr,
		Mode: engine.ModePrecopy, Precopy: engine.PrecopyOptions{Engine: engine.PrecopyNative}}, nil)
	time.Sleep(200 * time.Millisecond)
	pr, perr := p.Stop()
	if err != nil || !rep.OK {
		t.Fatalf("native pre-copy: %v %s", err, rep.Error)
	}
	if perr != nil || !pr.StateOK || len(rep.Rounds) < 1 {
		t.Fatalf("state %+v %v, rounds %d", pr, perr, len(rep.Rounds))
	}
}

func TestHybridMigration(t *testing.T) {
	rep := testMigration(t, engine.ModeHybrid)
	if len(rep.Rounds) < 2 || !rep.Rounds[len(rep.Rounds)-1].Final {
		t.Errorf("hybrid rounds: %+v", rep.Rounds)
	}
	// Nearly every page should come from the destination's own copy.
	if rep.PagesReferenced < (rep.PagesFaulted+rep.PagesPushed)*9/10 {
		t.Errorf("only %d of %d pages came from the destination's copy", rep.PagesReferenced, rep.PagesFaulted+rep.PagesPushed)
	}
	// memhog writes all the time: the restore wrote its last writes into
	// the copy itself (and the state check above found them right).
	if rep.PagesLastWritten == 0 {
		t.Error("the restore wrote none of the container's last writes")
	}
}

// TestAutoMode measures, plans and runs the recommended technique, and
// refuses, with nothing frozen, when no technique fits the budget.
func TestAutoMode(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	p := startMemhog(t, l, bin, "hog")
	defer p.Stop()
	ctx := context.Background()
	rep, err := client.Migrate(ctx, client.Socket(l.Hosts[0].ControlSock), engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr,
		Mode: engine.ModeAuto, Precopy: engine.PrecopyOptions{MaxDowntime: time.Millisecond}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !strings.Contains(rep.Error, "no technique fits") || rep.FrozenMs != 0 {
		t.Fatalf("a 1 ms budget was not refused cleanly: %+v", rep)
	}
	if got := status(t, &l.Hosts[0], "hog"); got != "running" {
		t.Fatalf("source container is %s after a refused plan", got)
	}
	rep, err = client.Migrate(ctx, client.Socket(l.Hosts[0].ControlSock), engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr,
		Mode: engine.ModeAuto, Precopy: engine.PrecopyOptions{MaxDowntime: 2 * time.Second}}, nil)
	if err != nil || !rep.OK {
		t.Fatalf("auto migration: %v %s", err, rep.Error)
	}
	if rep.Auto == nil || rep.Auto.Chosen == "" || rep.Auto.MemoryBytes < 64<<20 || rep.Auto.ThroughputBps <= 0 {
		t.Fatalf("auto did not record its measurements: %+v", rep.Auto)
	}
	if got := status(t, &l.Hosts[1], "hog"); got != "running" {
		t.Fatalf("destination container is %s", got)
	}
	t.Logf("auto chose %s: %s (measured %.0f pages/s, %.0f Mbit/s)", rep.Auto.Chosen, rep.Auto.Reason, rep.Auto.DirtyRate, rep.Auto.ThroughputBps/1e6)
}

// TestPrecopyNonConvergent dirties memory far faster than a 64 Mbit/s link
// carries: the rounds must be found not to converge, the migration must
// still end within --max-rounds with the workload intact, and with
// auto-converge the container's CPU gets throttled.
func TestPrecopyNonConvergent(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	for _, auto := range []bool{false, true} {
		t.Run(fmt.Sprintf("auto-converge=%v", auto), func(t *testing.T) {
			l := upShapedLab(t, bin, 64_000_000)
			p := startWorkload(t, l, bin, "hog", "16M", "6000", "--dirty-words", "512")
			opts := engine.PrecopyOptions{MaxRounds: 5, AutoConverge: auto}
			rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
				engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr, Mode: engine.ModePrecopy, Precopy: opts}, nil)
			time.Sleep(200 * time.Millisecond)
			pr, perr := p.Stop()
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK {
				t.Fatalf("migration failed: %s", rep.Error)
			}
			if perr != nil || !pr.StateOK {
				t.Fatalf("workload state: %+v %v", pr, perr)
			}
			// The rebuild switchover's frozen last round is not a live round.
			live := 0
			for _, r := range rep.Rounds {
				if !r.Final {
					live++
				}
			}
			if live > opts.MaxRounds {
				t.Errorf("%d live rounds, more than --max-rounds %d", live, opts.MaxRounds)
			}
			if auto {
				if rep.ThrottlePct == 0 {
					t.Errorf("auto-converge never throttled: %+v", rep.Rounds)
				}
				// CRIU restores the cgroup's settings: the destination lifts
				// the throttle the source's last round left in them.
				if st, err := l.Hosts[1].Runc().State(context.Background(), "hog"); err != nil {
					t.Errorf("the container at the destination: %v", err)
				} else if cpu, err := cgroups.CPUOf(st.Pid); err != nil {
					t.Errorf("the container's cgroup at the destination: %v", err)
				} else if b, err := cpu.Get(); err != nil || b.QuotaUs != -1 {
					t.Errorf("the container's CPU limit at the destination is %+v (%v), want none", b, err)
				}
			} else if !strings.Contains(rep.StopReason, "at or above what the link carries") {
				t.Errorf("stop reason %q does not say the rounds did not converge", rep.StopReason)
			}
			for _, r := range rep.Rounds {
				t.Logf("round %d: %d bytes, %d pages, %.0f ms, dirty %.0f pages/s, throttle %d%%, final %v", r.Index, r.Bytes, r.Pages, r.DurationMs, r.DirtyRate, r.ThrottlePct, r.Final)
			}
			t.Logf("stop: %s; downtime %.0f ms", rep.StopReason, rep.DowntimeMs)
		})
	}
}

// testMigration moves memhog from h1 to h2 with a technique and checks the
// workload's state, where it runs and the report.
func testMigration(t *testing.T, mode string) engine.Report {
	return testMigrationWith(t, engine.Request{Mode: mode})
}

// testMigrationWith is testMigration with the request's options.
// checkWriteTracking: where the kernel tracks writes, content pre-copy's
// and hybrid's rounds after the first skip the pages memhog did not write
// (and the workload's state check above proves none it wrote was missed).
func checkWriteTracking(t *testing.T, req engine.Request, rep engine.Report) {
	t.Helper()
	if req.Mode != engine.ModePrecopy && req.Mode != engine.ModeHybrid || req.Precopy.WriteTracking == engine.TrackingOff {
		return
	}
	if err := dirty.Available(); err != nil {
		t.Logf("no write tracking on this kernel (%v): rounds hashed all memory", err)
		return
	}
	if !strings.HasPrefix(rep.WriteTracking, "userfaultfd write protection (1 of 1") {
		t.Errorf("write tracking: %q", rep.WriteTracking)
	}
	var skipped uint64
	for _, r := range rep.Rounds[1:] {
		skipped += r.UnchangedPages
	}
	if len(rep.Rounds) < 2 || skipped < 32<<20/4096 {
		t.Errorf("rounds after the first skipped %d pages (memhog holds 64 MiB and writes few): %+v", skipped, rep.Rounds)
	}
}

func testMigrationWith(t *testing.T, req engine.Request) engine.Report {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	p := startMemhog(t, l, bin, "hog")
	mode := req.Mode
	req.Container, req.To = "hog", l.Hosts[1].AgentAddr
	rssBefore := statusBytes(t, l.Hosts[1].AgentPID, "VmRSS")
	anonBefore := statusBytes(t, l.Hosts[1].AgentPID, "RssAnon")
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), req, nil)
	time.Sleep(200 * time.Millisecond)
	pr, perr := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("migration failed: %s (at %s)", rep.Error, rep.FailedAt)
	}
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload state lost: %+v %v", pr, perr)
	}
	if got := status(t, &l.Hosts[0], "hog"); got != "absent" {
		t.Errorf("source still has the container: %s", got)
	}
	if got := status(t, &l.Hosts[1], "hog"); got != "running" {
		t.Errorf("destination container is %s, want running", got)
	}
	if rep.SourceState != "removed" || rep.DowntimeMs <= 0 || rep.MemoryBytes < 64<<20 || rep.BytesSent < 64<<20 {
		t.Errorf("report: %+v", rep)
	}
	checkWriteTracking(t, req, rep)
	if moved := rep.PagesFaulted + rep.PagesPushed + rep.PagesLastWritten; (mode == engine.ModePostcopy || mode == engine.ModeHybrid) && moved < 64<<20/4096 {
		t.Errorf("post-copy moved %d+%d pages, and the restore %d, memhog alone holds %d", rep.PagesFaulted, rep.PagesPushed, rep.PagesLastWritten, 64<<20/4096)
	}
	// Nothing of the migration's images stays behind on either host (the
	// destination cleans up right after it acknowledged the commit).
	for _, h := range l.Hosts[:2] {
		var left []string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			left, _ = filepath.Glob(filepath.Join(h.WorkDir("*"), "*"))
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("%s kept migration scratch files: %v", h.Name, left)
		}
	}
	if mode == engine.ModePostcopy {
		// Post-copy's destination keeps a pushed page until the daemon has
		// it, not all of the memory beside the restored copy.
		if hwm := statusBytes(t, l.Hosts[1].AgentPID, "VmHWM"); hwm >= rssBefore+48<<20 {
			t.Errorf("the destination's agent held up to %d MiB (%d MiB before) for a 64 MiB container", hwm>>20, rssBefore>>20)
		} else {
			t.Logf("the destination's agent held up to %d MiB (%d MiB before)", hwm>>20, rssBefore>>20)
		}
	}
	// Nor does the destination's agent keep the copy of the memory it held
	// (the rounds, the push, the session's buffers): it gives it back once
	// the migration ends. Every mode comes back to within a few MiB; a
	// rounds channel left open to the end held its 20 MiB buffer past the
	// destination's giving back.
	const held = 12 << 20
	var anon int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		anon = statusBytes(t, l.Hosts[1].AgentPID, "RssAnon")
		if anon < anonBefore+held || time.Now().After(deadline) {
			break
		}
	}
	if anon >= anonBefore+held {
		t.Errorf("the destination's agent holds %d MiB of anonymous memory, %d MiB before the migration of a 64 MiB container", anon>>20, anonBefore>>20)
	}
	t.Logf("%s: downtime %.0f ms, client downtime %.0f ms, total %.0f ms, sent %d", mode, rep.DowntimeMs, pr.ClientDowntimeMs, rep.TotalMs, rep.BytesSent)
	return rep
}

// statusBytes is a size in a process's status file (VmRSS, VmHWM, RssAnon).
func statusBytes(t *testing.T, pid int, key string) int64 {
	t.Helper()
	n, err := procs.StatusBytes(pid, key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMaxBandwidthCapsTheTransfer: on an unshaped lab 64 MiB move in well
// under a second; capped at 100 Mbit/s they cannot take less than ~5.4 s.
// (A functional check with a wide margin, not a performance target.)
func TestMaxBandwidthCapsTheTransfer(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	p := startMemhog(t, l, bin, "hog")
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
		engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold, MaxBandwidthBps: 100_000_000}, nil)
	pr, perr := p.Stop()
	if err != nil || !rep.OK {
		t.Fatalf("capped migration: %v %s", err, rep.Error)
	}
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload state: %+v %v", pr, perr)
	}
	floor := float64(64<<20) * 8 / 100e6 * 1000 * 0.8
	if rep.DowntimeMs < floor {
		t.Errorf("64 MiB capped at 100 Mbit/s moved in %.0f ms, under %.0f ms: the cap was not applied", rep.DowntimeMs, floor)
	}
	t.Logf("capped cold migration: downtime %.0f ms, %d bytes", rep.DowntimeMs, rep.BytesSent)
}

// TestPostcopySourceAgentNeverComesBack kills the source agent while the
// destination still pulls memory, and leaves it dead. The destination
// keeps its copy for the source to come back (its page keeper holds the
// pull), the copy's faults waiting; when the wait runs out it drops the
// copy. The source copy stays frozen all along: the container never runs
// twice. Started again, the source agent finds the destination dropped its
// copy and resumes its own: it runs somewhere again, once.
func TestPostcopySourceAgentNeverComesBack(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	const outage = 3 * time.Second
	l := upLabWith(t, lab.Options{Hosts: 3, FerryBin: bin, BandwidthBps: 20_000_000, OutageTimeout: outage}) // 64 MiB takes ~27 s to pull
	p := startMemhog(t, l, bin, "hog")
	defer p.Stop()
	src, dst := &l.Hosts[0], &l.Hosts[1]
	const id = "dead50c0ffee"
	done := migrateAsync(l, engine.Request{ID: id, Container: "hog", To: dst.AgentAddr, Mode: engine.ModePostcopy})
	deadline := time.Now().Add(30 * time.Second)
	for status(t, dst, "hog") != "running" {
		if time.Now().After(deadline) {
			t.Fatal("the container never ran at the destination")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // well inside the lazy transfer
	if err := syscall.Kill(src.AgentPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err == nil && r.rep.OK {
		t.Fatal("a migration whose source agent died mid-transfer reported success")
	}
	// The destination waits for its source, then drops the copy rather
	// than run it with holes; the source copy never runs meanwhile.
	wait := engine.StrandedPullWait(outage)
	for deadline = time.Now().Add(wait + 30*time.Second); status(t, dst, "hog") != "absent"; time.Sleep(250 * time.Millisecond) {
		if s := status(t, src, "hog"); s == "running" {
			t.Fatalf("the source copy runs beside the destination's (%s)", status(t, dst, "hog"))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the source was lost, the destination still has the container: %s", wait+30*time.Second, status(t, dst, "hog"))
		}
	}
	if s := status(t, src, "hog"); s == "running" {
		t.Fatal("the source copy resumed with no agent to decide it")
	}
	if err := l.RestartAgent(context.Background(), "h1"); err != nil {
		t.Fatal(err)
	}
	waitStates(t, l, "hog", "running", "absent", 30*time.Second)
	checkSettledJob(t, client.Socket(src.ControlSock), id, journal.Resumed)
	if pids := keepers(); len(pids) != 0 {
		t.Errorf("page keepers outlived the pull: %v", pids)
	}
}

// TestFailedRestoreResumesSource makes the destination's restore fail (a
// real CRIU failure: an image is missing) in every technique: the source
// must run the workload again with its state intact, and the destination
// keep nothing.
func TestFailedRestoreResumesSource(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	for _, mode := range []string{engine.ModeCold, engine.ModePrecopy, engine.ModePostcopy, engine.ModeHybrid} {
		t.Run(mode, func(t *testing.T) {
			name := "hog-" + mode
			p := startMemhog(t, l, bin, name)
			t.Cleanup(func() {
				_ = l.Hosts[0].Runc().Delete(context.Background(), name)
				_ = os.RemoveAll(l.Hosts[0].BundleDir(name))
			})
			rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock),
				engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: mode, Faults: []string{"restore-fails@restore"}}, nil)
			time.Sleep(200 * time.Millisecond)
			pr, perr := p.Stop()
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK {
				t.Fatal("migration with a failing restore reported ok")
			}
			if !strings.Contains(rep.FailedAt, "restore") || rep.SourceState != "resumed" {
				t.Errorf("report does not say the restore failed and the source resumed: %+v", rep)
			}
			if got := status(t, &l.Hosts[0], name); got != "running" {
				t.Errorf("source container is %s, want running", got)
			}
			if got := status(t, &l.Hosts[1], name); got != "absent" {
				t.Errorf("destination kept a container: %s", got)
			}
			if _, err := os.Stat(l.Hosts[1].BundleDir(name)); err == nil {
				t.Error("destination kept the bundle")
			}
			if perr != nil || !pr.StateOK {
				t.Fatalf("workload state after resume: %+v %v", pr, perr)
			}
			t.Logf("error reported: %s", rep.Error)
			// Both hosts kept their logs of it, the source where the
			// report says, the destination under its state directory.
			if rep.ID == "" || rep.SchemaVersion != engine.ReportSchemaVersion || rep.StartedAt.IsZero() {
				t.Errorf("report lacks its id, schema version or start: %q %d %v", rep.ID, rep.SchemaVersion, rep.StartedAt)
			}
			if want := filepath.Join(l.Hosts[0].StateDir, "logs", rep.ID); rep.Logs != want {
				t.Errorf("report's logs: %q, want %q", rep.Logs, want)
			}
			for dir, want := range map[string]string{rep.Logs: "dump.log", filepath.Join(l.Hosts[1].StateDir, "logs", rep.ID): "restore.log"} {
				logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
				found := false
				for _, f := range logs {
					found = found || strings.HasSuffix(f, want)
				}
				if !found {
					t.Errorf("%s holds %v, no %s", dir, logs, want)
				}
			}
		})
	}
}

func TestBadInputFreezesNothing(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	p := startMemhog(t, l, bin, "hog")
	defer p.Stop()
	ctx := context.Background()
	src := client.Socket(l.Hosts[0].ControlSock)

	// A destination whose CRIU is Debian 12's 3.17, which cannot work on
	// this kernel: a fourth agent in h2 sees a criu that reports that.
	fake := t.TempDir()
	script := "#!/bin/sh\necho 'Version: 3.17.1'\nexit 0\n"
	if err := os.WriteFile(filepath.Join(fake, "criu"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	oldAddr := l.Hosts[1].Addr + ":7071"
	cmd := l.Hosts[1].Command(ctx, bin, "agent", "--name", "h2", "--listen", oldAddr, "--control", "",
		"--state", filepath.Join(t.TempDir(), "state"), "--tls-dir", l.Hosts[1].TLSDir())
	// FERRY_CRIU names it: ferry prefers its own CRIUs over PATH's.
	cmd.Env = append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"), "FERRY_CRIU="+filepath.Join(fake, "criu"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitListening(t, &l.Hosts[2], bin, oldAddr)

	// A destination whose CRIU is the same release without ferry's patches
	// (setup builds it): a fifth agent in h2.
	stock := filepath.Join(filelock.CacheDir("criu-stock-VERSION"), "criu")
	stockAddr := ""
	if found, _ := filepath.Glob(filepath.Join(filelock.CacheDir("criu-stock-*"), "criu")); len(found) > 0 {
		stock = found[0]
		stockAddr = l.Hosts[1].Addr + ":7072"
		cmd := l.Hosts[1].Command(ctx, bin, "agent", "--name", "h2", "--listen", stockAddr, "--control", "",
			"--state", filepath.Join(t.TempDir(), "state"), "--tls-dir", l.Hosts[1].TLSDir())
		cmd.Env = append(os.Environ(), "FERRY_CRIU="+stock)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitListening(t, &l.Hosts[2], bin, stockAddr)
	}

	cases := []struct {
		name, container, to, want string
	}{
		{"unknown container", "nope", l.Hosts[1].AgentAddr, `no container "nope"`},
		{"unreachable destination", "hog", "10.77.0.99:7070", "cannot reach"},
		{"destination without a working CRIU", "hog", oldAddr, "3.17.1"},
		{"destination whose CRIU lacks ferry's patches", "hog", stockAddr, "lacks ferry's CRIU patches"},
		{"unknown mode", "hog", l.Hosts[1].AgentAddr, "unknown mode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.to == "" {
				t.Skipf("no stock CRIU at %s (scripts/setup.sh builds it)", stock)
			}
			mode := engine.ModeCold
			if c.name == "unknown mode" {
				mode = "teleport"
			}
			rep, err := client.Migrate(ctx, src, engine.Request{Container: c.container, To: c.to, Mode: mode}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK || !strings.Contains(rep.Error, c.want) {
				t.Errorf("got ok=%v error %q, want an error mentioning %q", rep.OK, rep.Error, c.want)
			}
			if rep.SourceState != "" || rep.FrozenMs != 0 {
				t.Errorf("something was frozen: %+v", rep)
			}
			if got := status(t, &l.Hosts[0], "hog"); got != "running" {
				t.Errorf("source container is %s after a refused migration", got)
			}
		})
	}
}

// waitListening waits until an agent accepts connections at addr, probing
// from a lab host (lab addresses exist only in the lab's namespaces).
func waitListening(t *testing.T, from *lab.Host, bin, addr string) {
	t.Helper()
	if err := from.WaitListening(context.Background(), bin, addr, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

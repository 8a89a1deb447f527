package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/probe"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime/lxc"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Podman and LXC containers moved through the agents and the engine, in
// the lab: h1 runs the container in its own Podman instance or lxcpath,
// h3 probes memhog on both hosts' addresses, h2 receives it. Afterwards
// the destination's runtime manages the container (ps, logs, stop, rm;
// lxc-ls, lxc-info, lxc-stop, lxc-destroy) and the source's no longer
// lists it.

const podmanImage = "ferry-e2e-memhog"

func memhogArgs(memory, dirtyRate string) []string {
	return []string{"/bin/memhog", "--memory", memory, "--dirty-rate", dirtyRate, "--port", memhogPort}
}

// startProbe probes memhog at h1's and h2's addresses from h3, once its
// memory is filled.
func startProbe(t *testing.T, l *lab.Lab, bin, memory string) *bench.ProbeProc {
	t.Helper()
	p, st, err := bench.StartProbe(context.Background(), &l.Hosts[2], bin,
		[]string{l.Hosts[0].Addr + ":" + memhogPort, l.Hosts[1].Addr + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := units.ParseBytes(memory); int64(st.MemoryBytes) != want {
		p.Stop()
		t.Fatalf("memhog holds %d bytes, want %s", st.MemoryBytes, memory)
	}
	time.Sleep(200 * time.Millisecond)
	return p
}

// migrate asks h1's agent to move name to h2, then stops the probe.
func migrate(t *testing.T, l *lab.Lab, p *bench.ProbeProc, req engine.Request) (engine.Report, probe.Result, error) {
	t.Helper()
	req.To = l.Hosts[1].AgentAddr
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	pr, perr := p.Stop()
	return rep, pr, perr
}

// destinationDiesAfterRestore moves name (64 MiB memhog, probed by p)
// with h2's agent SIGKILLed once the copy is restored there, before the
// commit. state reads a host's runtime in its own words ("absent" when it
// has no such container), which are w.frozen for the frozen source,
// w.held for the copy restored at h2 and w.running; held checks that h2's
// copy does not run. Until h2's agent is back the source stays frozen;
// then h2's copy is dropped and the source resumes its own, its memory
// intact.
func destinationDiesAfterRestore(t *testing.T, l *lab.Lab, p *bench.ProbeProc, name, rt string,
	state func(h *lab.Host) string, w struct{ frozen, held, running string }, held func() error) {
	t.Helper()
	h1, h2 := &l.Hosts[0], &l.Hosts[1]
	rep, err := client.Migrate(context.Background(), client.Socket(h1.ControlSock), engine.Request{Container: name, To: h2.AgentAddr,
		Mode: engine.ModeCold, Runtime: rt, Faults: []string{"kill-destination@restore"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.SourceState != "frozen" || !strings.Contains(rep.Error, "may run the container") {
		t.Errorf("report: ok=%v source %q at %q: %s", rep.OK, rep.SourceState, rep.FailedAt, rep.Error)
	}
	for i := 0; i < 3; i++ {
		if s, d := state(h1), state(h2); s != w.frozen || d != w.held {
			t.Fatalf("with h2's agent dead: %s on h1, %s on h2; want %s and %s", s, d, w.frozen, w.held)
		}
		if err := held(); err != nil {
			t.Fatalf("h2's uncommitted copy runs: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := l.RestartAgent(context.Background(), h2.Name); err != nil {
		t.Fatal(err)
	}
	var s, d string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if s, d = state(h1), state(h2); s == w.running && d == "absent" {
			break
		}
		if s == w.running && d == w.running {
			if err := held(); err != nil && state(h2) == w.running {
				t.Fatalf("the container runs on both hosts: %v", err)
			}
		}
	}
	if s != w.running || d != "absent" {
		t.Fatalf("30 s after h2's agent came back: %s on h1, %s on h2; want %s and absent", s, d, w.running)
	}
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload after recovery: %+v %v", pr, perr)
	}
	noScratch(t, h2)
}

// ---- Podman ----

func requirePodman(t *testing.T) {
	t.Helper()
	requireLab(t)
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("podman is not installed: the Podman integration tests need it (apt-get install podman)")
	}
}

// pm runs podman in a lab host's instance and returns its stdout.
func pm(ctx context.Context, h *lab.Host, args ...string) (string, error) {
	c := h.Podman().Command(ctx, args...)
	var stdout, stderr strings.Builder
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return stdout.String(), fmt.Errorf("podman %s on %s: %w: %s", strings.Join(args, " "), h.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// podmanImages builds the busybox+memhog rootfs and imports it as the same
// image (same ID) into the Podman instances of hosts.
func podmanImport(t *testing.T, bin string, image string, extra string, hosts ...*lab.Host) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := lab.BuildRootfsFrom(dir, filepath.Dir(bin)); err != nil {
		t.Fatal(err)
	}
	if extra != "" {
		if err := os.WriteFile(filepath.Join(dir, "etc", "ferry-extra"), []byte(extra), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var ids []string
	for _, h := range hosts {
		if err := h.Podman().ImportRootfs(ctx, dir, image); err != nil {
			t.Fatal(err)
		}
		id, err := pm(ctx, h, "image", "inspect", "--format", "{{.Id}}", "localhost/"+image+":latest")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, strings.TrimSpace(id))
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("image %s has IDs %v on the hosts", image, ids)
		}
	}
	return ids[0]
}

// podmanLab is a lab whose h1 and h2 run a Podman each, the workload
// image imported.
func podmanLab(t *testing.T) (bin string, l *lab.Lab, h1, h2 *lab.Host) {
	t.Helper()
	requirePodman(t)
	bin = ferryBin(t)
	l = upLab(t, bin)
	h1, h2 = &l.Hosts[0], &l.Hosts[1]
	podmanImport(t, bin, podmanImage, "", h1, h2)
	return bin, l, h1, h2
}

// podmanRun starts a container on h1's Podman, host network, default
// logging (so podman logs works after the move); it is removed from both
// hosts' instances when the test ends.
func podmanRun(t *testing.T, l *lab.Lab, name, image string, args []string) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_, _ = pm(context.Background(), &h, "rm", "--force", "--ignore", "--time", "0", name)
		}
	})
	full := append([]string{"run", "--detach", "--name", name, "--network", "host",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pull", "never", "localhost/" + image + ":latest"}, args...)
	if _, err := pm(ctx, &l.Hosts[0], full...); err != nil {
		t.Fatal(err)
	}
}

// podmanState is podman inspect's status of name on h, "absent" when
// Podman does not know it.
func podmanState(t *testing.T, h *lab.Host, name string) string {
	t.Helper()
	out, err := pm(context.Background(), h, "container", "inspect", "--format", "{{.State.Status}}", name)
	if err != nil {
		if strings.Contains(err.Error(), "no such container") {
			return "absent"
		}
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// podmanPs lists the running containers of h's instance as NAME:STATE
// (all of them with all).
func podmanPs(t *testing.T, h *lab.Host, all bool) []string {
	t.Helper()
	args := []string{"ps", "--format", "json"}
	if all {
		args = append(args, "--all")
	}
	out, err := pm(context.Background(), h, args...)
	if err != nil {
		t.Fatal(err)
	}
	var ps []struct {
		Names []string
		State string
	}
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatalf("podman ps: %v: %s", err, out)
	}
	var l []string
	for _, c := range ps {
		l = append(l, strings.Join(c.Names, ",")+":"+c.State)
	}
	return l
}

// noScratch checks that the migration left no scratch files on h.
func noScratch(t *testing.T, h *lab.Host) {
	t.Helper()
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

// checkMoved checks a migration's report and the workload's state after it.
func checkMoved(t *testing.T, runtime, mode string, rep engine.Report, pr probe.Result, perr error) {
	t.Helper()
	if !rep.OK {
		t.Fatalf("migration failed: %s (at %s)", rep.Error, rep.FailedAt)
	}
	if mode == engine.ModeAuto {
		// The planner's choice, which the runtime can run.
		if rep.Auto == nil || rep.Auto.Chosen != rep.Mode {
			t.Errorf("mode auto: report mode %q, plan %+v", rep.Mode, rep.Auto)
		}
		mode = rep.Mode
	}
	if rep.Runtime != runtime || rep.SourceState != "removed" || rep.Mode != mode {
		t.Errorf("report: runtime %q, mode %q, source %q", rep.Runtime, rep.Mode, rep.SourceState)
	}
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload state lost: %+v %v", pr, perr)
	}
	if mode == engine.ModePrecopy && (len(rep.Rounds) < 1 || rep.PagesReferenced < 64<<20/4096/2) {
		t.Errorf("pre-copy ran %d rounds, the final dump reused %d pages", len(rep.Rounds), rep.PagesReferenced)
	}
	t.Logf("%s %s: downtime %.0f ms, client downtime %.0f ms, total %.0f ms, sent %d", runtime, mode, rep.DowntimeMs, pr.ClientDowntimeMs, rep.TotalMs, rep.BytesSent)
}

// moveInEachMode moves a fresh 64 MiB memhog of runtime kind (run starts
// it on h1 as name) from h1 to h2 in each technique: cold, pre-copy with
// either switchover, post-copy and hybrid by --runtime kind (the lazy
// ones where CRIU's lazy pages work), cold by --runtime auto; each in a subtest named
// prefix-MODE, the report and the workload checked, then the runtimes'
// own view of both hosts (moved).
func moveInEachMode(t *testing.T, l *lab.Lab, bin, kind, prefix string, run func(t *testing.T, name string), moved func(t *testing.T, name string)) {
	for _, c := range []struct{ name, mode, runtime, switchover string }{
		{"cold", engine.ModeCold, kind, ""},
		{"precopy-rebuild", engine.ModePrecopy, kind, engine.SwitchoverRebuild},
		{"precopy-dump", engine.ModePrecopy, kind, engine.SwitchoverDump},
		{"postcopy", engine.ModePostcopy, kind, ""},
		{"hybrid", engine.ModeHybrid, kind, ""},
		{"mode-auto", engine.ModeAuto, kind, ""},
		{"auto", engine.ModeCold, "", ""}, // --runtime auto (the default)
	} {
		t.Run(c.name, func(t *testing.T) {
			lazy := c.switchover == engine.SwitchoverRebuild || c.mode == engine.ModePostcopy || c.mode == engine.ModeHybrid
			if lazy && !criu.ProbeFeatures(context.Background()).LazyPages {
				t.Skipf("CRIU's lazy pages are unavailable here (see ferry check): no %s", c.name)
			}
			name := prefix + "-" + c.name
			run(t, name)
			p := startProbe(t, l, bin, "64M")
			rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: c.mode, Runtime: c.runtime,
				Precopy: engine.PrecopyOptions{Switchover: c.switchover}})
			checkMoved(t, kind, c.mode, rep, pr, perr)
			// Restored from the destination's own images: pre-copy's
			// rebuild where the runtime restores lazily, and Docker's
			// cold too (its restore would copy the memory twice).
			mode := c.mode
			if mode == engine.ModeAuto {
				mode = rep.Mode
			}
			rebuild := mode == engine.ModePrecopy && c.switchover != engine.SwitchoverDump || kind == "docker" && mode == engine.ModeCold
			if own := rebuild && criu.ProbeFeatures(context.Background()).LazyPages; rep.RestoreFromOwnImages != own {
				t.Errorf("restored from its own images: %v, want %v", rep.RestoreFromOwnImages, own)
			}
			noScratch(t, &l.Hosts[0])
			noScratch(t, &l.Hosts[1])
			moved(t, name)
		})
	}
}

// refusal is a request h1's agent must refuse before anything is frozen,
// its error holding want, at a phase that begins with at.
type refusal struct {
	req      engine.Request
	want, at string
}

// expectRefused sends each request from h1 to h2 and checks that it was
// refused as said with nothing frozen, then (after) that the container
// runs on at h1.
func expectRefused(t *testing.T, l *lab.Lab, cases []refusal, after func()) {
	t.Helper()
	for _, c := range cases {
		c.req.To = l.Hosts[1].AgentAddr
		rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), c.req, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s %s: %s (at %s)", c.req.Mode, c.req.Container, rep.Error, rep.FailedAt)
		if rep.OK || !strings.Contains(rep.Error, c.want) || !strings.HasPrefix(rep.FailedAt, c.at) {
			t.Errorf("%s %s: ok=%v at %q: %s (want %q at %s...)", c.req.Mode, c.req.Container, rep.OK, rep.FailedAt, rep.Error, c.want, c.at)
		}
		if rep.SourceState != "" || rep.FrozenMs != 0 {
			t.Errorf("%s %s: something was frozen: source %q, frozen %.0f ms", c.req.Mode, c.req.Container, rep.SourceState, rep.FrozenMs)
		}
		after()
	}
}

// TestPodmanThroughAgents moves Podman containers from h1's Podman to
// h2's through the agents: cold and pre-copy by --runtime podman, cold by
// --runtime auto; a failing restore; bad input.
func TestPodmanThroughAgents(t *testing.T) {
	bin, l, h1, h2 := podmanLab(t)

	// Pre-copy's rebuild switchover needs only a lazy dump at the source
	// (ferry's runc dump) and a plain restore: Podman gets it where CRIU's
	// lazy dump works; the dump switchover everywhere.
	moveInEachMode(t, l, bin, "podman", "pm",
		func(t *testing.T, name string) { podmanRun(t, l, name, podmanImage, memhogArgs("64M", "200")) },
		func(t *testing.T, name string) {
			// h2's Podman runs it under the same name; h1's has forgotten it.
			if got := podmanPs(t, h2, false); !slices.Equal(got, []string{name + ":running"}) {
				t.Errorf("podman ps on h2: %v, want %s running", got, name)
			}
			if got := podmanPs(t, h1, true); len(got) != 0 {
				t.Errorf("podman ps --all on h1 still lists %v", got)
			}
			ctx := context.Background()
			if _, err := pm(ctx, h2, "logs", name); err != nil {
				t.Errorf("podman logs on h2: %v", err)
			}
			if _, err := pm(ctx, h2, "stop", "--time", "10", name); err != nil {
				t.Fatalf("podman stop on h2: %v", err)
			}
			if st := podmanState(t, h2, name); st != "exited" {
				t.Errorf("after podman stop on h2: %s", st)
			}
			if _, err := pm(ctx, h2, "rm", name); err != nil {
				t.Fatalf("podman rm on h2: %v", err)
			}
			if st := podmanState(t, h2, name); st != "absent" {
				t.Errorf("after podman rm on h2: %s", st)
			}
		})

	t.Run("failed restore", func(t *testing.T) {
		name := "pm-fail"
		podmanRun(t, l, name, podmanImage, memhogArgs("64M", "200"))
		p := startProbe(t, l, bin, "64M")
		pidBefore, _ := pm(context.Background(), h1, "container", "inspect", "--format", "{{.State.Pid}}", name)
		rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "podman", Faults: []string{"restore-fails@restore"}})
		if rep.OK {
			t.Fatal("migration with a failing restore reported ok")
		}
		t.Logf("error reported: %s (at %s)", rep.Error, rep.FailedAt)
		if !strings.Contains(rep.FailedAt, "restore") || rep.SourceState != "resumed" {
			t.Errorf("report does not say the restore failed and the source resumed: at %q, source %q", rep.FailedAt, rep.SourceState)
		}
		if n := strings.Count(rep.Error, "restore on "+h2.Name); n != 1 {
			t.Errorf("the error says %q %d times: %s", "restore on "+h2.Name, n, rep.Error)
		}
		if perr != nil || !pr.StateOK {
			t.Fatalf("workload state after resume: %+v %v", pr, perr)
		}
		ctx := context.Background()
		out, err := pm(ctx, h1, "container", "inspect", "--format", "{{.State.Status}} {{.State.Pid}}", name)
		if err != nil || strings.TrimSpace(out) != "running "+strings.TrimSpace(pidBefore) {
			t.Errorf("podman inspect on h1: %q %v, want running with pid %s", out, err, strings.TrimSpace(pidBefore))
		}
		if got := podmanPs(t, h2, true); len(got) != 0 {
			t.Errorf("h2's Podman kept %v", got)
		}
		// One directory per container (beside containers.json and its lock).
		ents, _ := os.ReadDir(filepath.Join(h2.PodmanDir(), "storage", "overlay-containers"))
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("h2's Podman storage kept container directory %s", e.Name())
			}
		}
		noScratch(t, h2)
		if _, err := pm(ctx, h1, "stop", "--time", "10", name); err != nil {
			t.Fatalf("podman stop on h1 after the failed move: %v", err)
		}
		if st := podmanState(t, h1, name); st != "exited" {
			t.Errorf("after podman stop on h1: %s", st)
		}
	})

	t.Run("destination agent dies after restore", func(t *testing.T) {
		name := "pm-dies"
		podmanRun(t, l, name, podmanImage, memhogArgs("64M", "200"))
		p := startProbe(t, l, bin, "64M")
		state := func(h *lab.Host) string { return podmanState(t, h, name) }
		// Podman says running; CRIU left every process stopped.
		held := func() error {
			out, err := pm(context.Background(), h2, "container", "inspect", "--format", "{{.State.Pid}}", name)
			if err != nil {
				return err
			}
			pid, err := strconv.Atoi(strings.TrimSpace(out))
			if err != nil {
				return err
			}
			for _, q := range append([]int{pid}, procs.Descendants(pid, "")...) {
				if st, ok := procs.State(q); ok && st != 'T' {
					return fmt.Errorf("process %d is in state %c", q, st)
				}
			}
			return nil
		}
		w := struct{ frozen, held, running string }{"paused", "running", "running"}
		destinationDiesAfterRestore(t, l, p, name, "podman", state, w, held)
	})

	t.Run("bad input", func(t *testing.T) {
		// A container whose image only h1 has (another rootfs, another ID).
		podmanImport(t, bin, "ferry-e2e-only-h1", "only on h1\n", h1)
		name := "pm-bad"
		podmanRun(t, l, name, "ferry-e2e-only-h1", memhogArgs("16M", "100"))
		expectRefused(t, l, []refusal{
			{engine.Request{Container: "pm-nosuch", Mode: engine.ModeCold, Runtime: "podman"}, `no container "pm-nosuch"`, "prepare"},
			// CRIU's pre-dump is runc's alone.
			{engine.Request{Container: name, Mode: engine.ModePrecopy, Runtime: "podman", Precopy: engine.PrecopyOptions{Engine: engine.PrecopyNative}}, "native needs CRIU's pre-dump", "prepare"},
			{engine.Request{Container: name, Mode: engine.ModePostcopy, Runtime: "podman"}, "does not have the image", "destination"},
			{engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "podman"}, "does not have the image", "destination"},
		}, func() {
			if st := podmanState(t, h1, name); st != "running" {
				t.Fatalf("after a refused request the container is %s", st)
			}
		})
		if got := podmanPs(t, h2, true); len(got) != 0 {
			t.Errorf("h2's Podman lists %v after refused requests", got)
		}
	})
}

// ---- LXC ----

func requireLXC(t *testing.T) {
	t.Helper()
	requireLab(t)
	for _, tool := range []string{"lxc-start", "lxc-checkpoint", "lxc-info", "lxc-ls", "lxc-stop", "lxc-destroy", "lxc-freeze", "lxc-cgroup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("LXC is not installed (%s not found; apt-get install lxc): the LXC integration tests need it", tool)
		}
	}
}

// lxcIn runs an lxc-* tool for h's lxcpath inside h's network namespace:
// liblxc's command socket is an abstract unix socket, which lives in the
// network namespace of the container's monitor (the agent's, or
// lxc-start's). Output goes to a file: a monitor lxc-start forks keeps it
// open.
func lxcIn(h *lab.Host, tool string, args ...string) (string, error) {
	f, err := os.CreateTemp("", "ferry-e2e-lxc")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	c := exec.Command("nsenter", append([]string{"--net=" + h.NetNS, "--", tool, "-P", h.LXCPath()}, args...)...)
	c.Stdout, c.Stderr = f, f
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = c.Run()
	b, _ := os.ReadFile(f.Name())
	if err != nil {
		return string(b), fmt.Errorf("%s -P %s %s on %s: %w: %s", tool, h.LXCPath(), strings.Join(args, " "), h.Name, err, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}

// lxcState is lxc-info's state of name on h, "absent" when h's lxcpath
// has no such container.
func lxcState(t *testing.T, h *lab.Host, name string) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(h.LXCPath(), name, "config")); err != nil {
		return "absent"
	}
	out, err := lxcIn(h, "lxc-info", "-n", name, "-s", "-H")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// lxcRunning lists h's running containers (lxc-ls --running).
func lxcRunning(t *testing.T, h *lab.Host) []string {
	t.Helper()
	out, err := lxcIn(h, "lxc-ls", "--running", "-1")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(out)
}

// lxcRun writes a busybox+memhog container under h1's lxcpath and starts
// it in h1's network namespace. lxc.net.0.type = none shares the network
// namespace lxc-start runs in, so memhog's port is on h1's address; at the
// destination CRIU, run by h2's agent in h2's namespace, restores it into
// h2's (it does not dump the namespace it shares with CRIU itself).
// lxc.signal.halt = SIGTERM is what memhog, as init, ends on (lxc-stop).
// Removed from both hosts when the test ends.
func lxcRun(t *testing.T, l *lab.Lab, name string, args []string) {
	t.Helper()
	h := &l.Hosts[0]
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			if _, err := os.Stat(filepath.Join(h.LXCPath(), name)); err != nil {
				continue
			}
			_, _ = lxcIn(&h, "lxc-stop", "-n", name, "-k")
			if _, err := lxcIn(&h, "lxc-destroy", "-n", name); err != nil {
				t.Errorf("cleanup: %v", err)
			}
			_ = os.RemoveAll(filepath.Join(h.LXCPath(), name))
		}
		// The v2 cgroup the copy was restored into on this shared kernel.
		if err := lxc.RemoveIdleCgroups(name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := l.RunLXC(context.Background(), h.Name, name, args); err != nil {
		t.Fatal(err)
	}
}

// TestLXCThroughAgents moves LXC containers from h1's lxcpath to h2's
// through the agents in every mode (moveInEachMode); a failing restore;
// bad input.
func TestLXCThroughAgents(t *testing.T) {
	requireLXC(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	h1, h2 := &l.Hosts[0], &l.Hosts[1]

	moveInEachMode(t, l, bin, "lxc", "lx",
		func(t *testing.T, name string) { lxcRun(t, l, name, memhogArgs("64M", "200")) },
		func(t *testing.T, name string) {
			if got := lxcRunning(t, h2); !slices.Contains(got, name) {
				t.Errorf("lxc-ls --running -P %s: %v, no %s", h2.LXCPath(), got, name)
			}
			if st := lxcState(t, h2, name); st != "RUNNING" {
				t.Errorf("lxc-info on h2: %s", st)
			}
			if st := lxcState(t, h1, name); st != "absent" {
				t.Errorf("h1 still has the container: %s", st)
			}
			if out, err := lxcIn(h1, "lxc-ls", "-1"); err != nil || strings.Contains(out, name) {
				t.Errorf("lxc-ls -P %s: %q %v", h1.LXCPath(), out, err)
			}
			if _, err := lxcIn(h2, "lxc-stop", "-n", name, "-t", "10"); err != nil {
				t.Fatalf("lxc-stop on h2: %v", err)
			}
			if st := lxcState(t, h2, name); st != "STOPPED" {
				t.Errorf("after lxc-stop on h2: %s", st)
			}
			if _, err := lxcIn(h2, "lxc-destroy", "-n", name); err != nil {
				t.Fatalf("lxc-destroy on h2: %v", err)
			}
			if st := lxcState(t, h2, name); st != "absent" {
				t.Errorf("after lxc-destroy on h2: %s", st)
			}
		})

	// A writable bind mount of storage both hosts have (an
	// lxc.mount.entry from the lab's shared directory): remounted at h2,
	// not copied, the journal memhog writes there intact.
	t.Run("shared mount entry", func(t *testing.T) {
		name, dir := "lx-shared", filepath.Join(lab.SharedStorage, "lx-shared")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		t.Cleanup(func() {
			for _, h := range l.Hosts[:2] {
				_ = l.RemoveFrom(context.Background(), "lxc", h.Name, name)
			}
		})
		args := append(memhogArgs("64M", "200"), "--journal", "/data/journal", "--journal-rate", "512K")
		if err := l.RunLXC(context.Background(), h1.Name, name, args, lab.Attachments{Shared: dir}); err != nil {
			t.Fatal(err)
		}
		p := startProbe(t, l, bin, "64M")
		rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "lxc"})
		checkMoved(t, "lxc", engine.ModeCold, rep, pr, perr)
		if len(rep.Shared) != 1 || rep.Shared[0].Source != dir || rep.Shared[0].Path != "/data" {
			t.Errorf("report's shared directories: %+v", rep.Shared)
		}
		if st, err := os.Stat(filepath.Join(dir, "journal")); err != nil || st.Size() == 0 || st.Size()%4096 != 0 {
			t.Errorf("the journal on the shared directory: %v %v", st, err)
		}
		if st := lxcState(t, h2, name); st != "RUNNING" {
			t.Errorf("lxc-info on h2: %s", st)
		}
	})

	t.Run("failed restore", func(t *testing.T) {
		name := "lx-fail"
		lxcRun(t, l, name, memhogArgs("64M", "200"))
		p := startProbe(t, l, bin, "64M")
		rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "lxc", Faults: []string{"restore-fails@restore"}})
		if rep.OK {
			t.Fatal("migration with a failing restore reported ok")
		}
		t.Logf("error reported: %s (at %s)", rep.Error, rep.FailedAt)
		if !strings.Contains(rep.FailedAt, "restore") || rep.SourceState != "resumed" {
			t.Errorf("report does not say the restore failed and the source resumed: at %q, source %q", rep.FailedAt, rep.SourceState)
		}
		if n := strings.Count(rep.Error, "restore on "+h2.Name); n != 1 {
			t.Errorf("the error says %q %d times: %s", "restore on "+h2.Name, n, rep.Error)
		}
		if perr != nil || !pr.StateOK {
			t.Fatalf("workload state after resume: %+v %v", pr, perr)
		}
		if st := lxcState(t, h1, name); st != "RUNNING" {
			t.Errorf("lxc-info on h1: %s, want RUNNING", st)
		}
		if st := lxcState(t, h2, name); st != "absent" {
			t.Errorf("h2 kept the container: %s", st)
		}
		if _, err := os.Stat(filepath.Join(h2.LXCPath(), name)); err == nil {
			t.Errorf("h2 kept %s", filepath.Join(h2.LXCPath(), name))
		}
		noScratch(t, h2)
		if _, err := lxcIn(h1, "lxc-stop", "-n", name, "-t", "10"); err != nil {
			t.Fatalf("lxc-stop on h1 after the failed move: %v", err)
		}
		if st := lxcState(t, h1, name); st != "STOPPED" {
			t.Errorf("after lxc-stop on h1: %s", st)
		}
	})

	t.Run("destination agent dies after restore", func(t *testing.T) {
		name := "lx-dies"
		lxcRun(t, l, name, memhogArgs("64M", "200"))
		p := startProbe(t, l, bin, "64M")
		state := func(h *lab.Host) string { return lxcState(t, h, name) }
		// liblxc says FROZEN for h2's copy too: CRIU restored its freezer.
		w := struct{ frozen, held, running string }{"FROZEN", "FROZEN", "RUNNING"}
		held := func() error { return nil }
		destinationDiesAfterRestore(t, l, p, name, "lxc", state, w, held)
	})

	t.Run("bad input", func(t *testing.T) {
		name := "lx-bad"
		lxcRun(t, l, name, memhogArgs("16M", "100"))
		expectRefused(t, l, []refusal{
			{engine.Request{Container: "lx-nosuch", Mode: engine.ModeCold, Runtime: "lxc"}, `no container "lx-nosuch"`, "prepare"},
		}, func() {
			if st := lxcState(t, h1, name); st != "RUNNING" {
				t.Fatalf("after a refused request the container is %s", st)
			}
		})
		if ents, _ := os.ReadDir(h2.LXCPath()); len(ents) > 0 {
			t.Errorf("h2's lxcpath holds %d entries after refused requests", len(ents))
		}
	})
}

// ---- measurements ----

// TestMeasurePodmanLXC (FERRY_MEASURE=1) moves memhog with 256 MiB
// dirtying 1000 pages/s once each, cold and pre-copy, as a Podman, an LXC
// and a ferry runc container in one lab, and logs a table.
func TestMeasurePodmanLXC(t *testing.T) {
	if os.Getenv("FERRY_MEASURE") != "1" {
		t.Skip("a measurement, not a test: set FERRY_MEASURE=1")
	}
	requirePodman(t)
	requireLXC(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	h1, h2 := &l.Hosts[0], &l.Hosts[1]
	podmanImport(t, bin, podmanImage, "", h1, h2)
	const memory, rate = "256M", "1000"
	type row struct {
		runtime, mode string
		rep           engine.Report
		pr            probe.Result
	}
	var rows []row
	// Pre-copy's switchover is picked by the runtime's caps: rebuild for
	// runc (lazy dump), dump for Podman and LXC; runc with the dump
	// switchover too, for a like-for-like ratio.
	runs := []struct{ rt, mode, switchover string }{
		{"runc", engine.ModeCold, ""}, {"runc", engine.ModePrecopy, ""}, {"runc", engine.ModePrecopy, engine.SwitchoverDump},
		{"podman", engine.ModeCold, ""}, {"podman", engine.ModePrecopy, ""},
		{"lxc", engine.ModeCold, ""}, {"lxc", engine.ModePrecopy, ""},
	}
	for i, run := range runs {
		rt, mode := run.rt, run.mode
		{
			name := fmt.Sprintf("m%d-%s-%s", i, rt, mode)
			switch rt {
			case "runc":
				if err := l.Run(context.Background(), "h1", name, memhogArgs(memory, rate)); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = h2.Runc().Delete(context.Background(), name) })
			case "podman":
				podmanRun(t, l, name, podmanImage, memhogArgs(memory, rate))
			case "lxc":
				lxcRun(t, l, name, memhogArgs(memory, rate))
			}
			p := startProbe(t, l, bin, memory)
			rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: mode, Runtime: rt,
				Precopy: engine.PrecopyOptions{Switchover: run.switchover}})
			if !rep.OK || perr != nil || !pr.StateOK {
				t.Fatalf("%s %s: %s (at %s); probe %+v %v", rt, mode, rep.Error, rep.FailedAt, pr, perr)
			}
			label := mode
			if mode == engine.ModePrecopy {
				label += " (" + map[bool]string{true: "rebuild", false: "dump"}[rep.FillMs > 0] + ")"
			}
			rows = append(rows, row{rt, label, rep, pr})
			// Free the memory before the next one.
			switch rt {
			case "runc":
				_ = h2.Runc().Delete(context.Background(), name)
			case "podman":
				_, _ = pm(context.Background(), h2, "rm", "--force", "--time", "0", name)
			case "lxc":
				_, _ = lxcIn(h2, "lxc-stop", "-n", name, "-k")
				_, _ = lxcIn(h2, "lxc-destroy", "-n", name)
			}
		}
	}
	t.Logf("memhog --memory %s --dirty-rate %s, unshaped lab", memory, rate)
	t.Logf("| runtime | mode | client downtime ms | downtime ms | total ms | bytes sent | rounds |")
	t.Logf("|---|---|---|---|---|---|---|")
	for _, r := range rows {
		t.Logf("| %s | %s | %.0f | %.0f | %.0f | %d | %d |", r.runtime, r.mode, r.pr.ClientDowntimeMs, r.rep.DowntimeMs, r.rep.TotalMs, r.rep.BytesSent, len(r.rep.Rounds))
	}
	for _, r := range rows {
		var ph []string
		for _, s := range r.rep.Phases {
			ph = append(ph, fmt.Sprintf("%s %.0f", s.Name, s.EndMs-s.StartMs))
		}
		t.Logf("%s %s phases (ms): %s; restore %.0f ms; pages referenced %d; stop: %s", r.runtime, r.mode, strings.Join(ph, ", "), r.rep.RestoreMs, r.rep.PagesReferenced, r.rep.StopReason)
	}
}

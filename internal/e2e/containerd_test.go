package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// containerd containers moved through the agents and the engine: h1 and
// h2 each run a containerd of their own (lab.Host.Containerd), h1's
// container moves to h2's, whose containerd owns the task afterwards
// (ctr tasks ls, kill, delete, containers rm) while h1's lists nothing.

func requireContainerd(t *testing.T) {
	t.Helper()
	requireLab(t)
	for _, tool := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the containerd integration tests need it (apt-get install containerd)", tool)
		}
	}
}

// ctr runs containerd's own CLI against a lab host's daemon, namespace
// default.
func ctr(t *testing.T, h *lab.Host, args ...string) string {
	t.Helper()
	out, err := exec.Command("ctr", append([]string{"--address", h.Containerd().Socket(), "-n", "default"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %s on %s: %v: %s", strings.Join(args, " "), h.Name, err, out)
	}
	return string(out)
}

// ctrTasks is `ctr tasks ls` on h as ID:STATUS words.
func ctrTasks(t *testing.T, h *lab.Host) string {
	t.Helper()
	var l []string
	for _, line := range strings.Split(ctr(t, h, "tasks", "ls"), "\n")[1:] {
		if f := strings.Fields(line); len(f) == 3 {
			l = append(l, f[0]+":"+f[2])
		}
	}
	return strings.Join(l, " ")
}

// ctrContainers is `ctr containers ls -q` on h.
func ctrContainers(t *testing.T, h *lab.Host) string {
	t.Helper()
	return strings.Join(strings.Fields(ctr(t, h, "containers", "ls", "-q")), " ")
}

// ctrRun starts memhog in h1's containerd, removed from both hosts when
// the test ends.
func ctrRun(t *testing.T, l *lab.Lab, name, memory string) {
	t.Helper()
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = l.RemoveFrom(context.Background(), "containerd", h.Name, name)
		}
	})
	if err := l.RunContainerd(context.Background(), l.Hosts[0].Name, name, memhogArgs(memory, "200")); err != nil {
		t.Fatal(err)
	}
}

// TestContainerdThroughAgents: cold and pre-copy by --runtime containerd
// and cold by --runtime auto, each checked in containerd's own words on
// both hosts; a failing restore; the destination's agent killed after
// the restore; bad input.
func TestContainerdThroughAgents(t *testing.T) {
	requireContainerd(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	h1, h2 := &l.Hosts[0], &l.Hosts[1]
	if err := l.ImportWorkloadImage(context.Background(), "containerd", h1.Name, h2.Name); err != nil {
		t.Fatal(err)
	}

	moveInEachMode(t, l, bin, "containerd", "ctr",
		func(t *testing.T, name string) { ctrRun(t, l, name, "64M") },
		func(t *testing.T, name string) {
			if got := ctrTasks(t, h2); got != name+":RUNNING" {
				t.Errorf("ctr tasks ls on h2: %q, want %s RUNNING", got, name)
			}
			if got := ctrContainers(t, h1); got != "" {
				t.Errorf("ctr containers ls on h1 still lists %q", got)
			}
			ctr(t, h2, "tasks", "kill", "--signal", "SIGKILL", name)
			for deadline := time.Now().Add(10 * time.Second); strings.Contains(ctrTasks(t, h2), "RUNNING") && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			}
			ctr(t, h2, "tasks", "delete", name)
			ctr(t, h2, "containers", "rm", name)
			if got := ctrContainers(t, h2); got != "" {
				t.Errorf("after ctr containers rm on h2: %q", got)
			}
		})

	t.Run("failed restore", func(t *testing.T) {
		name := "ctr-fail"
		ctrRun(t, l, name, "64M")
		p := startProbe(t, l, bin, "64M")
		rt := h1.ContainerdRuntime()
		defer rt.Close()
		before, err := rt.Inspect(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "containerd", Faults: []string{"restore-fails@restore"}})
		if rep.OK || !strings.Contains(rep.FailedAt, "restore") || rep.SourceState != "resumed" {
			t.Fatalf("report: ok=%v at %q, source %q: %s", rep.OK, rep.FailedAt, rep.SourceState, rep.Error)
		}
		if perr != nil || !pr.StateOK {
			t.Fatalf("workload state after resume: %+v %v", pr, perr)
		}
		after, err := rt.Inspect(context.Background(), name)
		if err != nil || after.Status != "running" || after.PID != before.PID {
			t.Errorf("h1 after the failed move: %+v %v, want running with pid %d", after, err, before.PID)
		}
		if got := ctrTasks(t, h1); got != name+":RUNNING" {
			t.Errorf("ctr tasks ls on h1: %q", got)
		}
		if got := ctrContainers(t, h2); got != "" {
			t.Errorf("h2's containerd kept %q", got)
		}
		noScratch(t, h2)
	})

	t.Run("destination agent dies after restore", func(t *testing.T) {
		name := "ctr-dies"
		ctrRun(t, l, name, "64M")
		p := startProbe(t, l, bin, "64M")
		state := func(h *lab.Host) string {
			for _, task := range strings.Fields(ctrTasks(t, h)) {
				if id, st, _ := strings.Cut(task, ":"); id == name {
					return strings.ToLower(st)
				}
			}
			return "absent"
		}
		// containerd says running; CRIU left every process stopped.
		held := func() error {
			rt := h2.ContainerdRuntime()
			defer rt.Close()
			c, err := rt.Inspect(context.Background(), name)
			if err != nil {
				return err
			}
			for _, q := range append([]int{c.PID}, procs.Descendants(c.PID, "")...) {
				if st, ok := procs.State(q); ok && st != 'T' {
					return fmt.Errorf("process %d is in state %c", q, st)
				}
			}
			return nil
		}
		w := struct{ frozen, held, running string }{"paused", "running", "running"}
		destinationDiesAfterRestore(t, l, p, name, "containerd", state, w, held)
	})

	t.Run("bad input", func(t *testing.T) {
		name := "ctr-bad"
		ctrRun(t, l, name, "16M")
		// h2 loses the image: only the container's own layer moves.
		ctr(t, h2, "images", "rm", "--sync", "localhost/ferry-workload:latest")
		expectRefused(t, l, []refusal{
			{engine.Request{Container: "ctr-nosuch", Mode: engine.ModeCold, Runtime: "containerd"}, `no container "ctr-nosuch"`, "prepare"},
			{engine.Request{Container: "other/" + name, Mode: engine.ModeCold, Runtime: "containerd"}, "in namespace other", "prepare"},
			// CRIU's pre-dump is runc's alone.
			{engine.Request{Container: name, Mode: engine.ModePrecopy, Runtime: "containerd", Precopy: engine.PrecopyOptions{Engine: engine.PrecopyNative}}, "native needs CRIU's pre-dump", "prepare"},
			{engine.Request{Container: name, Mode: engine.ModePostcopy, Runtime: "containerd"}, "has no image localhost/ferry-workload:latest", "destination"},
			{engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "containerd"}, "has no image localhost/ferry-workload:latest", "destination"},
		}, func() {
			if got := ctrTasks(t, h1); got != name+":RUNNING" {
				t.Fatalf("ctr tasks ls on h1 after a refusal: %q", got)
			}
		})
		if got := ctrContainers(t, h2); got != "" {
			t.Errorf("h2's containerd has %q after the refusals", got)
		}
	})
}

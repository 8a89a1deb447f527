package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime/docker"
)

// Docker containers moved through the agents and the engine: h1 and h2
// each run a dockerd of their own (lab.Host.Docker), h1's container moves
// to h2's, which runs it under the same name afterwards (docker ps, logs,
// stop, rm) while h1's lists nothing.

func requireDocker(t *testing.T) {
	t.Helper()
	requireLab(t)
	for _, tool := range []string{"dockerd", "docker", "containerd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the Docker integration tests need it (apt-get install docker.io)", tool)
		}
	}
}

// dockerLab is a lab whose h1 and h2 run a dockerd each, the workload
// image loaded.
func dockerLab(t *testing.T) (bin string, l *lab.Lab, h1, h2 *lab.Host) {
	t.Helper()
	requireDocker(t)
	bin = ferryBin(t)
	l = upLab(t, bin)
	h1, h2 = &l.Hosts[0], &l.Hosts[1]
	if err := l.ImportWorkloadImage(context.Background(), "docker", h1.Name, h2.Name); err != nil {
		t.Fatal(err)
	}
	return bin, l, h1, h2
}

// dk runs Docker's CLI against a lab host's daemon and returns its output.
func dk(t *testing.T, h *lab.Host, args ...string) string {
	t.Helper()
	out, err := dockerCmd(h, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s on %s: %v: %s", strings.Join(args, " "), h.Name, err, out)
	}
	return strings.TrimSpace(string(out))
}

// dockerCmd is Docker's CLI for a lab host's daemon.
func dockerCmd(h *lab.Host, args ...string) *exec.Cmd {
	return exec.Command("docker", append([]string{"-H", h.Docker().Host()}, args...)...)
}

// dockerPs is `docker ps` on h as NAME:STATE (all containers with all).
func dockerPs(t *testing.T, h *lab.Host, all bool) []string {
	t.Helper()
	args := []string{"ps", "--format", "{{.Names}}:{{.State}}"}
	if all {
		args = append(args, "--all")
	}
	return strings.Fields(dk(t, h, args...))
}

// dockerRun starts memhog in h1's dockerd, removed from both hosts when
// the test ends.
func dockerRun(t *testing.T, l *lab.Lab, name, memory string) {
	t.Helper()
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = l.RemoveFrom(context.Background(), "docker", h.Name, name)
		}
	})
	if err := l.RunDocker(context.Background(), l.Hosts[0].Name, name, memhogArgs(memory, "200")); err != nil {
		t.Fatal(err)
	}
}

// TestDockerThroughAgents: cold and pre-copy by --runtime docker and cold
// by --runtime auto, checked with docker on both hosts; a failing
// restore; bad input.
func TestDockerThroughAgents(t *testing.T) {
	bin, l, h1, h2 := dockerLab(t)

	moveInEachMode(t, l, bin, "docker", "dk",
		func(t *testing.T, name string) { dockerRun(t, l, name, "64M") },
		func(t *testing.T, name string) {
			if got := dockerPs(t, h2, false); !slices.Equal(got, []string{name + ":running"}) {
				t.Errorf("docker ps on h2: %v, want %s running", got, name)
			}
			if got := dockerPs(t, h1, true); len(got) != 0 {
				t.Errorf("docker ps --all on h1 still lists %v", got)
			}
			dk(t, h2, "logs", name)
			dk(t, h2, "stop", "--time", "10", name)
			if got := dockerPs(t, h2, true); !slices.Equal(got, []string{name + ":exited"}) {
				t.Errorf("after docker stop on h2: %v", got)
			}
			dk(t, h2, "rm", name)
			if got := dockerPs(t, h2, true); len(got) != 0 {
				t.Errorf("after docker rm on h2: %v", got)
			}
		})

	t.Run("failed restore", func(t *testing.T) {
		name := "dk-fail"
		dockerRun(t, l, name, "64M")
		p := startProbe(t, l, bin, "64M")
		pidBefore := dk(t, h1, "inspect", "--format", "{{.State.Pid}}", name)
		rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "docker", Faults: []string{"restore-fails@restore"}})
		if rep.OK || !strings.Contains(rep.FailedAt, "restore") || rep.SourceState != "resumed" {
			t.Fatalf("report: ok=%v at %q, source %q: %s", rep.OK, rep.FailedAt, rep.SourceState, rep.Error)
		}

		if perr != nil || !pr.StateOK {
			t.Fatalf("workload state after resume: %+v %v", pr, perr)
		}
		if got := dk(t, h1, "inspect", "--format", "{{.State.Status}} {{.State.Pid}}", name); got != "running "+pidBefore {
			t.Errorf("h1 after the failed move: %q, want running with pid %s", got, pidBefore)
		}
		if got := dockerPs(t, h2, true); len(got) != 0 {
			t.Errorf("h2's Docker kept %v", got)
		}
		noScratch(t, h2)
	})

	t.Run("destination agent dies after restore", func(t *testing.T) {
		name := "dk-dies"
		dockerRun(t, l, name, "64M")
		p := startProbe(t, l, bin, "64M")
		state := func(h *lab.Host) string {
			for _, c := range dockerPs(t, h, true) {
				if n, st, _ := strings.Cut(c, ":"); n == name {
					return st
				}
			}
			return "absent"
		}
		// Docker says running; CRIU, through ferry's runtime, left every
		// process stopped.
		held := func() error {
			out := dk(t, h2, "inspect", "--format", "{{.State.Pid}} {{.HostConfig.Runtime}}", name)
			var pid int
			var rt string
			if _, err := fmt.Sscan(out, &pid, &rt); err != nil {
				return err
			}
			if rt != docker.StoppedRuntime {
				return fmt.Errorf("restored under runtime %q, not %s", rt, docker.StoppedRuntime)
			}
			for _, q := range append([]int{pid}, procs.Descendants(pid, "")...) {
				if st, ok := procs.State(q); ok && st != 'T' {
					return fmt.Errorf("process %d is in state %c", q, st)
				}
			}
			return nil
		}
		w := struct{ frozen, held, running string }{"paused", "running", "running"}
		destinationDiesAfterRestore(t, l, p, name, "docker", state, w, held)
	})

	t.Run("bad input", func(t *testing.T) {
		name := "dk-bad"
		dockerRun(t, l, name, "16M")
		dk(t, h2, "image", "rm", "localhost/ferry-workload:latest")
		expectRefused(t, l, []refusal{
			{engine.Request{Container: "dk-nosuch", Mode: engine.ModeCold, Runtime: "docker"}, `no container "dk-nosuch"`, "prepare"},
			// CRIU's pre-dump is runc's alone.
			{engine.Request{Container: name, Mode: engine.ModePrecopy, Runtime: "docker", Precopy: engine.PrecopyOptions{Engine: engine.PrecopyNative}}, "native needs CRIU's pre-dump", "prepare"},
			{engine.Request{Container: name, Mode: engine.ModePostcopy, Runtime: "docker"}, "does not have the image", "destination"},
			{engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "docker"}, "does not have the image", "destination"},
		}, func() {
			if got := dockerPs(t, h1, false); !slices.Equal(got, []string{name + ":running"}) {
				t.Fatalf("docker ps on h1 after a refusal: %v", got)
			}
		})
		if got := dockerPs(t, h2, true); len(got) != 0 {
			t.Errorf("h2's Docker has %v after the refusals", got)
		}
	})
}

package cgroups

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"

	occgroups "github.com/opencontainers/cgroups"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// Freeze freezes every process of the cgroup, those below included, and
// no other; the freezer then says FROZEN, as runc reads it for "paused";
// Thaw lets them run again.
func TestFreeze(t *testing.T) {
	testroot.Require(t, "needs root to make cgroups")
	if occgroups.IsCgroup2UnifiedMode() {
		t.Skip("skipped: this machine has cgroup v2 only; the test makes v1 freezer cgroups")
	}
	dir, child, start := freezerTree(t, "ferry-freeze-test")
	init, below, outside := start(dir).Process.Pid, start(child).Process.Pid, start("").Process.Pid
	if err := Freeze(dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "freezer.state")); strings.TrimSpace(string(b)) != "FROZEN" {
		t.Fatalf("freezer.state %q after Freeze", b)
	}
	for _, p := range []int{init, below} {
		if !frozen(t, p) {
			t.Errorf("process %d in the cgroup is not frozen", p)
		}
	}
	if frozen(t, outside) {
		t.Error("a process outside the cgroup was frozen")
	}
	if err := Thaw(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{init, below} {
		waitState(t, p, 'S')
	}
}

// freezerTree makes the freezer cgroup name (with this process's pid) and
// one below it, and returns them with start, which runs a sleep(1) in a
// cgroup ("": none). Everything goes at the test's end, the cgroup thawed
// first: a frozen process does not die.
func freezerTree(t *testing.T, name string) (dir, child string, start func(in string) *exec.Cmd) {
	t.Helper()
	dir = filepath.Join(controllerRoot(t, "freezer"), name+"-"+strconv.Itoa(os.Getpid()))
	child = filepath.Join(dir, "child")
	for _, d := range []string{dir, child} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var started []*exec.Cmd
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
		for _, c := range started {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		_ = os.Remove(child)
		_ = os.Remove(dir)
	})
	start = func(in string) *exec.Cmd {
		t.Helper()
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		started = append(started, c)
		if in != "" {
			if err := occgroups.WriteCgroupProc(in, c.Process.Pid); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	return dir, child, start
}

// frozen says whether the freezer holds pid, a sleep(1): this kernel
// shows a frozen task as D (TASK_FROZEN), a sleeping one as S.
func frozen(t *testing.T, pid int) bool {
	t.Helper()
	s, ok := procs.State(pid)
	if !ok {
		t.Fatalf("process %d is gone", pid)
	}
	return s == 'D'
}

package lxc

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"golang.org/x/sys/unix"
)

func TestNamedFor(t *testing.T) {
	for _, c := range []struct {
		cgroup string
		want   bool
	}{
		{"lxc.payload.web", true},
		{"lxc.monitor.web", true},
		{"lxc.payload.web-1", true},
		{"lxc.payload.web-12", true},
		{"lxc.payload.web-", false},
		{"lxc.payload.web-a", false},
		{"lxc.payload.web2", false},
		{"lxc.payload.webserver", false},
		{"lxc.pivot", false},
		{"web", false},
		{"lxc.payload.we", false},
	} {
		if got := namedFor(c.cgroup, "web"); got != c.want {
			t.Errorf("namedFor(%q, web) = %v", c.cgroup, got)
		}
	}
}

// On this machine's real cgroups: empty cgroups named for the container
// go, with or without a suffix; one holding a process stays.
func TestRemoveEmptyCgroups(t *testing.T) {
	testroot.Require(t, "needs root to make cgroups")
	name := "ferry-test-" + strconv.Itoa(os.Getpid())
	pids := filepath.Join(cgroups.Root, "pids")
	if _, err := os.Stat(filepath.Join(pids, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v1 pids hierarchy at " + pids)
	}
	before := filepath.Join(pids, "lxc.payload."+name)
	made := filepath.Join(pids, "lxc.payload."+name+"-1")
	busy := filepath.Join(pids, "lxc.monitor."+name)
	for _, d := range []string{before, made, busy} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Rmdir(d) })
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
	})
	if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	found := containerCgroups(cgroups.Root, name)
	for _, d := range []string{before, made, busy} {
		if !slices.Contains(found, d) {
			t.Fatalf("containerCgroups found %v, not %s", found, d)
		}
	}
	if err := removeEmptyCgroups(found); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]bool{before: false, made: false, busy: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", d, err == nil, want)
		}
	}
}

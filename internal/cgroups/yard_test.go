package cgroups

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/moby/sys/mountinfo"
	occgroups "github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// CRIU's names for the hierarchies /proc/PID/cgroup lists.
func TestYardName(t *testing.T) {
	for in, want := range map[string]string{"": "unified", "name=systemd": "systemd", "cpu,cpuacct": "cpu,cpuacct", "pids": "pids"} {
		if got := yardName(in); got != want {
			t.Errorf("yardName(%q) = %q, want %q", in, got, want)
		}
	}
}

// A hierarchy is found only where it is mounted from its root, and only
// with exactly its controllers.
func TestHierarchyMount(t *testing.T) {
	mounts := []*mountinfo.Info{
		{Mountpoint: "/elsewhere/cpu", Root: "/sub", FSType: "cgroup", VFSOptions: "rw,cpu,cpuacct"},
		{Mountpoint: "/sys/fs/cgroup/cpu,cpuacct", Root: "/", FSType: "cgroup", VFSOptions: "rw,cpuacct,cpu"},
		{Mountpoint: "/sys/fs/cgroup/systemd", Root: "/", FSType: "cgroup", VFSOptions: "rw,xattr,name=systemd"},
		{Mountpoint: "/sys/fs/cgroup/unified", Root: "/", FSType: "cgroup2", VFSOptions: "rw,nsdelegate"},
	}
	known := []string{"cpu", "cpuacct", "name=systemd", "pids"}
	for controllers, want := range map[string]string{
		"cpu,cpuacct":  "/sys/fs/cgroup/cpu,cpuacct",
		"name=systemd": "/sys/fs/cgroup/systemd",
		"":             "/sys/fs/cgroup/unified",
		"cpu":          "", // only comounted here: not the same hierarchy
		"pids":         "",
	} {
		if got := hierarchyMount(mounts, controllers, known); got != want {
			t.Errorf("hierarchyMount(%q) = %q, want %q", controllers, got, want)
		}
	}
}

// On this machine: a link per hierarchy this process is in, each to the
// root of that hierarchy, and made again over an earlier yard.
func TestYard(t *testing.T) {
	own, err := occgroups.ParseCgroupFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no /proc/self/cgroup: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "yard")
	for range 2 {
		if err := Yard(dir); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(own) {
		t.Errorf("%d links for %d hierarchies", len(ents), len(own))
	}
	for controllers := range own {
		p := filepath.Join(dir, yardName(controllers))
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil || (st.Type != unix.CGROUP_SUPER_MAGIC && st.Type != unix.CGROUP2_SUPER_MAGIC) {
			t.Errorf("%s (%q) is no cgroup hierarchy: %v", p, controllers, err)
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// A stopped process in a cgroup of its own, and one in a cgroup below
// it, run again after Continue; one outside stays stopped.
func TestContinue(t *testing.T) {
	testroot.Require(t, "needs root to make cgroups")
	dir, child, run := freezerTree(t, "ferry-continue-test")
	start := func(in string) *exec.Cmd {
		c := run(in)
		if err := unix.Kill(c.Process.Pid, unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitState(t, c.Process.Pid, 'T')
		return c
	}
	init, below, outside := start(dir), start(child), start("")
	if err := Continue(init.Process.Pid); err != nil {
		t.Fatal(err)
	}
	waitState(t, init.Process.Pid, 'S')
	waitState(t, below.Process.Pid, 'S')
	if s, _ := procs.State(outside.Process.Pid); s != 'T' {
		t.Errorf("a process outside the cgroup is %c, want still stopped", s)
	}
}

func waitState(t *testing.T, pid int, want byte) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s, _ := procs.State(pid)
		if s == want || (want == 'S' && s == 'R') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d is %c, want %c", pid, s, want)
		}
	}
}

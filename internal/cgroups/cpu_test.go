package cgroups

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"

	occgroups "github.com/opencontainers/cgroups"
)

func TestCPUMaxFormat(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Bandwidth
	}{
		{"max 100000\n", Bandwidth{QuotaUs: -1, PeriodUs: 100000}},
		{"50000 100000\n", Bandwidth{QuotaUs: 50000, PeriodUs: 100000}},
	} {
		got, err := parseMax(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseMax(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if back, _ := parseMax(formatMax(got)); back != got {
			t.Errorf("formatMax(%+v) = %q does not read back", got, formatMax(got))
		}
	}
	for _, bad := range []string{"", "max", "x 100000", "1000 y", "1 2 3"} {
		if _, err := parseMax(bad); err == nil {
			t.Errorf("parseMax(%q) accepted", bad)
		}
	}
	if got := formatMax(Unlimited); got != "max" {
		t.Errorf("formatMax(Unlimited) = %q, want max (the kernel keeps the period)", got)
	}
}

func TestLimited(t *testing.T) {
	if b := Limited(0.8, 100000); b != (Bandwidth{QuotaUs: 80000, PeriodUs: 100000}) {
		t.Errorf("Limited(0.8) = %+v", b)
	}
	// The kernel refuses quotas under 1 ms.
	if b := Limited(0.001, 100000); b.QuotaUs != 1000 {
		t.Errorf("Limited(0.001) quota %d, want the kernel's minimum 1000", b.QuotaUs)
	}
}

// TestCPUOfRealCgroup throttles a real process in a cgroup the test makes
// under this host's cpu controller (v1, or v2 where cpu is delegated).
func TestCPUOfRealCgroup(t *testing.T) {
	testroot.Require(t, "needs root to make a cgroup")
	parent := controllerRoot(t, "cpu")
	dir := filepath.Join(parent, fmt.Sprintf("ferry-cgroups-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup under %s: %v", parent, err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if occgroups.IsCgroup2UnifiedMode() {
		if _, err := os.Stat(filepath.Join(dir, "cpu.max")); err != nil {
			t.Skipf("the cpu controller is not enabled under %s", parent)
		}
	}

	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := occgroups.WriteCgroupProc(dir, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}

	cpu, err := CPUOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if cpu.Dir() != dir {
		t.Fatalf("CPUOf found %s, want %s", cpu.Dir(), dir)
	}
	old, err := cpu.Get()
	if err != nil {
		t.Fatal(err)
	}
	if old.QuotaUs != -1 || old.PeriodUs == 0 {
		t.Fatalf("a new cgroup's limit is %+v, want no quota and a period", old)
	}
	for _, b := range []Bandwidth{Limited(0.8, 100000), Limited(0.2, 50000), Limited(0.5, 200000)} {
		if err := cpu.Set(b); err != nil {
			t.Fatalf("Set(%+v): %v", b, err)
		}
		if got, err := cpu.Get(); err != nil || got != b {
			t.Fatalf("after Set(%+v), Get() = %+v, %v", b, got, err)
		}
	}
	if err := cpu.Set(Unlimited); err != nil {
		t.Fatal(err)
	}
	if got, _ := cpu.Get(); got.QuotaUs != -1 || got.PeriodUs != 200000 {
		t.Fatalf("after Set(Unlimited), Get() = %+v, want no quota and the period kept", got)
	}
	if err := cpu.Set(old); err != nil {
		t.Fatal(err)
	}
}

// This machine's hierarchies are found, each once, and a directory that
// is no cgroup mount is not.
func TestHierarchies(t *testing.T) {
	hs := Hierarchies(Root)
	if len(hs) == 0 {
		t.Skip("no cgroup hierarchy mounted at " + Root)
	}
	seen := map[string]bool{}
	for _, h := range hs {
		if seen[h] {
			t.Errorf("%s twice", h)
		}
		seen[h] = true
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			t.Errorf("%s is no cgroup hierarchy: %v", h, err)
		}
	}
	if got := Hierarchies(t.TempDir()); len(got) != 0 {
		t.Errorf("a plain directory: %v", got)
	}
}

// controllerRoot is where this host mounts the hierarchy of subsystem (v1)
// or the one tree (v2); the test skips where it is not mounted.
func controllerRoot(t *testing.T, subsystem string) string {
	t.Helper()
	if occgroups.IsCgroup2UnifiedMode() {
		return unifiedMountpoint
	}
	mnt, err := occgroups.FindCgroupMountpoint("", subsystem)
	if err != nil {
		t.Skipf("no %s cgroup controller mounted: %v", subsystem, err)
	}
	return mnt
}

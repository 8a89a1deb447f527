package fault

import (
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	f, err := Parse("kill-destination@restore")
	if err != nil || f != (Fault{KillDestination, Restore}) || f.String() != "kill-destination@restore" {
		t.Fatalf("%v %v", f, err)
	}
	for _, bad := range []string{"kill-destination", "kill@restore", "kill-source@nowhere", "@dump", "kill-source@", ""} {
		if _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "ACTION@PHASE") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestParseSet(t *testing.T) {
	s, err := ParseSet([]string{"rootfs-final", "kill-source@freeze", "term-destination@commit"})
	if err != nil || !s.Knob(RootfsFinal) || s.Knob(ForgetPages) || !s.Has(KillSource, Freeze) || !s.Has(TermDestination, Commit) || s.Has(KillSource, Commit) {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := ParseSet([]string{"restore"}); err == nil {
		t.Fatal("an unknown word passed")
	}
	if _, err := ParseSet([]string{"kill-source@freeze", "boom@dump"}); err == nil || !strings.Contains(err.Error(), "boom@dump") {
		t.Fatalf("a bad fault passed: %v", err)
	}
}

func TestPhaseOf(t *testing.T) {
	for in, want := range map[string]string{"round-0": "", "round-1": Rounds, "round-7": "", "round-x": "", "dump": Dump, "lazy-pages": LazyPages} {
		if got := PhaseOf(in); got != want {
			t.Errorf("PhaseOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseStat(t *testing.T) {
	p, ok := parseStat(42, "42 (a (b) c) S 7 42 42 0 -1")
	if !ok || p.comm != "a (b) c" || p.ppid != 7 || p.pid != 42 {
		t.Fatalf("%+v %v", p, ok)
	}
	for _, bad := range []string{"", "42 a S 7", "42 (x)", "42 (x) S y"} {
		if _, ok := parseStat(1, bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// A child's child is found by its name, and only below the given PID.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var found []int
	for i := 0; i < 200 && len(found) == 0; i++ {
		found = Descendants(cmd.Process.Pid, "sleep")
		if len(found) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if len(found) != 1 {
		t.Fatalf("found %v below %d", found, cmd.Process.Pid)
	}
	defer syscall.Kill(found[0], syscall.SIGKILL)
	if !slices.Contains(Named("sleep"), found[0]) {
		t.Errorf("Named(sleep) misses %d", found[0])
	}
	if got := Descendants(found[0], "sleep"); len(got) != 0 {
		t.Errorf("a leaf has descendants: %v", got)
	}
}

package fault

import (
	"strings"
	"testing"
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

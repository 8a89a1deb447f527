package bench

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/testroot"
)

// The matrix holds only cases where the fault has something to break:
// no rounds in cold, no pull outside the lazy modes, no destination fault
// at the freeze, CRIU killed only where it runs.
func TestFaultMatrix(t *testing.T) {
	all := FaultMatrix(nil, nil, nil, nil)
	seen := map[string]bool{}
	for _, c := range all {
		k := c.Mode + " " + c.Fault + "@" + c.Phase
		if seen[k] {
			t.Errorf("twice: %s", k)
		}
		seen[k] = true
	}
	for _, k := range []string{
		"cold kill-source@freeze", "cold kill-destination@commit", "cold scratch-full@dump",
		"precopy kill-source@rounds", "postcopy kill-destination@lazy-pages",
		"postcopy kill-source-criu@lazy-pages", "hybrid cut-link@rounds", "cold restore-fails@restore",
		"precopy kill-destination-criu@lazy-pages", "precopy kill-destination@lazy-pages",
	} {
		if !seen[k] {
			t.Errorf("missing: %s", k)
		}
	}
	for _, k := range []string{
		"cold kill-source@rounds", "cold kill-source@lazy-pages", "precopy kill-destination@freeze",
		"cold kill-source-criu@restore", "postcopy kill-destination-criu@dump", "cold restore-fails@dump",
		"postcopy kill-source@rounds", "precopy kill-source-criu@lazy-pages",
	} {
		if seen[k] {
			t.Errorf("a case with nothing to break: %s", k)
		}
	}
	some := FaultMatrix(nil, []string{engine.ModeCold}, []string{fault.Commit}, []string{fault.KillSource, fault.CutLink})
	if len(some) != 2 {
		t.Errorf("narrowed matrix: %v", some)
	}

	// Stranding the restore's CRIU needs it below the agent: runc's alone,
	// at the restore, in every mode.
	var others []FaultCase
	strands := 0
	for _, c := range all {
		if c.Fault != fault.StrandDestinationCRIU {
			others = append(others, c)
			continue
		}
		strands++
		if c.Phase != fault.Restore {
			t.Errorf("a strand outside the restore: %+v", c)
		}
	}
	if strands != 4 {
		t.Errorf("%d strand cases, want one per mode", strands)
	}
	all = others

	// The runtime axis: the runtimes that restore lazily (all of them,
	// where lazy pages work) all of runc's cells.
	byRuntime := map[string]int{}
	docker := map[string]bool{}
	for _, c := range FaultMatrix([]string{"runc", "podman", "lxc", "containerd", "docker"}, nil, nil, nil) {
		byRuntime[c.Runtime]++
		if c.Runtime == "docker" {
			docker[c.Mode+" "+c.Fault+"@"+c.Phase] = true
		}
	}
	if byRuntime["runc"] != len(all)+strands {
		t.Errorf("cases by runtime %v; runc has %d and its %d strands", byRuntime, len(all), strands)
	}
	for _, rt := range []string{"podman", "lxc", "containerd"} {
		if byRuntime[rt] != len(all) {
			t.Errorf("cases by runtime %v; runc alone has %d", byRuntime, len(all))
		}
	}
	// Docker's cold restores from the destination's own images: it pulls,
	// and no page server runs at the destination during its dump.
	coldPull := 0
	for _, c := range all {
		if c.Mode == engine.ModePrecopy && c.Phase == fault.LazyPages {
			coldPull++ // the same faults break a local pull in either mode
		}
	}
	if want := len(all) + coldPull - 1; byRuntime["docker"] != want {
		t.Errorf("docker has %d cases, want runc's %d, %d more for cold's pull, one fewer at its dump", byRuntime["docker"], len(all), coldPull)
	}
	if !docker["cold kill-destination-criu@lazy-pages"] || docker["cold kill-destination-criu@dump"] || !docker["cold cut-link@lazy-pages"] {
		t.Errorf("docker's cold cases: %v", docker)
	}
}

func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		s, d  string
		twice bool
		want  string
	}{
		{"running", "absent", false, RunningAtSource},
		{"absent", "running", false, RunningAtDestination},
		{"running", "running", false, RunningTwice},
		{"running", "absent", true, RunningTwice}, // seen once is enough
		{"paused", "absent", false, FrozenInDoubt},
		{"absent", "stopped", false, FrozenInDoubt},
		{"paused", "running", false, FrozenInDoubt},
		{"absent", "absent", false, Lost},
	} {
		if got := outcome(c.s, c.d, c.twice); got != c.want {
			t.Errorf("outcome(%s, %s, %v) = %s, want %s", c.s, c.d, c.twice, got, c.want)
		}
	}
}

func TestSummary(t *testing.T) {
	var s FaultsSummary
	for _, c := range []FaultCase{
		{Outcome: RunningAtSource, StateOK: true},
		{Outcome: RunningAtDestination, StateOK: false, Leaks: []string{"a", "b"}},
		{Outcome: Lost, Hung: true},
		{Outcome: RunningTwice},
		{Outcome: FrozenInDoubt},
	} {
		s.add(c)
	}
	want := FaultsSummary{Cases: 5, RunningTwice: 1, Lost: 1, FrozenInDoubt: 1, StateBad: 1, Hung: 1, Leaks: 2}
	if s != want {
		t.Errorf("%+v, want %+v", s, want)
	}
}

func TestGrew(t *testing.T) {
	warm := map[string]AgentUsage{"h1": {RSSBytes: 40 << 20, OpenFDs: 20}, "h2": {RSSBytes: 300 << 20, OpenFDs: 20}}
	end := map[string]AgentUsage{"h1": {RSSBytes: 110 << 20, OpenFDs: 30}, "h2": {RSSBytes: 380 << 20, OpenFDs: 40}}
	got := grew(warm, end)
	// h1: +70 MiB and more than half; h2: +80 MiB but not half, 20 more files.
	if len(got) != 2 || !slices.Contains(got, "h1: memory 40 -> 110 MiB") || !slices.Contains(got, "h2: open files 20 -> 40") {
		t.Fatalf("%v", got)
	}
	if len(grew(warm, warm)) != 0 || len(grew(nil, end)) != 0 {
		t.Fatal("growth without growth")
	}
}

// scratch-full: the destination's scratch holds 64 KiB and no more until
// the case ends, and then is the directory it was.
func TestFillScratch(t *testing.T) {
	testroot.Require(t, "needs root: mounts a tmpfs")
	dir := filepath.Join(t.TempDir(), "scratch")
	free, err := fillScratch(dir)
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 128<<10)
	err = os.WriteFile(filepath.Join(dir, "pages-1.img"), big, 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		free()
		t.Fatalf("128 KiB into the full scratch: %v, want ENOSPC", err)
	}
	free()
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), big, 0o600); err != nil {
		t.Fatalf("after the case: %v", err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), " "+dir+" ") {
		t.Errorf("%s is still mounted", dir)
	}
}

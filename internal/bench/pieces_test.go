package bench

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/lab"
)

// Every hostile case has a name of its own (the results are keyed by
// it) and something to run.
func TestHostileCasesAreNamedOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range hostileCases() {
		if c.name == "" || c.run == nil || seen[c.name] {
			t.Errorf("case %q: empty, without a run, or named twice", c.name)
		}
		seen[c.name] = true
	}
	if len(seen) < 10 {
		t.Errorf("%d hostile cases", len(seen))
	}
}

// The summary counts what each case did.
func TestHostileSummary(t *testing.T) {
	var s HostileSummary
	for _, c := range []HostileCase{{Accepted: true}, {Leaks: []string{"a netns"}}, {AgentDown: true, Accepted: true}, {}} {
		s.add(c)
	}
	if s.Cases != 4 || s.Accepted != 2 || s.Leaks != 1 || s.AgentDown != 1 {
		t.Errorf("summary %+v", s)
	}
}

// The probe polls the workload on each host and every path, path by path.
func TestWorkloadAddrs(t *testing.T) {
	h1, h2 := &lab.Host{Index: 1}, &lab.Host{Index: 2}
	got := workloadAddrs(2, h1, h2)
	want := []string{"10.77.0.1:7000", "10.77.0.2:7000", "10.78.0.1:7000", "10.78.0.2:7000"}
	if !slices.Equal(got, want) {
		t.Errorf("workloadAddrs(2) = %v, want %v", got, want)
	}
	if got := workloadAddrs(0, h1); !slices.Equal(got, []string{"10.77.0.1:7000"}) {
		t.Errorf("no paths named: %v", got)
	}
}

// memhog's command line, and the ready timeout that grows with memory.
func TestMemhogArgs(t *testing.T) {
	o := MigrateOptions{MemoryBytes: 256 << 20, DirtyRate: 1000}
	want := []string{"/bin/memhog", "--memory", "268435456", "--dirty-rate", "1000", "--port", "7000"}
	if got := o.workloadArgs(); !slices.Equal(got, want) {
		t.Errorf("workloadArgs = %v", got)
	}
	if got := (DrainOptions{MemoryBytes: 1 << 20, DirtyRate: 5}).memhogArgs(7005); got[len(got)-1] != "7005" || got[2] != "1048576" {
		t.Errorf("drain's memhog = %v", got)
	}
	if small, big := (MigrateOptions{MemoryBytes: 1 << 20}).readyTimeout(), (MigrateOptions{MemoryBytes: 10 << 30}).readyTimeout(); big-small < 100e9 {
		t.Errorf("ready timeouts %v and %v: 10 GiB does not get its fill time", small, big)
	}
}

// Progress lines go where Log says, and nowhere without one.
func TestLogTo(t *testing.T) {
	var b bytes.Buffer
	logTo(&b, "run %d of %d", 1, 3)
	if b.String() != "bench: run 1 of 3\n" {
		t.Errorf("%q", b.String())
	}
	logTo(nil, "nothing")
}

// usage reads an agent's resident memory and open files from its
// process: files it opens since show, as soak's growth check needs.
func TestUsageSeesOpenFilesGrow(t *testing.T) {
	var h lab.Host
	h.Name, h.AgentPID = "h1", os.Getpid()
	hosts := []*lab.Host{&h}
	warm := usage(hosts)
	if warm["h1"].RSSBytes <= 0 || warm["h1"].OpenFDs <= 0 {
		t.Fatalf("usage of this process: %+v", warm["h1"])
	}
	for range 20 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	end := usage(hosts)
	if got := grew(warm, end); len(got) != 1 || !strings.HasPrefix(got[0], "h1: open files ") {
		t.Errorf("after 20 more open files: %q (%+v -> %+v)", got, warm["h1"], end["h1"])
	}
}

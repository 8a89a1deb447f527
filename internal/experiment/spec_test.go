package experiment

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSpecFillsDefaults(t *testing.T) {
	s, err := ParseSpec([]byte("workloads: [redis]\nstate_sizes: [64M]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "experiment" || s.Connections != 1 || s.Tools || s.Repeats != DefaultRepeats || s.Before != DefaultBefore || s.After != DefaultAfter {
		t.Errorf("defaults not filled: %+v", s)
	}
	if strings.Join(s.Modes, ",") != "cold,precopy,postcopy,hybrid" || strings.Join(s.Runtimes, ",") != "runc" {
		t.Errorf("modes %v, runtimes %v", s.Modes, s.Runtimes)
	}
	if len(s.Bandwidths) != 1 || s.Loads[0] != DefaultLoad || s.DirtyRates[0] != DefaultDirtyRate {
		t.Errorf("axes %v %v %v", s.Bandwidths, s.Loads, s.DirtyRates)
	}
}

// Every bad value is named at once, before any lab comes up.
func TestParseSpecRefusesBadValues(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"state_sizes: [64M]\n", "workloads: name at least one"},
		{"workloads: [nginx]\nstate_sizes: [64M]\n", `unknown "nginx"`},
		{"workloads: [redis]\nstate_sizes: [lots]\n", `"lots" is not a size`},
		{"workloads: [redis]\n", "state_sizes: give at least one"},
		{"workloads: [redis]\nstate_sizes: [64M]\nmodes: [warp]\n", `unknown "warp"`},
		{"workloads: [redis]\nstate_sizes: [64M]\nruntimes: [podman]\n", "redis runs under runc only"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nruntimes: [rkt]\n", `unknown "rkt"`},
		{"workloads: [memhog]\nstate_sizes: [64M]\nmodes: [cold/2]\n", "only precopy and hybrid have live rounds"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nmodes: [precopy/0]\n", "round bound must be 1 to 32"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nmodes: [hybrid/many]\n", "round bound must be 1 to 32"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nbandwidths: [fast]\n", "bandwidths"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nloads: [0]\n", "at least 1 request"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nrepeats: -1\n", "repeats"},
		{"workloads: [redis]\nstate_sizes: [64M]\nconnections: -2\n", "connections"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nsizes: [1]\n", "field sizes not found"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nbefore: soon\n", "experiment file"},
		{"workloads: [memhog, redis]\nstate_sizes: [64M]\nmodes: [normal]\n", "normal moves memhog only"},
		{"workloads: [memhog]\nstate_sizes: [64M]\nmodes: [normal/2]\n", `unknown "normal/2"`},
	} {
		_, err := ParseSpec([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one saying %q", c.yaml, err, c.want)
		}
	}
	_, err := ParseSpec([]byte("workloads: [nginx]\nstate_sizes: [lots]\n"))
	if err == nil || !strings.Contains(err.Error(), "nginx") || !strings.Contains(err.Error(), "lots") {
		t.Errorf("two bad values, error %v names not both", err)
	}
}

// memhog takes the dirty rates, services the loads; points of a bandwidth
// come together, so the lab comes up once per bandwidth.
func TestGrid(t *testing.T) {
	s, err := ParseSpec([]byte(`workloads: [memhog, redis]
modes: [cold, hybrid]
state_sizes: [64M, 128M]
dirty_rates: [10, 100, 1000]
loads: [50, 500]
bandwidths: [1gbit, 100mbit]
before: 1s
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Before != time.Second {
		t.Errorf("before %v", s.Before)
	}
	g := s.Grid()
	// per bandwidth: memhog 2 sizes x 3 rates x 2 modes + redis 2 x 2 x 2
	if want := 2 * (12 + 8); len(g) != want {
		t.Fatalf("%d points, want %d", len(g), want)
	}
	seen := map[Point]bool{}
	for i, p := range g {
		if seen[p] {
			t.Errorf("point %v twice", p)
		}
		seen[p] = true
		switch p.Workload {
		case "memhog":
			if p.Load != 0 || p.DirtyRate == 0 {
				t.Errorf("memhog point %+v", p)
			}
		case "redis":
			if p.DirtyRate != 0 || p.Load == 0 {
				t.Errorf("redis point %+v", p)
			}
		}
		if i > 0 && p.BandwidthBps != g[i-1].BandwidthBps && i != len(g)/2 {
			t.Errorf("bandwidths interleave at point %d", i)
		}
	}
	if g[0].BandwidthBps != 1e9 || g[len(g)-1].BandwidthBps != 1e8 {
		t.Errorf("bandwidths %d, %d", g[0].BandwidthBps, g[len(g)-1].BandwidthBps)
	}
}

// The shipped experiments parse.
func TestShippedExperimentsParse(t *testing.T) {
	files, err := filepath.Glob("../../experiments/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no shipped experiments: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte("\nkind: follow\n")) {
			continue // a follow scenario: followlab's TestShippedScenarios
		}
		if _, err := ParseSpec(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestSplitMode(t *testing.T) {
	for _, c := range []struct {
		in     string
		mode   string
		rounds int
	}{{"cold", "cold", 0}, {"precopy", "precopy", 0}, {"precopy/1", "precopy", 1}, {"hybrid/32", "hybrid", 32}} {
		mode, rounds, err := SplitMode(c.in)
		if err != nil || mode != c.mode || rounds != c.rounds {
			t.Errorf("SplitMode(%q) = %q, %d, %v; want %q, %d", c.in, mode, rounds, err, c.mode, c.rounds)
		}
	}
	for _, bad := range []string{"", "warm", "postcopy/2", "precopy/33", "precopy/"} {
		if _, _, err := SplitMode(bad); err == nil {
			t.Errorf("SplitMode(%q) accepted", bad)
		}
	}
}

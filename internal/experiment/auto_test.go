package experiment

import (
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/model"
)

// runs measures every mode at one memhog point with the given medians
// (stall, total), one run each.
func runsAt(p Point, m map[string][2]float64) []Run {
	var out []Run
	for mode, v := range m {
		q := p
		q.Mode = mode
		out = append(out, Run{Point: q, OK: true, StateOK: true, ClientDowntimeMs: v[0], TotalMs: v[1], MemoryBytes: 256 << 20})
	}
	return out
}

func TestCheckAuto(t *testing.T) {
	p := model.DefaultProfile()
	big := Point{Workload: "memhog", Runtime: "runc", StateBytes: 256 << 20, DirtyRate: 100, BandwidthBps: 1e9}
	small := big
	small.StateBytes = 64 << 20
	res := Results{}
	// At big, cold stalls long, pre-copy fits a 500 ms budget: pre-copy
	// measures best (resumable first), whatever post-copy's total.
	res.Runs = append(res.Runs, runsAt(big, map[string][2]float64{
		"cold": {3000, 3100}, "precopy": {400, 4000}, "postcopy": {250, 3500}, "hybrid": {230, 3900},
	})...)
	// At small, pre-copy fits 500 ms; under a 100 ms budget only the lazy
	// modes do (below).
	res.Runs = append(res.Runs, runsAt(small, map[string][2]float64{
		"cold": {800, 900}, "precopy": {300, 1200}, "postcopy": {90, 1500}, "hybrid": {95, 1400},
	})...)
	// A point missing a mode, and a bounded mode: left out.
	partial := big
	partial.DirtyRate = 1000
	res.Runs = append(res.Runs, runsAt(partial, map[string][2]float64{"cold": {1, 1}, "precopy/1": {1, 1}})...)

	checks := CheckAuto(res, p, 500)
	if len(checks) != 2 {
		t.Fatalf("%d checks, want the two complete points: %+v", len(checks), checks)
	}
	for _, c := range checks {
		if c.Point.Mode != "" {
			t.Errorf("a check's point has a mode: %+v", c.Point)
		}
		in := model.Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 100, BandwidthBps: 1e9 / 8}
		_, _, want, _ := model.Best(p, in, 500)
		if c.Picked != want {
			t.Errorf("picked %q, want model.Best's %q", c.Picked, want)
		}
		if c.Agree != (c.Picked == c.Measured) {
			t.Errorf("agree %v for %q against %q", c.Agree, c.Picked, c.Measured)
		}
	}
	if checks[0].Measured != "precopy" || checks[1].Measured != "precopy" {
		t.Errorf("measured best %q, %q; want precopy at both (within 500 ms, resumable, lowest total)", checks[0].Measured, checks[1].Measured)
	}
	// A tight budget: only the lazy modes fit at small, the lower total wins.
	checks = CheckAuto(res, p, 100)
	if checks[1].Measured != "hybrid" || checks[0].Measured != "" {
		t.Errorf("measured best at 100 ms: %q at big (want none), %q at small (want hybrid)", checks[0].Measured, checks[1].Measured)
	}
	if s := AutoSummary(checks, 100); !strings.Contains(s, "of 2 points (a 100 ms budget)") {
		t.Errorf("summary %q", s)
	}
}

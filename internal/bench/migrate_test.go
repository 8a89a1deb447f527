package bench

import (
	"math"
	"testing"
)

func TestAgainstLink(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	t.Run("no link measured: no ratios", func(t *testing.T) {
		res := MigrateResult{MemoryBytes: 256 << 20, Runs: []Run{{OK: true, TotalMs: 3000}}}
		res.againstLink()
		if res.LinkFloorMs != 0 || res.MedianTotalVsLink != 0 || res.Runs[0].TotalVsLink != 0 {
			t.Errorf("ratios without a link baseline: %+v", res)
		}
	})
	t.Run("every run over the floor, the median of those that worked", func(t *testing.T) {
		// 1 Gbit/s: 125 MB take 1000 ms.
		res := MigrateResult{MemoryBytes: 125_000_000, Baselines: Baselines{Link: &LinkBaseline{ThroughputBps: 1e9}},
			Runs: []Run{{OK: true, TotalMs: 1200}, {OK: false, TotalMs: 9000}, {OK: true, TotalMs: 1400}, {OK: true, TotalMs: 1300}}}
		res.againstLink()
		if !near(res.LinkFloorMs, 1000) {
			t.Fatalf("floor %v ms, want 1000", res.LinkFloorMs)
		}
		for i, want := range []float64{1.2, 9, 1.4, 1.3} {
			if !near(res.Runs[i].TotalVsLink, want) {
				t.Errorf("run %d: %v x the floor, want %v", i, res.Runs[i].TotalVsLink, want)
			}
		}
		if !near(res.MedianTotalVsLink, 1.3) {
			t.Errorf("median %v, want 1.3 (the failed run left out)", res.MedianTotalVsLink)
		}
	})
	t.Run("a link that carried nothing: no ratios", func(t *testing.T) {
		res := MigrateResult{MemoryBytes: 1 << 20, Baselines: Baselines{Link: &LinkBaseline{}}, Runs: []Run{{OK: true, TotalMs: 10}}}
		res.againstLink()
		if res.LinkFloorMs != 0 || res.Runs[0].TotalVsLink != 0 {
			t.Errorf("ratios over a zero floor: %+v", res)
		}
	})
}

package runresult

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

// A size run against the bench's own gets its medians and its totals over
// the same link, and the ratio of the two client downtimes.
func TestSummarizeAgainst(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	link := Baselines{Link: &LinkBaseline{ThroughputBps: 1e9}}
	res := MigrateResult{MemoryBytes: 125_000_000, Baselines: link,
		Runs: []Run{{OK: true, ClientDowntimeMs: 70, TotalMs: 1100}, {OK: true, ClientDowntimeMs: 90, TotalMs: 1300}, {OK: false, ClientDowntimeMs: 5}, {OK: true, ClientDowntimeMs: 80, TotalMs: 1200}},
		Against: &MigrateResult{MemoryBytes: 500_000_000,
			Runs: []Run{{OK: true, ClientDowntimeMs: 120, TotalMs: 5000}, {OK: true, ClientDowntimeMs: 90, TotalMs: 4800}, {OK: true, ClientDowntimeMs: 100, TotalMs: 4400}}}}
	res.Summarize()
	if !near(res.MedianClientDowntimeMs, 80) || !near(res.Against.MedianClientDowntimeMs, 100) {
		t.Fatalf("medians %v and %v, want 80 and 100", res.MedianClientDowntimeMs, res.Against.MedianClientDowntimeMs)
	}
	if !near(res.ClientDowntimeRatio, 1.25) {
		t.Errorf("ratio %v, want 100 / 80 = 1.25", res.ClientDowntimeRatio)
	}
	if !near(res.Against.LinkFloorMs, 4000) || !near(res.Against.MedianTotalVsLink, 1.2) {
		t.Errorf("against: floor %v ms, median %v x, want 4000 and 1.2", res.Against.LinkFloorMs, res.Against.MedianTotalVsLink)
	}
	if !near(res.MedianTotalVsLink, 1.2) {
		t.Errorf("own: median %v x the floor, want 1.2", res.MedianTotalVsLink)
	}
}

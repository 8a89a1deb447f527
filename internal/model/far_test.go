package model

import (
	"math"
	"testing"
)

// The lab's sweep of far links (docs/MODEL.md, "Far links"): 64 MiB
// memhog at 200 pages/s over 1 Gbit/s, each mode at round trips of 0, 50
// and 100 ms, the medians of two runs (downtime, total, in ms).
var farSweep = []struct {
	mode        string
	rttMs       float64
	down, total float64
}{
	{ModeCold, 0, 732, 824}, {ModeCold, 50, 1355, 2149}, {ModeCold, 100, 2789, 4345},
	{ModePrecopy, 0, 83, 806}, {ModePrecopy, 50, 270, 2213}, {ModePrecopy, 100, 455, 4342},
	{ModePostcopy, 0, 80, 913}, {ModePostcopy, 50, 315, 2699}, {ModePostcopy, 100, 449, 5058},
	{ModeHybrid, 0, 82, 888}, {ModeHybrid, 50, 254, 2254}, {ModeHybrid, 100, 452, 4426},
}

func TestFarLinks(t *testing.T) {
	p := DefaultProfile()
	for _, c := range farSweep {
		in := Inputs{MemoryBytes: 64 << 20, DirtyRatePagesPerSec: 200, BandwidthBps: 125e6, RTTSeconds: c.rttMs / 1000}
		q := Predict(p, in, c.mode, 1)
		// Downtime against the larger of it and 100 ms (issue 50's rule).
		dErr := math.Abs(q.DowntimeMs-c.down) / math.Max(c.down, 100)
		tErr := math.Abs(q.TotalMs-c.total) / c.total
		t.Logf("%-8s %3.0f ms: downtime %5.0f / %5.0f ms (%3.0f %%), total %5.0f / %5.0f ms (%3.0f %%)", c.mode, c.rttMs, q.DowntimeMs, c.down, dErr*100, q.TotalMs, c.total, tErr*100)
		if c.rttMs > 0 && (dErr > 0.3 || tErr > 0.3) {
			t.Errorf("%s at %v ms: predicted %.0f/%.0f ms, measured %.0f/%.0f", c.mode, c.rttMs, q.DowntimeMs, q.TotalMs, c.down, c.total)
		}
	}
}

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

// The far-link terms are judged by what the round trip adds to each
// mode's downtime and total: the near link's own error is the rest of the
// model's.
func TestFarLinks(t *testing.T) {
	p := DefaultProfile()
	predict := func(mode string, rttMs float64) Prediction {
		in := Inputs{MemoryBytes: 64 << 20, DirtyRatePagesPerSec: 200, BandwidthBps: 125e6, RTTSeconds: rttMs / 1000}
		return Predict(p, in, mode, 1)
	}
	near := map[string][2]float64{}
	for _, c := range farSweep {
		if c.rttMs == 0 {
			near[c.mode] = [2]float64{c.down, c.total}
		}
	}
	for _, c := range farSweep {
		if c.rttMs == 0 {
			continue
		}
		q, q0 := predict(c.mode, c.rttMs), predict(c.mode, 0)
		dPred, dMeas := q.DowntimeMs-q0.DowntimeMs, c.down-near[c.mode][0]
		tPred, tMeas := q.TotalMs-q0.TotalMs, c.total-near[c.mode][1]
		dErr, tErr := math.Abs(dPred-dMeas)/dMeas, math.Abs(tPred-tMeas)/tMeas
		t.Logf("%-8s %3.0f ms: downtime +%5.0f / +%5.0f ms (%3.0f %%), total +%5.0f / +%5.0f ms (%3.0f %%)", c.mode, c.rttMs, dPred, dMeas, dErr*100, tPred, tMeas, tErr*100)
		if dErr > 0.35 || tErr > 0.25 {
			t.Errorf("%s at %v ms: the round trip adds %.0f ms of downtime and %.0f ms in all, the lab measured %.0f and %.0f", c.mode, c.rttMs, dPred, tPred, dMeas, tMeas)
		}
	}
}

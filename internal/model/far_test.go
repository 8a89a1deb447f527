package model

import (
	"math"
	"testing"
)

// The lab's sweep of far links (docs/MODEL.md, "Far links"): 64 MiB
// memhog at 200 pages/s over 1 Gbit/s, each mode at round trips of 0, 50
// and 100 ms, the medians of two runs (downtime, total, in ms); taken
// again on 2026-11-29 after the hosts' TCP buffers grew and the
// switchover stopped waiting for the frozen state's acknowledgements.
var farSweep = []struct {
	mode        string
	rttMs       float64
	down, total float64
}{
	{ModeCold, 0, 762, 853}, {ModeCold, 50, 1083, 1868}, {ModeCold, 100, 1380, 2900},
	{ModePrecopy, 0, 54, 771}, {ModePrecopy, 50, 160, 1562}, {ModePrecopy, 100, 271, 2641},
	{ModePostcopy, 0, 67, 852}, {ModePostcopy, 50, 163, 1967}, {ModePostcopy, 100, 265, 3192},
	{ModeHybrid, 0, 66, 866}, {ModeHybrid, 50, 171, 1697}, {ModeHybrid, 100, 263, 2725},
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

package engine

import (
	"math"
	"strings"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// The model's account of each migration (Report.Model): the prediction it
// was planned with, from what was known before the freeze, and after it
// ends what it measured against it, term by term. The agent learns its
// profile from these.

// planAtFreeze records the prediction for the mode this migration runs,
// once, just before the freeze. Mode auto planned with what it measured
// (memory, dirty rate, shared memory, the link's probe); the other modes
// predict from what they know by now without measuring anything more:
// the memory the first round found (or the resident memory), the last
// live round's dirty rate (0 without rounds) and as the link the request's
// bandwidth cap, or what the first round carried (none, for cold and
// post-copy without a cap: a link that does not limit).
func (m *migration) planAtFreeze() {
	if m.report.Model != nil {
		return
	}
	var live []Round
	for _, r := range m.report.Rounds {
		if !r.Final {
			live = append(live, r)
		}
	}
	pi := api.PlanInputs{Rounds: len(live), Tracked: strings.HasPrefix(m.report.WriteTracking, "userfaultfd")}
	if in := m.autoInputs; in != nil {
		pi.MemoryBytes, pi.DirtyRate, pi.SharedBytes, pi.BandwidthBps = in.MemoryBytes, in.DirtyRatePagesPerSec, in.SharedBytes, in.BandwidthBps
	} else {
		mem := m.report.MemoryEstimate
		if mem == 0 {
			mem = procs.TreeResident(m.ctr.PID)
		}
		pi.MemoryBytes = float64(mem)
		if n := len(live); n > 0 {
			pi.DirtyRate = live[n-1].DirtyRate
		}
		switch {
		case m.req.MaxBandwidthBps > 0:
			pi.BandwidthBps = float64(m.req.MaxBandwidthBps) / 8
		case len(live) > 0 && live[0].DurationMs > 0:
			// The first round sent all of memory: what the link carried
			// then (its reading of memory included, a few per cent).
			pi.BandwidthBps = float64(live[0].Bytes) / (live[0].DurationMs / 1000)
		}
	}
	planned := PlanFor(model.Inputs{}, m.rt.Caps())
	pi.NoLazyRestore, pi.CopiesImages = planned.NoLazyRestore, planned.CopiesImages
	mode := m.req.Mode
	if mode == ModePrecopy && m.req.Precopy.Engine == PrecopyNative {
		mode = model.ModeNativePrecopy
	}
	pred := model.PredictReport(m.profile, pi, mode)
	if c := m.report.Auto; c != nil {
		for _, q := range c.Predictions {
			if q.Mode == c.Chosen {
				pred = q // what auto decided on, at the rounds it planned
			}
		}
	}
	if !finite(pred.DowntimeMs, pred.TotalMs, pred.DowntimeHighMs, pred.TotalHighMs, pred.Bytes) {
		return // no prediction (a profile the model refuses): nothing to learn, and JSON has no NaN
	}
	m.report.Model = &api.ModelCheck{Inputs: pi, Profile: m.profile.Source, Prediction: pred}
}

// checkModel adds what a finished migration measured against its
// prediction: each term it fed, and whether downtime and total fell
// outside the interval.
func (m *migration) checkModel(r *Report) {
	c := r.Model
	if c == nil || !r.OK {
		return
	}
	c.Outside = model.Outside(c.Prediction, r.DowntimeMs, r.TotalMs)
	if c.Prediction.Mode == model.ModeNativePrecopy {
		return // PAM's terms are not the profile's
	}
	c.Terms = model.CheckTerms(m.profile, c.Inputs, *r)
}

func finite(xs ...float64) bool {
	for _, x := range xs {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return false
		}
	}
	return true
}

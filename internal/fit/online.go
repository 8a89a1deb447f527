package fit

import (
	"math"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/runresult"
)

// The online refit: an agent's own migrations, each report carrying the
// inputs it was planned with (api.ModelCheck), fitted into its profile by
// the same term fitters as a calibration, so that a host's model follows
// what it measures without a calibration run.

// MinOnlineSamples is how many migrations must have fed a term before the
// online refit replaces the base profile's value with theirs.
const MinOnlineSamples = 5

// OnlineTerm is one term of an online refit.
type OnlineTerm struct {
	Term
	// Migrations is how many reports measured the term.
	Migrations int `json:"migrations"`
	// Refitted: its fit replaced the base profile's values (enough
	// migrations, and the fit succeeded).
	Refitted bool `json:"refitted"`
}

// onlineTerm is a term the online refit fits; hashed terms read only runs
// whose rounds hashed all memory (write tracking reads only the pages
// written, which says nothing of read_hash_bps).
type onlineTerm struct {
	name   string
	fit    func([]Measured, *model.Profile) (Term, error)
	hashed bool
}

// onlineTerms are Fit's terms in Fit's order, less those a host's own
// migrations cannot measure: the link's efficiency (it needs the link's
// capacity, known only to a shaped lab) and the lazy-pages pull (its
// fitter fits the pull without the push, which no longer predicts
// post-copy; its error is still checked and reported).
var onlineTerms = []onlineTerm{
	{name: "freeze", fit: fitFreeze},
	{name: "read-hash", fit: fitReadHash, hashed: true},
	{name: "frozen-read", fit: fitFrozenRead, hashed: true},
	{name: "dump-fixed", fit: func(ms []Measured, p *model.Profile) (Term, error) { return fitDumpFixed(ms, p) }},
	// The base profile's φ stands until post-copy refits it; cold's dump
	// streams over a link of unknown speed, so only pre-copy's dump counts.
	{name: "dump", fit: func(ms []Measured, p *model.Profile) (Term, error) {
		return fitDump(withoutMode(ms, model.ModeCold), p, true)
	}},
	{name: "restore", fit: fitRestoreOnline},
	{name: "lazy-setup", fit: fitLazySetup},
	{name: "local-fill", fit: fitLocalFill},
	{name: "image-fill", fit: fitImageFill},
	{name: "redirty", fit: fitRedirty},
	{name: "setup", fit: fitOverhead},
}

// FitOnline refits base from an agent's successful reports, term by term
// in Fit's order (a later term builds on the values an earlier one left):
// a term takes the fit's values once at least minSamples migrations fed
// it and the fit succeeded, and keeps base's otherwise. since, by term
// name, leaves out the reports started before a time: those from before
// the host changed (see package learn).
func FitOnline(reps []api.Report, base model.Profile, minSamples int, since map[string]time.Time) (model.Profile, []OnlineTerm) {
	p := base
	var out []OnlineTerm
	for _, ot := range onlineTerms {
		name := ot.name
		use := reps
		if t0, ok := since[name]; ok {
			use = nil
			for _, r := range reps {
				if !r.StartedAt.Before(t0) {
					use = append(use, r)
				}
			}
		}
		ms, hashed := reportsMeasured(use)
		if ot.hashed {
			ms = hashed
		}
		q := p
		t, err := ot.fit(ms, &q)
		o := OnlineTerm{Term: t}
		for _, m := range ms {
			one := p
			if t1, _ := ot.fit([]Measured{m}, &one); len(t1.Y) > 0 {
				o.Migrations++
			}
		}
		if err == nil && o.Migrations >= minSamples {
			p, o.Refitted = q, true
		} else {
			o.Sets = nil
			if err != nil {
				o.Note = joinNotes(o.Note, err.Error())
			}
		}
		out = append(out, o)
	}
	p.PAM.Beta, p.PAM.Psi, p.PAM.Omega = p.FreezeS, p.RestoreFixedS, 1/p.RestoreBps
	return p, out
}

// reportsMeasured turns reports into calibration measurements: one point
// and run per report, at the memory and dirty rate it was planned with,
// on a link counted as unshaped (the refit fits the host's own costs).
// hashed are those whose live rounds hashed all memory.
func reportsMeasured(reps []api.Report) (all, hashed []Measured) {
	for _, r := range reps {
		if !r.OK || r.Model == nil {
			continue
		}
		pi := r.Model.Inputs
		res := runresult.MigrateResult{Mode: r.Mode, Runtime: r.Runtime, MemoryBytes: int64(pi.MemoryBytes), Runs: []runresult.Run{runresult.RunOf(r)}}
		m := Measured{Point: Point{Mode: r.Mode, MemoryBytes: int64(pi.MemoryBytes), DirtyRate: int(math.Round(pi.DirtyRate))}, Result: &res}
		all = append(all, m)
		if !pi.Tracked {
			hashed = append(hashed, m)
		}
	}
	return all, hashed
}

// fitRestoreOnline is fitRestore, or where every migration had the same
// memory (a host moving one kind of container) only its fixed part, the
// rate kept: one size cannot tell the two apart, and the fixed part is
// what moves the prediction at that size.
func fitRestoreOnline(ms []Measured, p *model.Profile) (Term, error) {
	t, err := fitRestore(ms, p)
	if err == nil || len(t.Y) == 0 || distinct(t.X) != 1 {
		return t, err
	}
	var ys []float64
	for i, y := range t.Y {
		ys = append(ys, y-t.X[i]/p.RestoreBps)
	}
	t.Kind, t.Free = "constant", nil
	t.Note = "one memory size: its fixed part refitted, restore_bps kept"
	return fitConstant(Term{Name: t.Name, From: t.From, Kind: t.Kind, X: t.X, Y: ys, Note: t.Note}, "restore_fixed_s", &p.RestoreFixedS)
}

func withoutMode(ms []Measured, mode string) []Measured {
	var out []Measured
	for _, m := range ms {
		if m.Mode != mode {
			out = append(out, m)
		}
	}
	return out
}

// FitIntervals makes each engine mode's prediction interval from the
// reports' residuals under profile p: measured over predicted downtime
// and total, of the last perMode reports of the mode whose link was
// known (a prediction over an unknown link leaves the link out, so its
// total says nothing of the model's error).
func FitIntervals(reps []api.Report, p model.Profile, perMode int) []model.Interval {
	var out []model.Interval
	for _, mode := range model.EngineModes {
		var down, total []float64
		for i := len(reps) - 1; i >= 0 && len(down) < perMode; i-- {
			r := reps[i]
			if !r.OK || r.Model == nil || r.Mode != mode || r.Model.Inputs.BandwidthBps <= 0 || r.Model.Prediction.Mode != mode {
				continue
			}
			q := model.PredictReport(p, r.Model.Inputs, mode)
			if !(q.DowntimeMs > 0) || !(q.TotalMs > 0) {
				continue
			}
			down, total = append(down, r.DowntimeMs/q.DowntimeMs), append(total, r.TotalMs/q.TotalMs)
		}
		out = append(out, model.FitInterval(mode, down, total))
	}
	return out
}

// CalibrationIntervals are the modes' intervals from a calibration's own
// runs: each successful run's measured over predicted downtime and total
// under the profile fitted from them (in-sample, so a little narrow; the
// agent's own migrations replace them once it has enough). The runs
// hashed all memory, so they are predicted without write tracking.
func CalibrationIntervals(ms []Measured, p model.Profile) []model.Interval {
	q := p
	q.WriteTracking = false
	var out []model.Interval
	for _, mode := range model.EngineModes {
		var down, total []float64
		for _, m := range ms {
			if m.Result == nil || m.Mode != mode {
				continue
			}
			for _, r := range OKRuns(*m.Result) {
				pi := api.PlanInputs{MemoryBytes: float64(m.MemoryBytes), DirtyRate: float64(m.DirtyRate),
					BandwidthBps: float64(m.BandwidthBps) / 8, Rounds: LiveRounds(r)}
				pr := model.PredictReport(q, pi, mode)
				if pr.DowntimeMs > 0 && pr.TotalMs > 0 && r.DowntimeMs > 0 && r.TotalMs > 0 {
					down, total = append(down, r.DowntimeMs/pr.DowntimeMs), append(total, r.TotalMs/pr.TotalMs)
				}
			}
		}
		out = append(out, model.FitInterval(mode, down, total))
	}
	return out
}

// Package calibrate fits a host's model.Profile from migrations measured
// in ferry's lab, and checks the models' predictions against migrations
// the fit did not see.
//
// Each profile parameter comes from the phase of a migration that the
// model says it governs (docs/MODEL.md, "Validation"):
//
//	freeze_s                   the freeze phase, every mode (mean)
//	read_hash_bps              pre-copy rounds after the first, duration vs memory
//	dump_fixed_s               post-copy's dump: a memory-less CRIU dump
//	dump_bps                   pre-copy's deduplicating dump (+ images)
//	                           minus its hashing and φ, vs memory
//	restore_fixed_s, _bps      the restore phase of cold and pre-copy vs memory
//	lazy_setup_s               post-copy's dump + restore beyond the fixed costs
//	lazy_bps                   post-copy's commit + lazy-pages vs memory
//	link_efficiency            pre-copy's first round over a shaped link
//
// Calibration runs on unshaped links so that the host's own costs show; one
// shaped point measures how much of the link ferry's stream gets.
package calibrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/model"
)

// Term is how one group of profile parameters was fitted.
type Term struct {
	Name string `json:"name"`
	From string `json:"from"` // what was measured
	// Kind of fit: "line" (a + b·x), "proportional" (b·x), "constant"
	// (the mean) or "ratio" (a mean of per-run ratios).
	Kind string `json:"kind"`
	// Sets are the profile fields (JSON names) this term gives, and their
	// values. Empty when the term only reports (a cost outside the model)
	// or could not be fitted.
	Sets map[string]float64 `json:"sets"`
	// Fit is the fit the values come from: R², RMSE and residuals, in
	// seconds (link efficiency: a fraction).
	Fit model.LinearFit `json:"fit"`
	// Free is an unconstrained line through the same points, where the
	// model's form has no intercept or no slope: how far the form is off.
	Free *model.LinearFit `json:"free_fit,omitempty"`
	// X (memory, bytes) and Y (seconds) are the points, in residual order.
	X    []float64 `json:"x"`
	Y    []float64 `json:"y"`
	Note string    `json:"note,omitempty"`
}

// Report is what a calibration measured and fitted.
type Report struct {
	Profile  model.Profile `json:"profile"`
	Grid     string        `json:"grid"` // "quick", "default" or "custom"
	Repeat   int           `json:"repeat"`
	Started  time.Time     `json:"started"`
	WallS    float64       `json:"wall_s"`
	Terms    []Term        `json:"terms"`
	Warnings []string      `json:"warnings,omitempty"`
	Points   []Measured    `json:"points"`
}

// Run measures the grid and fits a profile. The profile starts from
// model.DefaultProfile, so a parameter that cannot be fitted keeps its
// default (Report.Warnings says which). With a bench error (for example
// a lab already up) it stops and returns what it measured so far.
func Run(ctx context.Context, opts Options) (model.Profile, Report, error) {
	o := opts.withDefaults()
	rep := Report{Started: time.Now(), Repeat: o.Repeat, Grid: "default"}
	switch {
	case len(opts.Memories) > 0 || len(opts.DirtyRates) > 0:
		rep.Grid = "custom"
	case o.Quick:
		rep.Grid = "quick"
	}
	measured, err := sweep(ctx, Grid(o), o.sweep())
	rep.Points = measured
	rep.WallS = time.Since(rep.Started).Seconds()
	if err != nil {
		return model.Profile{}, rep, err
	}
	return Refit(ctx, rep, o)
}

// Refit fits a profile again from a report's measurements (its Points),
// without measuring anything: for a report saved by an earlier run.
func Refit(ctx context.Context, rep Report, o Options) (model.Profile, Report, error) {
	base := model.DefaultProfile()
	base.Host, _ = os.Hostname()
	features := o.Features
	if features == nil {
		features = criu.ProbeFeatures
	}
	feats := features(ctx)
	base.SoftDirty, base.LazyDump = feats.DirtyTracking, feats.LazyPages
	tracking := o.WriteTracking
	if tracking == nil {
		tracking = dirty.Available
	}
	base.WriteTracking = tracking() == nil
	base.Source = fmt.Sprintf("ferry calibrate, %s grid, %s", rep.Grid, rep.Started.UTC().Format(time.RFC3339))
	p, terms, warns := Fit(rep.Points, base)
	p.Intervals = CalibrationIntervals(rep.Points, p)
	rep.Profile, rep.Terms, rep.Warnings = p, terms, warns
	return p, rep, p.Validate()
}

// ErrNoData: a term had no usable measurement.
var ErrNoData = errors.New("no usable measurement")

// samples holds the successful runs of the points matching a filter, each
// with its point's nominal memory: the model's input is what a user would
// give `ferry plan`, so the fit uses it too.
type sample struct {
	m float64
	r bench.Run
	p Point
}

func collect(ms []Measured, keep func(Point) bool) []sample {
	var out []sample
	for _, m := range ms {
		if m.Result == nil || !keep(m.Point) {
			continue
		}
		for _, r := range okRuns(*m.Result) {
			out = append(out, sample{m: float64(m.MemoryBytes), r: r, p: m.Point})
		}
	}
	return out
}

func unshaped(modes ...string) func(Point) bool {
	return func(p Point) bool {
		if p.BandwidthBps != 0 {
			return false
		}
		for _, m := range modes {
			if p.Mode == m {
				return true
			}
		}
		return len(modes) == 0
	}
}

// Fit derives a profile from measurements, starting from base. Terms
// depend on each other in this order: read-hash before dump (pre-copy's
// dump includes hashing), dump and restore before lazy setup.
func Fit(ms []Measured, base model.Profile) (model.Profile, []Term, []string) {
	p := base
	var terms []Term
	var warns []string
	add := func(t Term, err error) {
		if err != nil {
			warns = append(warns, fmt.Sprintf("%s: %v; kept the default", t.Name, err))
			t.Sets = map[string]float64{}
			if t.Note == "" {
				t.Note = err.Error()
			}
		}
		terms = append(terms, t)
	}
	add(fitFreeze(ms, &p))
	add(fitReadHash(ms, &p))
	add(fitFrozenRead(ms, &p))
	phi, err := fitDumpFixed(ms, &p)
	phiKnown := err == nil
	if phiKnown {
		add(phi, nil)
	}
	add(fitDump(ms, &p, phiKnown))
	add(fitRestore(ms, &p))
	add(fitLazySetup(ms, &p))
	add(fitLink(ms, &p)) // the shaped post-copy runs in fitLazy need it
	add(fitLazy(ms, &p))
	add(fitLocalFill(ms, &p))
	add(fitImageFill(ms, &p))
	add(fitRedirty(ms, &p))
	add(fitOverhead(ms, &p))
	// PAM's constants that are the same quantities as the profile's.
	p.PAM.Beta = p.FreezeS
	p.PAM.Psi = p.RestoreFixedS
	p.PAM.Omega = 1 / p.RestoreBps
	return p, terms, warns
}

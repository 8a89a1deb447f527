// Package calibrate measures migrations in ferry's lab and fits a host's
// model.Profile to them (the fitting itself is package fit's), and checks
// the models' predictions against migrations the fit did not see.
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
	"fmt"
	"os"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/fit"
	"github.com/ferry-migrate/ferry/internal/model"
)

// The fit's types, named here as calibration reports always named them
// (their JSON is the reports' on disk).
type (
	Term     = fit.Term
	Point    = fit.Point
	Measured = fit.Measured
)

// ErrNoData: a term had no usable measurement.
var ErrNoData = fit.ErrNoData

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
	base.Source = fmt.Sprintf("ferry-lab calibrate, %s grid, %s", rep.Grid, rep.Started.UTC().Format(time.RFC3339))
	p, terms, warns := fit.Fit(rep.Points, base)
	p.Intervals = fit.CalibrationIntervals(rep.Points, p)
	rep.Profile, rep.Terms, rep.Warnings = p, terms, warns
	return p, rep, p.Validate()
}

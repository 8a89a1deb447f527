// Package fit fits a host's model.Profile to measured migrations: the
// term fitters (one per group of profile parameters, each on the phase of
// a migration the model says it governs, docs/MODEL.md), Fit for a
// calibration's grid of runs and FitOnline for an agent's own reports.
//
// It drives nothing: internal/calibrate measures the runs in the lab and
// internal/learn feeds an agent's reports, so that the agent links no lab.
package fit

import (
	"errors"
	"fmt"

	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/runresult"
	"github.com/ferry-migrate/ferry/internal/units"
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

// Point is one cell of a measurement grid.
type Point struct {
	Mode         string `json:"mode"`
	MemoryBytes  int64  `json:"memory_bytes"`
	DirtyRate    int    `json:"dirty_rate"`    // pages per second
	BandwidthBps int64  `json:"bandwidth_bps"` // bits per second; 0 = unshaped
	// Baselines asked of the bench at this point ("link").
	Baselines []string `json:"baselines,omitempty"`
}

func (p Point) String() string {
	bw := "unshaped"
	if p.BandwidthBps > 0 {
		bw = units.FormatRate(p.BandwidthBps)
	}
	return fmt.Sprintf("%s %dM %dp/s %s", p.Mode, p.MemoryBytes>>20, p.DirtyRate, bw)
}

// Measured is a grid point with what the bench reported.
type Measured struct {
	Point
	Result *runresult.MigrateResult `json:"result,omitempty"`
	Error  string                   `json:"error,omitempty"`
	WallS  float64                  `json:"wall_s"`
}

// ErrNoData: a term had no usable measurement.
var ErrNoData = errors.New("no usable measurement")

// samples holds the successful runs of the points matching a filter, each
// with its point's nominal memory: the model's input is what a user would
// give `ferry plan`, so the fit uses it too.
type sample struct {
	m float64
	r runresult.Run
	p Point
}

func collect(ms []Measured, keep func(Point) bool) []sample {
	var out []sample
	for _, m := range ms {
		if m.Result == nil || !keep(m.Point) {
			continue
		}
		for _, r := range OKRuns(*m.Result) {
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

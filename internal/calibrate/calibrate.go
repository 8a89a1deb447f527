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
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/model"
)

// Options configure Run.
type Options struct {
	// Quick measures a smaller grid (64M and 256M at 100 pages/s).
	Quick bool
	// Memories and DirtyRates override the grid (bytes, pages/s).
	Memories   []int64
	DirtyRates []int
	// Repeat is the migrations per point; 0 means 2.
	Repeat int
	// ShapedBps is the link rate of the link-efficiency point, bits/s; 0
	// means 300 Mbit/s (not a validation rate).
	ShapedBps int64
	// FaultRates are extra post-copy dirty rates, so that the pull's fault
	// term (fault_s) sees more than one rate; default 3000 pages/s, none
	// with Quick.
	FaultRates []int
	// FerryBin is the ferry binary the lab runs (memhog next to it).
	FerryBin string
	// Progress, if set, hears of every point and bench step.
	Progress func(Progress)
	// Log receives the bench's step lines.
	Log io.Writer
	// Run measures a point; nil means bench.Migrate.
	Run Runner
	// Features says what the kernel supports; nil means criu.ProbeFeatures.
	Features func(context.Context) criu.Features
}

// Defaults of the grid.
var (
	DefaultMemories   = []int64{64 << 20, 128 << 20, 256 << 20, 512 << 20}
	DefaultDirtyRates = []int{0, 2000}
	QuickMemories     = []int64{64 << 20, 256 << 20}
	QuickDirtyRates   = []int{100}
	DefaultFaultRates = []int{3000}
)

// shapedFaultRate is a post-copy dirty rate on the shaped link between
// quiet and FaultRates (the validation grid's are 500 and 4000 pages/s).
const shapedFaultRate = 1000

// DefaultShapedBps is the calibration's shaped link: 300 Mbit/s.
const DefaultShapedBps = 300_000_000

// Calibrated modes: the ones whose phases identify a profile parameter.
// Hybrid adds no parameter of its own.
var calibratedModes = []string{model.ModeCold, model.ModePrecopy, model.ModePostcopy, model.ModeHybrid}

func (o Options) withDefaults() Options {
	if len(o.Memories) == 0 {
		o.Memories = DefaultMemories
		if o.Quick {
			o.Memories = QuickMemories
		}
	}
	if len(o.DirtyRates) == 0 {
		o.DirtyRates = DefaultDirtyRates
		if o.Quick {
			o.DirtyRates = QuickDirtyRates
		}
	}
	if o.Repeat <= 0 {
		o.Repeat = 2 // one run per point is too noisy on a 2-core host
	}
	if o.ShapedBps <= 0 {
		o.ShapedBps = DefaultShapedBps
	}
	if o.FaultRates == nil && !o.Quick {
		o.FaultRates = DefaultFaultRates
	}
	return o
}

// Grid lists the points Run measures: every calibrated mode at every
// memory and dirty rate on unshaped links, then one pre-copy over a shaped
// link (the largest memory up to 128 MiB, the lowest dirty rate) with the
// link baseline.
func Grid(o Options) []Point {
	o = o.withDefaults()
	var pts []Point
	for _, m := range o.Memories {
		for _, r := range o.DirtyRates {
			for _, mode := range calibratedModes {
				pts = append(pts, Point{Mode: mode, MemoryBytes: m, DirtyRate: r})
			}
		}
	}
	for _, m := range o.Memories {
		for _, r := range o.FaultRates {
			pts = append(pts, Point{Mode: model.ModePostcopy, MemoryBytes: m, DirtyRate: r})
		}
	}
	shapedMem := o.Memories[0]
	for _, m := range o.Memories {
		if m <= 128<<20 && m > shapedMem {
			shapedMem = m
		}
	}
	lowRate := o.DirtyRates[0]
	for _, r := range o.DirtyRates {
		lowRate = min(lowRate, r)
	}
	pts = append(pts, Point{Mode: model.ModePrecopy, MemoryBytes: shapedMem, DirtyRate: lowRate,
		BandwidthBps: o.ShapedBps, Baselines: []string{"link"}})
	// Post-copy over the same link: how far its requests' time on the link
	// and on the hosts overlap (lazy_serial_share), and how round trips and
	// faults share the cost of small requests, quiet to faulting.
	rates := append([]int{lowRate}, o.FaultRates...)
	if !o.Quick {
		rates = append(rates, shapedFaultRate)
	}
	for _, r := range slices.Compact(slices.Sorted(slices.Values(rates))) {
		pts = append(pts, Point{Mode: model.ModePostcopy, MemoryBytes: shapedMem, DirtyRate: r, BandwidthBps: o.ShapedBps})
	}
	return pts
}

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
	measured, err := sweep(ctx, Grid(o), o.Repeat, o.FerryBin, o.Run, o.Progress, o.Log)
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
	base.Source = fmt.Sprintf("ferry calibrate, %s grid, %s", rep.Grid, rep.Started.UTC().Format(time.RFC3339))
	p, terms, warns := Fit(rep.Points, base)
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

func fitFreeze(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "freeze", Kind: "constant", From: "freeze phase of every unshaped run (the model's β is a constant)"}
	for _, s := range collect(ms, unshaped()) {
		if hasPhase(s.r, "freeze") {
			t.X, t.Y = append(t.X, s.m), append(t.Y, phaseS(s.r, "freeze"))
		}
	}
	return fitConstant(t, "freeze_s", &p.FreezeS)
}

func fitReadHash(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "read-hash", Kind: "proportional",
		From: "pre-copy rounds after the first (little to send) vs memory: duration = M/read_hash_bps"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy)) {
		for _, rd := range s.r.Rounds {
			if rd.Index >= 1 && !rd.Final {
				t.X, t.Y = append(t.X, s.m), append(t.Y, rd.DurationMs/1000)
			}
		}
	}
	t, err := fitRate(t, "read_hash_bps", &p.ReadHashBps)
	if err == nil && t.Free != nil {
		t.Note = fmt.Sprintf("a free line puts %.0f ms per round outside memory (the model has no per-round fixed cost)", t.Free.A*1000)
	}
	return t, err
}

// fitFrozenRead fits the last round read while the container is frozen
// (hybrid, pre-copy's rebuild switchover): it runs beside CRIU's
// memory-less dump with nothing else competing.
func fitFrozenRead(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "frozen-read", Kind: "proportional",
		From: "the frozen last round (hybrid, pre-copy rebuild) vs memory: duration = M/frozen_read_bps"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy, model.ModeHybrid)) {
		for _, rd := range s.r.Rounds {
			if rd.Final {
				t.X, t.Y = append(t.X, s.m), append(t.Y, rd.DurationMs/1000)
			}
		}
	}
	return fitRate(t, "frozen_read_bps", &p.FrozenReadBps)
}

// fitDumpFixed measures φ directly: post-copy's dump is a memory-less
// (lazy) CRIU dump, which is what the profile's dump_fixed_s stands for,
// and it includes sending the images, as pre-copy's dump+images does.
func fitDumpFixed(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "dump-fixed", Kind: "constant",
		From: "post-copy's dump (+ images): a memory-less CRIU dump, the model's φ"}
	for _, s := range collect(ms, unshaped(model.ModePostcopy)) {
		t.X, t.Y = append(t.X, s.m), append(t.Y, phaseS(s.r, "dump", "images"))
	}
	return fitConstant(t, "dump_fixed_s", &p.DumpFixedS)
}

// fitDump fits the switchover dump's memory part on pre-copy's
// deduplicating dump, a full local CRIU dump whose pages are hashed and
// mostly replaced by references: the model's φ + M/dump_bps +
// M/read_hash_bps. With φ measured (phiKnown) the rest is proportional to
// M; without, φ comes from the same line. Cold's dump streams every page
// through the session instead; its own line is reported, and used only
// when no pre-copy was measured.
func fitDump(ms []Measured, p *model.Profile, phiKnown bool) (Term, error) {
	t := Term{Name: "dump", Kind: "line",
		From: "pre-copy's dedup dump+images minus M/read_hash_bps, vs memory: φ + M/dump_bps"}
	var cx, cy []float64
	for _, s := range collect(ms, unshaped(model.ModeCold, model.ModePrecopy)) {
		y := phaseS(s.r, "dump", "images")
		if s.r.FillMs > 0 {
			continue // pre-copy's rebuild switchover: no full dump
		}
		if s.p.Mode == model.ModePrecopy {
			t.X, t.Y = append(t.X, s.m), append(t.Y, y-s.m/p.ReadHashBps)
		} else {
			cx, cy = append(cx, s.m), append(cy, y)
		}
	}
	fromCold := distinct(t.X) < 1 || (!phiKnown && distinct(t.X) < 2)
	if fromCold {
		t.From = "cold's dump+images (streamed to the destination) vs memory: φ + M/dump_bps (no pre-copy measured)"
		t.X, t.Y = cx, cy
	}
	if phiKnown {
		t.Kind = "proportional"
		t.From = strings.Replace(t.From, "vs memory: φ + M/dump_bps", "less dump_fixed_s, vs memory: M/dump_bps", 1)
		for i := range t.Y {
			t.Y[i] -= p.DumpFixedS
		}
		f, ok := fitThroughOrigin(t.X, t.Y)
		if !ok || !(f.B > 0) {
			return t, fmt.Errorf("dump time does not grow with memory")
		}
		t.Fit = f
		p.DumpBps = 1 / f.B
		p.DumpKneeBytes, p.DumpBpsAbove = 0, 0
		t.Sets = map[string]float64{"dump_bps": p.DumpBps}
		if t.Free = freeLine(t.X, t.Y); t.Free != nil {
			t.Note = fmt.Sprintf("a free line has %.0f ms at M = 0 beyond φ", t.Free.A*1000)
		}
		if knee, below, above, rmse, ok := twoRates(t.X, t.Y); ok && rmse < 0.8*f.RMSE {
			p.DumpBps, p.DumpKneeBytes, p.DumpBpsAbove = 1/below, knee, 1/above
			t.Kind = "two rates"
			t.Sets = map[string]float64{"dump_bps": p.DumpBps, "dump_knee_bytes": knee, "dump_bps_above": p.DumpBpsAbove}
			t.Note = joinNotes(t.Note, fmt.Sprintf("two rates around %.0f MiB fit with RMSE %.1f ms instead of %.1f ms",
				knee/(1<<20), rmse*1000, f.RMSE*1000))
		} else {
			t.Note = joinNotes(t.Note, kneeNote(t.X, t.Y, f.RMSE))
		}
	} else {
		f, why, err := fixedPlusRate(&t)
		if err != nil {
			return t, err
		}
		p.DumpFixedS, p.DumpBps = f.A, 1/f.B
		t.Sets = map[string]float64{"dump_fixed_s": p.DumpFixedS, "dump_bps": p.DumpBps}
		t.Note = why
	}
	if c := freeLine(cx, cy); c != nil && !fromCold {
		t.Note = joinNotes(t.Note, "cold's streamed dump on an unshaped link: "+subFits(map[string][2][]float64{"": {cx, cy}})+
			"; the model's cold takes max(M/dump_bps, M/(η·L)), so it is optimistic for cold where the link outruns that rate")
	}
	return t, nil
}

func fitRestore(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "restore", Kind: "line", From: "restore phase of cold and pre-copy (restore until the destination answers; pre-copy's image fill taken out) vs memory: ψ + M/restore_bps"}
	var rx, ry, cx, cy, px, py []float64
	for _, s := range collect(ms, unshaped(model.ModeCold, model.ModePrecopy)) {
		// The rebuild switchover writes the pages image first (image-fill).
		y := phaseS(s.r, "restore") - s.r.FillMs/1000
		t.X, t.Y = append(t.X, s.m), append(t.Y, y)
		rx, ry = append(rx, s.m), append(ry, s.r.RestoreMs/1000)
		if s.p.Mode == model.ModeCold {
			cx, cy = append(cx, s.m), append(cy, y)
		} else {
			px, py = append(px, s.m), append(py, y)
		}
	}
	f, why, err := fixedPlusRate(&t)
	if err != nil {
		return t, err
	}
	p.RestoreFixedS, p.RestoreBps = f.A, 1/f.B
	t.Sets = map[string]float64{"restore_fixed_s": p.RestoreFixedS, "restore_bps": p.RestoreBps}
	t.Note = joinNotes(why, subFits(map[string][2][]float64{"runc restore alone (restore_ms)": {rx, ry}, "cold alone": {cx, cy}, "pre-copy alone": {px, py}}))
	return t, nil
}

// fixedPlusRate fits t's points to a + b·x with a ≥ 0 (a fixed cost
// cannot be negative): the free least-squares line, or, when its
// intercept is negative, the best line through the origin, which is the
// constrained optimum then. With four memory sizes or more it also says
// whether a line with a knee fits much better (time growing faster than
// linearly, which the model cannot express).
func fixedPlusRate(t *Term) (model.LinearFit, string, error) {
	f, err := model.FitLinear(t.X, t.Y)
	if err != nil {
		return f, "", err
	}
	var notes []string
	if f.A < 0 {
		free := f
		t.Free = &free
		f, _ = fitThroughOrigin(t.X, t.Y)
		notes = append(notes, fmt.Sprintf("the free line's intercept is %.0f ms, so the fixed part is 0 and the line goes through the origin", free.A*1000))
	}
	if !(f.B > 0) {
		return f, "", fmt.Errorf("time does not grow with memory (slope %.3g s/B)", f.B)
	}
	t.Fit = f
	if k := kneeNote(t.X, t.Y, f.RMSE); k != "" {
		notes = append(notes, k)
	}
	return f, strings.Join(notes, "; "), nil
}

// kneeNote says, with four memory sizes or more, whether two lines with a
// knee fit much better than the model's one (time growing faster or
// slower than linearly, which the model cannot express).
func kneeNote(x, y []float64, rmse float64) string {
	pw, err := model.FitPiecewiseAuto(x, y)
	if err != nil || !(pw.RMSE < 0.7*rmse) {
		return ""
	}
	return fmt.Sprintf("a knee at %.0f MiB fits better (R² %.3f): below, %.0f ms + M at %.0f MB/s; above, %.0f ms + M at %.0f MB/s",
		pw.Knee/(1<<20), pw.R2, pw.Below.A*1000, rateMBs(pw.Below.B), pw.Above.A*1000, rateMBs(pw.Above.B))
}

func rateMBs(slope float64) float64 {
	if slope <= 0 {
		return math.Inf(1)
	}
	return 1 / slope / 1e6
}

func joinNotes(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

func fitLazySetup(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "lazy-setup", Kind: "constant",
		From: "post-copy's dump+images+restore minus dump_fixed_s and restore_fixed_s (the model's lazy downtime is constant in M)"}
	for _, s := range collect(ms, unshaped(model.ModePostcopy)) {
		t.X = append(t.X, s.m)
		t.Y = append(t.Y, phaseS(s.r, "dump", "images", "restore")-p.DumpFixedS-p.RestoreFixedS)
	}
	t, err := fitConstant(t, "lazy_setup_s", &p.LazySetupS)
	if err == nil && t.Free != nil {
		t.Note = fmt.Sprintf("post-copy downtime grows by %.0f ms per 100 MiB (the model says 0)", t.Free.B*100*(1<<20)*1000)
	}
	return t, err
}

// fitLazy fits the lazy-pages daemon's pull (model.LazyPull) to post-copy's
// commit+lazy-pages phases. fault_wait_s comes from the faults the runs
// counted; lazy_request_s is searched (a log grid, then golden section);
// for each, lazy_bps follows in closed form from the unshaped runs with
// nothing written (pull = requests(M)·lazy_request_s + M/lazy_bps),
// fault_s by golden section over the other unshaped runs, and
// lazy_serial_share the same way over the runs on the shaped link (which
// is why link_efficiency comes first); the least relative squared error
// over every run wins. Without quiet runs (the quick grid: one dirty rate)
// round trips cannot be told from bytes: lazy_request_s and fault_s keep
// their values and lazy_bps is searched.
func fitLazy(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "lazy-pages", Kind: "model",
		From: "post-copy's commit+lazy-pages vs memory, dirty rate and link (model.LazyPull)"}
	var quiet, faulting, shaped []pullRun
	byRate := map[string][2][]float64{}
	for _, s := range collect(ms, func(pt Point) bool { return pt.Mode == model.ModePostcopy }) {
		r := pullRun{m: s.m, rate: float64(s.p.DirtyRate), y: phaseS(s.r, "commit", "lazy-pages"), faults: float64(s.r.PagesFaulted),
			link: p.LinkEfficiency * float64(s.p.BandwidthBps) / 8}
		switch {
		case r.y <= 0:
		case r.link > 0:
			shaped = append(shaped, r)
		case r.rate == 0:
			r.requests = model.LazyRequests(r.m) // once, not per searched lazy_request_s
			quiet = append(quiet, r)
		default:
			faulting = append(faulting, r)
		}
		if r.y > 0 && r.link == 0 {
			k := fmt.Sprintf("at %d pages/s", s.p.DirtyRate)
			xy := byRate[k]
			byRate[k] = [2][]float64{append(xy[0], r.m), append(xy[1], r.y)}
		}
	}
	if len(quiet)+len(faulting) == 0 {
		return t, ErrNoData
	}
	unshapedRuns := append(append([]pullRun(nil), quiet...), faulting...)
	all := append(append([]pullRun(nil), unshapedRuns...), shaped...)
	// No run that faulted less than free writes would: no bound (0).
	p.FaultWaitS, _ = fitFaultWait(append(append([]pullRun(nil), faulting...), shaped...))
	fitFor := func(c float64) (model.Profile, float64) {
		q := *p
		q.LazyRequestS = c
		if len(quiet) > 0 {
			q.LazyBps = quietRate(quiet, c)
			if len(faulting) > 0 {
				q.FaultS = minimize1D(func(f float64) float64 { q.FaultS = f; return pullError(q, faulting) }, 0, 0.02, 40)
			}
		} else {
			logPerByte := minimize1D(func(l float64) float64 { q.LazyBps = math.Exp(-l); return pullError(q, unshapedRuns) }, math.Log(1e-10), math.Log(1e-6), 40)
			q.LazyBps = math.Exp(-logPerByte)
		}
		if len(shaped) > 0 && q.LazyBps > 0 {
			q.LazySerialShare = minimize1D(func(k float64) float64 { q.LazySerialShare = k; return pullError(q, shaped) }, 0, 1, 30)
		}
		return q, pullError(q, all)
	}
	best, bestErr := fitFor(p.LazyRequestS)
	if len(quiet) > 0 { // else one dirty rate cannot tell round trips from bytes: keep lazy_request_s
		bestC := 0.0
		for c := 1e-5; c <= 0.02; c *= 1.5 {
			if q, e := fitFor(c); e < bestErr && q.LazyBps > 0 {
				best, bestErr, bestC = q, e, c
			}
		}
		if bestC > 0 {
			c := math.Exp(minimize1D(func(lc float64) float64 { _, e := fitFor(math.Exp(lc)); return e }, math.Log(bestC/1.5), math.Log(bestC*1.5), 30))
			if q, e := fitFor(c); e < bestErr && q.LazyBps > 0 {
				best = q
			}
		}
	}
	if !(best.LazyBps > 0) {
		return t, ErrNoData
	}
	p.LazyRequestS, p.LazyBps, p.FaultS, p.LazySerialShare = best.LazyRequestS, best.LazyBps, best.FaultS, best.LazySerialShare
	t.Sets = map[string]float64{"lazy_bps": p.LazyBps}
	if len(quiet) > 0 {
		t.Sets["lazy_request_s"] = p.LazyRequestS
	}
	if len(quiet) > 0 && len(faulting) > 0 {
		t.Sets["fault_s"] = p.FaultS
	}
	if len(faulting)+len(shaped) > 0 {
		t.Sets["fault_wait_s"] = p.FaultWaitS
	}
	if len(shaped) > 0 {
		t.Sets["lazy_serial_share"] = p.LazySerialShare
	}
	pred := make([]float64, len(all))
	for i, r := range all {
		t.X, t.Y = append(t.X, r.m), append(t.Y, r.y)
		pred[i] = p.LazyPull(r.m, r.link, r.rate)
	}
	t.Fit = residualFit(t.Y, pred)
	if len(byRate) > 1 {
		t.Note = "unshaped, by dirty rate: " + subFits(byRate)
	}
	return t, nil
}

// pullRun is one measured post-copy pull: memory, dirty rate, seconds, the
// pages that faulted meanwhile, the link's payload rate (0: unshaped), and
// for quiet runs the daemon's request count (model.LazyRequests).
type pullRun struct{ m, rate, y, faults, link, requests float64 }

// fitFaultWait fits fault_wait_s to the faults the runs counted: over a pull
// of T seconds the missing share falls from 1 to 0 about linearly, so a
// writer at R pages/s faults ∫ min(R·(1 − t/T), 1/w) dt = c·t1 + R·(T −
// t1)²/(2T) times, c = 1/w, t1 = T·(1 − c/R) (0 when c ≥ R). It returns
// false when no run faulted less than unbounded writes would (no bound seen).
func fitFaultWait(runs []pullRun) (float64, bool) {
	faults := func(r pullRun, w float64) float64 {
		c := 1 / w
		t1 := math.Max(r.y*(1-c/r.rate), 0)
		return c*t1 + r.rate*(r.y-t1)*(r.y-t1)/(2*r.y)
	}
	var bounded []pullRun
	for _, r := range runs {
		if r.faults > 0 && r.faults < 0.9*r.rate*r.y/2 {
			bounded = append(bounded, r)
		}
	}
	if len(bounded) == 0 {
		return 0, false
	}
	logW := minimize1D(func(l float64) float64 {
		var e float64
		for _, r := range bounded {
			d := (faults(r, math.Exp(l)) - r.faults) / r.faults
			e += d * d
		}
		return e
	}, math.Log(1e-5), math.Log(0.1), 50)
	return math.Exp(logW), true
}

// pullError is the relative squared error of p's pulls against runs
// (each memory and rate predicted once: the search calls this thousands
// of times).
func pullError(p model.Profile, runs []pullRun) float64 {
	var e float64
	pred := map[[3]float64]float64{}
	for _, r := range runs {
		k := [3]float64{r.m, r.rate, r.link}
		v, ok := pred[k]
		if !ok {
			v = p.LazyPull(r.m, r.link, r.rate)
			pred[k] = v
		}
		d := (v - r.y) / r.y
		e += d * d
	}
	return e
}

// quietRate is lazy_bps for a given lazy_request_s from pulls with nothing
// written, y = n(M)·c + M·k with k = 1/lazy_bps, least squares in relative
// error (0 when the round trips alone exceed the pulls).
func quietRate(runs []pullRun, c float64) float64 {
	var num, den float64
	for _, r := range runs {
		a := r.m / r.y
		num += a * (1 - r.requests*c/r.y)
		den += a * a
	}
	if den == 0 || num <= 0 {
		return 0
	}
	return den / num
}

// minimize1D is a golden-section search for the minimum of f on [lo, hi],
// in steps iterations (each shrinks the interval by 0.618).
func minimize1D(f func(float64) float64, lo, hi float64, steps int) float64 {
	const g = 0.6180339887498949
	a, b := lo, hi
	x1, x2 := b-g*(b-a), a+g*(b-a)
	f1, f2 := f(x1), f(x2)
	for range steps {
		if f1 <= f2 {
			b, x2, f2 = x2, x1, f1
			x1 = b - g*(b-a)
			f1 = f(x1)
		} else {
			a, x1, f1 = x1, x2, f2
			x2 = a + g*(b-a)
			f2 = f(x2)
		}
	}
	return (a + b) / 2
}

// twoRates fits y = x·below up to a knee and knee·below + (x−knee)·above
// past it (continuous, through the origin), trying each measured x but the
// largest as the knee; it returns the best fit by RMSE.
func twoRates(x, y []float64) (knee, below, above, rmse float64, ok bool) {
	xs := append([]float64(nil), x...)
	sort.Float64s(xs)
	best := math.Inf(1)
	for _, k := range xs[:max(len(xs)-1, 0)] {
		var bx, by, ax, ay []float64
		for i := range x {
			if x[i] <= k {
				bx, by = append(bx, x[i]), append(by, y[i])
			}
		}
		fb, okb := fitThroughOrigin(bx, by)
		if !okb || !(fb.B > 0) {
			continue
		}
		for i := range x {
			if x[i] > k {
				ax, ay = append(ax, x[i]-k), append(ay, y[i]-k*fb.B)
			}
		}
		fa, oka := fitThroughOrigin(ax, ay)
		if !oka || !(fa.B > 0) || len(ax) < 2 || len(bx) < 2 {
			continue
		}
		var ss float64
		for i := range x {
			pred := x[i] * fb.B
			if x[i] > k {
				pred = k*fb.B + (x[i]-k)*fa.B
			}
			ss += (y[i] - pred) * (y[i] - pred)
		}
		if r := math.Sqrt(ss / float64(len(x))); r < best {
			best, knee, below, above, ok = r, k, fb.B, fa.B, true
		}
	}
	return knee, below, above, best, ok
}

// fitRedirty measures how much of a page a live round sends for a page
// dirtied again: the round stream's bytes over its pages, rounds after the
// first (which sends everything once, whole).
func fitRedirty(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "redirty", Kind: "ratio",
		From: "pre-copy and hybrid rounds from the third on (index >= 2; earlier ones send pages whole): raw bytes / (pages x page size)"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy, model.ModeHybrid)) {
		for _, rd := range s.r.Rounds {
			if rd.Index < 2 || rd.Pages == 0 || rd.Final {
				continue
			}
			t.X = append(t.X, s.m)
			t.Y = append(t.Y, float64(rd.RawBytes)/(float64(rd.Pages)*p.PageSize))
		}
	}
	if len(t.Y) == 0 {
		return t, ErrNoData
	}
	t.Fit = constantFit(t.Y)
	p.RedirtyRatio = math.Min(1, math.Max(t.Fit.A, 1e-3))
	t.Sets = map[string]float64{"redirty_ratio": p.RedirtyRatio}
	return t, nil
}

// fitLocalFill fits hybrid's fill from the destination's own copy.
func fitLocalFill(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "local-fill", Kind: "proportional",
		From: "hybrid's commit+lazy-pages (pages placed from the destination's copy) vs memory: M/local_fill_bps"}
	for _, s := range collect(ms, unshaped(model.ModeHybrid)) {
		t.X, t.Y = append(t.X, s.m), append(t.Y, phaseS(s.r, "commit", "lazy-pages"))
	}
	return fitRate(t, "local_fill_bps", &p.LocalFillBps)
}

// fitImageFill fits pre-copy's rebuild switchover writing the pages image
// from the destination's copy.
func fitImageFill(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "image-fill", Kind: "proportional",
		From: "pre-copy's rebuild switchover, the destination completing the pages image (fill_ms) vs memory: M/image_fill_bps"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy)) {
		if s.r.FillMs > 0 {
			t.X, t.Y = append(t.X, s.m), append(t.Y, s.r.FillMs/1000)
		}
	}
	return fitRate(t, "image_fill_bps", &p.ImageFillBps)
}

// fitConstant finishes a term that is one constant: the mean of t's
// points, never below zero, stored in field under its JSON name.
func fitConstant(t Term, name string, field *float64) (Term, error) {
	if len(t.Y) == 0 {
		return t, ErrNoData
	}
	t.Fit = constantFit(t.Y)
	t.Free = freeLine(t.X, t.Y)
	*field = math.Max(0, t.Fit.A)
	t.Sets = map[string]float64{name: *field}
	return t, nil
}

// fitRate finishes a term of the form seconds = bytes/rate: it fits t's
// points through the origin and stores the rate in field, under its JSON
// name.
func fitRate(t Term, name string, field *float64) (Term, error) {
	f, ok := fitThroughOrigin(t.X, t.Y)
	if !ok || !(f.B > 0) {
		return t, ErrNoData
	}
	t.Fit = f
	t.Free = freeLine(t.X, t.Y)
	*field = 1 / f.B
	t.Sets = map[string]float64{name: *field}
	return t, nil
}

// fitLink measures ferry's payload throughput over the shaped link: the
// first pre-copy round sends all of memory, so (duration − M/read_hash_bps)
// is its time on the wire (cold: the dump beyond its fixed part).
func fitLink(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "link", Kind: "ratio",
		From: "shaped link: memory / (time on the wire × link rate), from pre-copy's first round"}
	var baseline []float64
	for _, m := range ms {
		if m.BandwidthBps <= 0 || m.Result == nil {
			continue
		}
		l := float64(m.BandwidthBps) / 8
		if b := m.Result.Baselines.Link; b != nil && b.ThroughputBps > 0 {
			baseline = append(baseline, b.ThroughputBps/float64(m.BandwidthBps))
		}
		mem := float64(m.MemoryBytes)
		for _, r := range okRuns(*m.Result) {
			var wire float64
			switch m.Mode {
			case model.ModePrecopy, model.ModeHybrid:
				if len(r.Rounds) == 0 {
					continue
				}
				wire = r.Rounds[0].DurationMs/1000 - mem/p.ReadHashBps
			case model.ModeCold:
				wire = phaseS(r, "dump", "images") - p.DumpFixedS
			default:
				continue
			}
			if wire > 0 {
				t.X, t.Y = append(t.X, mem), append(t.Y, mem/(wire*l))
			}
		}
	}
	if len(t.Y) == 0 {
		return t, ErrNoData
	}
	t.Fit = constantFit(t.Y)
	p.LinkEfficiency = math.Min(1, t.Fit.A)
	t.Sets = map[string]float64{"link_efficiency": p.LinkEfficiency}
	if len(baseline) > 0 {
		t.Note = fmt.Sprintf("plain TCP (iperf3) got %.3f of the same link", mean(baseline))
	}
	if t.Fit.A > 1 {
		t.Note += fmt.Sprintf("; measured %.3f, capped at 1", t.Fit.A)
	}
	return t, nil
}

// fitOverhead measures what every migration spends before its technique
// starts: connecting and the offer (prepare), the live root filesystem
// sync, and the commit of non-lazy modes. It sets setup_s.
func fitOverhead(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "setup", Kind: "constant",
		From: "prepare + rootfs-sync (+ commit for cold and pre-copy): added to every predicted total"}
	for _, s := range collect(ms, unshaped()) {
		y := phaseS(s.r, "prepare", "rootfs-sync")
		if !lazyMode(s.p.Mode) {
			y += phaseS(s.r, "commit")
		}
		t.X, t.Y = append(t.X, s.m), append(t.Y, y)
	}
	return fitConstant(t, "setup_s", &p.SetupS)
}

// freeLine is FitLinear when the points allow one, else nil.
func freeLine(x, y []float64) *model.LinearFit {
	if distinct(x) < 2 {
		return nil
	}
	f, err := model.FitLinear(x, y)
	if err != nil {
		return nil
	}
	return &f
}

// subFits describes separate line fits (intercept in ms, rate in MB/s,
// R²), for a note.
func subFits(sets map[string][2][]float64) string {
	var out string
	for _, name := range sortedKeys(sets) {
		xy := sets[name]
		f := freeLine(xy[0], xy[1])
		if f == nil {
			continue
		}
		if out != "" {
			out += "; "
		}
		rate := rateMBs(f.B)
		if name != "" {
			out += name + ": "
		}
		out += fmt.Sprintf("%.0f ms + M at %.0f MB/s (R² %.3f, n %d)", f.A*1000, rate, f.R2, f.N)
	}
	return out
}

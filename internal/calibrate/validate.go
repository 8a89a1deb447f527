package calibrate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/fit"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/plot"
	"github.com/ferry-migrate/ferry/internal/units"
)

// ValidateOptions configure Validate.
type ValidateOptions struct {
	Profile model.Profile
	// Quick measures two points per mode instead of six.
	Quick bool
	// Modes, Memories (bytes), DirtyRates (pages/s) and Bandwidths (bits/s)
	// replace the default design with their full cross product.
	Modes      []string
	Memories   []int64
	DirtyRates []int
	Bandwidths []int64
	// Repeat is the migrations per point; 0 means 3.
	Repeat   int
	FerryBin string
	// TCPClient: as Options.TCPClient.
	TCPClient bool
	Progress  func(Progress)
	Log       io.Writer
	Run       Runner
}

// Validation points are away from the calibration's (64M-512M in powers
// of two, 0/100/2000 pages/s, unshaped or 300 Mbit/s).
const (
	rateLow, rateHigh = 500, 4000
	bw500M, bw1G      = 500_000_000, 1_000_000_000
)

var validatedModes = model.EngineModes

// ValidationGrid lists the points Validate measures. The default design is
// a fraction of memory × dirty rate × bandwidth that still puts every
// level of each factor against both levels of the others: per mode 96M and
// 384M at (500 pages/s, 1 Gbit/s) and (4000 pages/s, 500 Mbit/s), 192M at
// the two other pairs. Quick keeps 96M and 192M's first pair each. Lists
// given in the options replace the design with their full cross product.
func ValidationGrid(o ValidateOptions) []Point {
	modes := o.Modes
	if len(modes) == 0 {
		modes = validatedModes
	}
	type cell struct {
		mem  int64
		rate int
		bw   int64
	}
	var cells []cell
	if len(o.Memories) > 0 || len(o.DirtyRates) > 0 || len(o.Bandwidths) > 0 {
		mems, rates, bws := o.Memories, o.DirtyRates, o.Bandwidths
		if len(mems) == 0 {
			mems = []int64{192 << 20}
		}
		if len(rates) == 0 {
			rates = []int{rateLow}
		}
		if len(bws) == 0 {
			bws = []int64{bw1G}
		}
		for _, m := range mems {
			for _, r := range rates {
				for _, b := range bws {
					cells = append(cells, cell{m, r, b})
				}
			}
		}
	} else if o.Quick {
		cells = []cell{{96 << 20, rateLow, bw1G}, {192 << 20, rateHigh, bw500M}}
	} else {
		cells = []cell{
			{96 << 20, rateLow, bw1G}, {96 << 20, rateHigh, bw500M},
			{192 << 20, rateHigh, bw1G}, {192 << 20, rateLow, bw500M},
			{384 << 20, rateLow, bw1G}, {384 << 20, rateHigh, bw500M},
		}
	}
	var pts []Point
	for _, c := range cells {
		for _, mode := range modes {
			pts = append(pts, Point{Mode: mode, MemoryBytes: c.mem, DirtyRate: c.rate, BandwidthBps: c.bw})
		}
	}
	return pts
}

// Metrics are one point's figures, measured or predicted (medians of the
// successful runs when measured).
type Metrics struct {
	TotalMs          float64 `json:"total_ms"`
	DowntimeMs       float64 `json:"downtime_ms"`
	ClientDowntimeMs float64 `json:"client_downtime_ms,omitempty"` // measured only
	Bytes            float64 `json:"bytes"`
}

// TermTimes splits a migration's time the way the models do (ms).
type TermTimes struct {
	Rounds  float64 `json:"rounds_ms"`  // live rounds
	Freeze  float64 `json:"freeze_ms"`  // freeze
	Dump    float64 `json:"dump_ms"`    // dump (+ images; hybrid: + final round)
	Restore float64 `json:"restore_ms"` // restore until the destination answers
	Lazy    float64 `json:"lazy_ms"`    // commit + lazy pages (post-copy, hybrid)
	Other   float64 `json:"other_ms"`   // prepare, rootfs sync, commit: not modelled
}

// ValidationPoint compares one point's measurements with the predictions.
type ValidationPoint struct {
	Point
	Runs   int `json:"runs"`
	OKRuns int `json:"ok_runs"`
	// Rounds is the live rounds the runs did (median), given to Predict.
	Rounds    int       `json:"rounds"`
	Measured  Metrics   `json:"measured"`
	Predicted Metrics   `json:"predicted"` // model.Predict with the profile
	Ideal     Metrics   `json:"ideal"`     // the processing-free baseline
	TermsMeas TermTimes `json:"terms_measured"`
	TermsPred TermTimes `json:"terms_predicted"`
	Note      string    `json:"note,omitempty"`
	Error     string    `json:"error,omitempty"`
}

// MAPEs are mean absolute percentage errors; nil where nothing was
// measured.
type MAPEs struct {
	TotalPct          *float64 `json:"total_pct"`
	DowntimePct       *float64 `json:"downtime_pct"`
	ClientDowntimePct *float64 `json:"client_downtime_pct"` // against the predicted downtime
	BytesPct          *float64 `json:"bytes_pct"`
}

// ModeSummary is one mode's accuracy over its points.
type ModeSummary struct {
	Mode   string `json:"mode"`
	Points int    `json:"points"`
	Model  MAPEs  `json:"model"`
	Ideal  MAPEs  `json:"ideal"`
	// Terms are the mean measured and predicted times per model term:
	// which part of the model is off, and by how much.
	TermsMeas TermTimes `json:"terms_measured"`
	TermsPred TermTimes `json:"terms_predicted"`
}

// Validation is the outcome of Validate.
type Validation struct {
	Profile model.Profile     `json:"profile"`
	Repeat  int               `json:"repeat"`
	Started time.Time         `json:"started"`
	WallS   float64           `json:"wall_s"`
	Modes   []ModeSummary     `json:"modes"`
	Points  []ValidationPoint `json:"points"`
	Raw     []Measured        `json:"raw"`
}

// Validate measures the validation grid and compares each point with
// model.Predict (given the rounds the runs actually did) and with the
// ideal baseline. A bench error stops the sweep; what was measured until
// then is still compared and returned with the error.
func Validate(ctx context.Context, o ValidateOptions) (Validation, error) {
	if o.Repeat <= 0 {
		o.Repeat = 3
	}
	v := Validation{Profile: o.Profile, Repeat: o.Repeat, Started: time.Now()}
	if err := o.Profile.Validate(); err != nil {
		return v, err
	}
	measured, err := sweep(ctx, ValidationGrid(o), o.sweep())
	v.WallS = time.Since(v.Started).Seconds()
	v.Raw = measured
	v.Points, v.Modes = Compare(o.Profile, measured)
	return v, err
}

// Rescore compares a validation's measurements (its Raw points) with
// another profile's predictions, measuring nothing.
func Rescore(p model.Profile, old Validation) Validation {
	v := old
	v.Profile = p
	v.Points, v.Modes = Compare(p, old.Raw)
	return v
}

// Compare evaluates the models at each measured point.
func Compare(p model.Profile, ms []Measured) ([]ValidationPoint, []ModeSummary) {
	var pts []ValidationPoint
	for _, m := range ms {
		pts = append(pts, comparePoint(p, m))
	}
	var sums []ModeSummary
	for _, mode := range modesIn(pts) {
		sums = append(sums, summarize(mode, pts))
	}
	return pts, sums
}

func comparePoint(p model.Profile, m Measured) ValidationPoint {
	vp := ValidationPoint{Point: m.Point, Error: m.Error}
	if m.Result == nil {
		return vp
	}
	runs := fit.OKRuns(*m.Result)
	vp.Runs, vp.OKRuns = len(m.Result.Runs), len(runs)
	if len(runs) == 0 {
		return vp
	}
	var rounds, bytes []float64
	var terms []TermTimes
	for _, r := range runs {
		rounds = append(rounds, float64(fit.LiveRounds(r)))
		bytes = append(bytes, float64(r.BytesSent))
		terms = append(terms, measuredTerms(m.Mode, r))
	}
	vp.Rounds = int(math.Round(fit.Median(rounds)))
	vp.Measured = Metrics{TotalMs: m.Result.MedianTotalMs, DowntimeMs: m.Result.MedianDowntimeMs,
		ClientDowntimeMs: m.Result.MedianClientDowntimeMs, Bytes: fit.Median(bytes)}
	vp.TermsMeas = meanTerms(terms)

	in := model.Inputs{MemoryBytes: float64(m.MemoryBytes), DirtyRatePagesPerSec: float64(m.DirtyRate),
		BandwidthBps: float64(m.BandwidthBps) / 8}
	pr := model.Predict(p, in, m.Mode, max(vp.Rounds, 1))
	vp.Predicted = Metrics{TotalMs: pr.TotalMs, DowntimeMs: pr.DowntimeMs, Bytes: pr.Bytes}
	vp.Note = pr.Note
	vp.TermsPred = predictedTerms(p, in, m.Mode, pr)
	vp.Ideal = ideal(p, in, m.Mode, max(vp.Rounds, 1))
	return vp
}

// measuredTerms splits a run's phases into the model's terms.
func measuredTerms(mode string, r bench.Run) TermTimes {
	t := TermTimes{
		Rounds:  fit.RoundsS(r) * 1000,
		Freeze:  fit.PhaseS(r, "freeze") * 1000,
		Dump:    fit.PhaseS(r, "dump", "images") * 1000,
		Restore: fit.PhaseS(r, "restore") * 1000,
		Other:   fit.PhaseS(r, "prepare", "rootfs-sync") * 1000,
	}
	if model.LazyMode(mode) {
		t.Lazy = fit.PhaseS(r, "commit", "lazy-pages") * 1000
	} else {
		t.Other += fit.PhaseS(r, "commit") * 1000
	}
	return t
}

// predictedTerms splits a prediction into the same terms: the restore as
// the profile gives it, the dump as the rest of the downtime.
func predictedTerms(p model.Profile, in model.Inputs, mode string, pr model.Prediction) TermTimes {
	t := TermTimes{Freeze: p.FreezeS * 1000, Lazy: pr.DegradedMs}
	if model.LazyMode(mode) || (mode == model.ModePrecopy && p.LazyDump && !in.NoLazyRestore) {
		t.Restore = (p.RestoreFixedS + p.LazySetupS) * 1000
	} else {
		t.Restore = (p.RestoreFixedS + in.MemoryBytes/p.RestoreBps) * 1000
	}
	t.Dump = pr.DowntimeMs - t.Freeze - t.Restore
	t.Rounds = pr.TotalMs - pr.DowntimeMs - pr.DegradedMs
	return t
}

func meanTerms(ts []TermTimes) TermTimes {
	var out TermTimes
	if len(ts) == 0 {
		return out
	}
	n := float64(len(ts))
	for _, t := range ts {
		out.Rounds += t.Rounds / n
		out.Freeze += t.Freeze / n
		out.Dump += t.Dump / n
		out.Restore += t.Restore / n
		out.Lazy += t.Lazy / n
		out.Other += t.Other / n
	}
	return out
}

// ideal is the processing-free baseline for each mode: the ideal pre-copy
// model (model.Ideal) for pre-copy and hybrid with the rounds done, its
// zero-round case (M/L, then resume) for cold, and for post-copy a resume
// followed by M/L of pages. Resume is the profile's fixed restore cost, the
// one constant the ideal model keeps; the link is the nominal rate.
func ideal(p model.Profile, in model.Inputs, mode string, rounds int) Metrics {
	m, l, resume := in.MemoryBytes, in.BandwidthBps, p.RestoreFixedS
	switch mode {
	case model.ModeCold:
		d := (m/l + resume) * 1000
		return Metrics{TotalMs: d, DowntimeMs: d, Bytes: m}
	case model.ModePostcopy:
		return Metrics{TotalMs: (m/l + resume) * 1000, DowntimeMs: resume * 1000, Bytes: m}
	}
	r := model.Ideal(m, in.DirtyRatePagesPerSec, p.PageSize, l, rounds-1, resume)
	var bytes float64
	for _, v := range r.Volumes {
		bytes += v
	}
	return Metrics{TotalMs: r.Total * 1000, DowntimeMs: r.Downtime * 1000, Bytes: bytes}
}

func modesIn(pts []ValidationPoint) []string {
	var modes []string
	for _, p := range pts {
		if !slices.Contains(modes, p.Mode) {
			modes = append(modes, p.Mode)
		}
	}
	return modes
}

func summarize(mode string, pts []ValidationPoint) ModeSummary {
	s := ModeSummary{Mode: mode}
	var mt, md, mc, mb, pt, pd, pb, it, id, ib []float64
	var tm, tp []TermTimes
	for _, p := range pts {
		if p.Mode != mode || p.OKRuns == 0 {
			continue
		}
		s.Points++
		mt, md, mc, mb = append(mt, p.Measured.TotalMs), append(md, p.Measured.DowntimeMs), append(mc, p.Measured.ClientDowntimeMs), append(mb, p.Measured.Bytes)
		pt, pd, pb = append(pt, p.Predicted.TotalMs), append(pd, p.Predicted.DowntimeMs), append(pb, p.Predicted.Bytes)
		it, id, ib = append(it, p.Ideal.TotalMs), append(id, p.Ideal.DowntimeMs), append(ib, p.Ideal.Bytes)
		tm, tp = append(tm, p.TermsMeas), append(tp, p.TermsPred)
	}
	s.Model = MAPEs{pct(mt, pt), pct(md, pd), pct(mc, pd), pct(mb, pb)}
	s.Ideal = MAPEs{pct(mt, it), pct(md, id), pct(mc, id), pct(mb, ib)}
	s.TermsMeas, s.TermsPred = meanTerms(tm), meanTerms(tp)
	return s
}

// pct is model.MAPE, nil when it has nothing to average (JSON has no NaN).
func pct(measured, predicted []float64) *float64 {
	v := model.MAPE(measured, predicted)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// WriteFiles writes dir/validation.json, dir/validation.md and
// dir/predicted-vs-measured.svg.
func (v Validation) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "validation.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "validation.md"), []byte(v.Markdown()), 0o644); err != nil {
		return err
	}
	svg, err := v.ScatterSVG()
	if err != nil {
		return fmt.Errorf("predicted-vs-measured.svg: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "predicted-vs-measured.svg"), svg, 0o644)
}

// ScatterSVG is predicted against measured time (medians), log-log with
// the y = x diagonal: one colour per mode, circles for total time, squares
// for downtime. plot.ErrNoPoints when no point has a completed run.
func (v Validation) ScatterSVG() ([]byte, error) {
	var cs []plot.Comparison
	for _, p := range v.Points {
		if p.OKRuns == 0 {
			continue
		}
		cs = append(cs,
			plot.Comparison{Group: p.Mode, Metric: "total", Measured: p.Measured.TotalMs, Predicted: p.Predicted.TotalMs},
			plot.Comparison{Group: p.Mode, Metric: "downtime", Measured: p.Measured.DowntimeMs, Predicted: p.Predicted.DowntimeMs})
	}
	return plot.PredictedVsMeasuredSVG("ferry models: predicted vs measured (medians)", cs)
}

// Markdown renders the summary, the per-term comparison and every point.
func (v Validation) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Model validation\n\n")
	fmt.Fprintf(&b, "Profile: %s. %d points × %d runs, %.0f s. Medians of successful runs; predictions use the rounds the runs did.\n\n",
		orDash(v.Profile.Source), len(v.Points), v.Repeat, v.WallS)
	b.WriteString("## MAPE per mode (model / ideal baseline)\n\n")
	b.WriteString("| mode | points | total | downtime | client downtime | bytes |\n|---|---:|---:|---:|---:|---:|\n")
	for _, s := range v.Modes {
		fmt.Fprintf(&b, "| %s | %d | %s / %s | %s / %s | %s / %s | %s / %s |\n", s.Mode, s.Points,
			pctStr(s.Model.TotalPct), pctStr(s.Ideal.TotalPct), pctStr(s.Model.DowntimePct), pctStr(s.Ideal.DowntimePct),
			pctStr(s.Model.ClientDowntimePct), pctStr(s.Ideal.ClientDowntimePct), pctStr(s.Model.BytesPct), pctStr(s.Ideal.BytesPct))
	}
	b.WriteString("\nClient downtime is compared with the predicted downtime.\n\n")
	b.WriteString("## Where the time goes: measured / predicted, mean ms per term\n\n")
	b.WriteString("| mode | rounds | freeze | dump | restore | lazy | not modelled |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range v.Modes {
		m, p := s.TermsMeas, s.TermsPred
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.0f |\n", s.Mode, pair(m.Rounds, p.Rounds), pair(m.Freeze, p.Freeze),
			pair(m.Dump, p.Dump), pair(m.Restore, p.Restore), pair(m.Lazy, p.Lazy), m.Other)
	}
	b.WriteString("\n## Points (measured / predicted / ideal, ms)\n\n")
	b.WriteString("| mode | memory | dirty p/s | link | rounds | total | downtime | client downtime | MiB sent (meas / pred) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range v.Points {
		link := "unshaped"
		if p.BandwidthBps > 0 {
			link = units.FormatRate(p.BandwidthBps)
		}
		if p.OKRuns == 0 {
			fmt.Fprintf(&b, "| %s | %dM | %d | %s | - | failed: %s | | | |\n", p.Mode, p.MemoryBytes>>20, p.DirtyRate, link,
				strings.ReplaceAll(orDash(p.Error), "|", "/"))
			continue
		}
		fmt.Fprintf(&b, "| %s | %dM | %d | %s | %d | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f | %.0f | %.0f / %.0f |\n",
			p.Mode, p.MemoryBytes>>20, p.DirtyRate, link, p.Rounds,
			p.Measured.TotalMs, p.Predicted.TotalMs, p.Ideal.TotalMs,
			p.Measured.DowntimeMs, p.Predicted.DowntimeMs, p.Ideal.DowntimeMs,
			p.Measured.ClientDowntimeMs, p.Measured.Bytes/(1<<20), p.Predicted.Bytes/(1<<20))
	}
	return b.String()
}

func pctStr(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f %%", *p)
}

func pair(m, p float64) string { return fmt.Sprintf("%.0f / %.0f", m, p) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

package report

import (
	"errors"
	"fmt"
	"html/template"
	"image/color"
	"math"
	"slices"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/experiment"
	"github.com/ferry-migrate/ferry/internal/plot"
)

// The kinds of figure, in the order a workload's section shows them; each
// is the class of its <figure>.
const (
	figTimeline  = "timeline"
	figDowntime  = "downtime"
	figRounds    = "rounds"
	figClient    = "client"
	figPredicted = "predicted"
)

// figure is one figure of the report, or the sentence saying why there is
// none.
type figure struct {
	kind    string
	svg     template.HTML
	caption string
	omitted string
}

// failed is a figure whose drawing failed: said, not fatal.
func failed(kind string, err error) figure {
	return figure{kind: kind, omitted: "This figure could not be drawn: " + err.Error() + "."}
}

const mib = 1 << 20

var (
	migrationShade = color.RGBA{R: 0xe4, G: 0xe4, B: 0xe4, A: 0xff}
	downtimeShade  = color.RGBA{R: 0xf6, G: 0xc4, B: 0xb0, A: 0xff}
	black          = color.Black
)

// figures draws a workload's figures; colors gives each mode its colour
// across the report.
func (w *workload) figures(colors map[string]color.Color) []figure {
	return []figure{
		w.timelineFigure(),
		w.downtimeFigure(colors),
		w.roundsFigure(colors),
		w.clientFigure(),
		w.predictedFigure(),
	}
}

// chosen says which runs a one-run-per-mode figure shows.
func chosen(reps []representative) string {
	var parts []string
	for _, r := range reps {
		parts = append(parts, fmt.Sprintf("%s of %d", r.run.Mode, r.of))
	}
	return strings.Join(parts, ", ")
}

// freezeStart is when the run's container froze (ms since its start).
func freezeStart(r experiment.Run) (float64, bool) {
	for _, p := range r.Phases {
		if p.Name == "freeze" {
			return p.StartMs, true
		}
	}
	return 0, false
}

// phaseEnd is a phase's end; a phase left open (a run cut short) ends with
// the run.
func phaseEnd(r experiment.Run, p engine.PhaseSpan) float64 {
	if p.EndMs >= p.StartMs {
		return p.EndMs
	}
	return math.Max(p.StartMs, r.TotalMs)
}

// timelineFigure is figure 1: one migration per mode as a Gantt chart of
// its phases.
func (w *workload) timelineFigure() figure {
	setting, reps := w.representatives(func(r experiment.Run) bool { return r.OK && len(r.Phases) > 0 })
	if len(reps) == 0 {
		return figure{kind: figTimeline, omitted: "No completed run recorded its phases, so there is no timeline of phases."}
	}
	p := plot.New("Phases of one migration per mode", "time since the migration started (s)", "")
	p.Add(plot.Grid(true, false))
	var bars boxes
	var ticks []gplot.Tick
	var cats, unknown []string
	downtimes := 0
	for i, rep := range reps {
		row := float64(len(reps) - 1 - i) // the first mode on top
		ticks = append(ticks, gplot.Tick{Value: row, Label: rep.run.Mode})
		for _, ph := range rep.run.Phases {
			cat := phaseCategory(ph.Name)
			if !slices.Contains(cats, cat) {
				cats = append(cats, cat)
			}
			if phaseOrder(cat) == len(phaseColors) && !slices.Contains(unknown, cat) {
				unknown = append(unknown, cat)
			}
			bars = append(bars, box{x0: ph.StartMs / 1000, x1: phaseEnd(rep.run, ph) / 1000, y0: row - 0.3, y1: row + 0.3,
				fill: phaseColor(ph.Name, slices.Index(unknown, cat))})
		}
		if start, ok := freezeStart(rep.run); ok && rep.run.DowntimeMs > 0 {
			bars = append(bars, box{x0: start / 1000, x1: (start + rep.run.DowntimeMs) / 1000, y0: row - 0.42, y1: row - 0.35, fill: black})
			downtimes++
		}
	}
	p.Add(bars)
	p.X.Min = 0
	p.Y.Min, p.Y.Max = -0.6, float64(len(reps))-0.4
	p.Y.Tick.Marker = gplot.ConstantTicks(ticks)
	p.Y.Tick.Length = 0

	legend := newLegend()
	slices.SortStableFunc(cats, func(a, b string) int { return phaseOrder(a) - phaseOrder(b) })
	for _, cat := range cats {
		name := cat
		if cat == "rounds" {
			name = "pre-copy rounds"
		}
		legend.Add(name, swatch{fill: phaseColor(cat, slices.Index(unknown, cat))})
	}
	if downtimes > 0 {
		legend.Add("downtime", swatch{fill: black})
	}
	h := max(2.2*vg.Inch, vg.Length(len(reps))*0.55*vg.Inch+1.1*vg.Inch)
	svg, err := render([][]*gplot.Plot{{p}}, legend, figWidth, h)
	if err != nil {
		return failed(figTimeline, err)
	}
	caption := fmt.Sprintf("Phases of one migration per mode at %s, on the migration's own clock: for each mode the run of median total time among its completed runs with phases (%s).",
		describe(setting), chosen(reps))
	if downtimes > 0 {
		caption += " The thin black bar under a row is its downtime, from the freeze for as long as the reported downtime."
	}
	return figure{kind: figTimeline, svg: svg, caption: caption + " " + w.runCount()}
}

// runCount is a caption's closing count of the workload's runs.
func (w *workload) runCount() string {
	ok := 0
	for _, r := range w.runs {
		if r.OK {
			ok++
		}
	}
	return fmt.Sprintf("The workload has %d runs, %d of them completed.", len(w.runs), ok)
}

// downtimeSeries is one line of figure 2: a mode (with the factors that
// vary besides the state) across state sizes.
type downtimeSeries struct {
	label          string
	mode           string
	mib            []float64
	client, frozen []Interval
}

// downtimeFigure is figure 2: median client and migration downtime
// against state size, one line per mode, with their intervals.
func (w *workload) downtimeFigure(colors map[string]color.Color) figure {
	var series []*downtimeSeries
	var xs, ys []float64
	points, runs, ranges := 0, 0, 0
	for _, pt := range w.points {
		if len(pt.ok) == 0 {
			continue
		}
		label := w.label(pt.Point, false)
		i := slices.IndexFunc(series, func(s *downtimeSeries) bool { return s.label == label })
		if i < 0 {
			series = append(series, &downtimeSeries{label: label, mode: pt.Mode})
			i = len(series) - 1
		}
		s := series[i]
		s.mib = append(s.mib, float64(pt.StateBytes)/mib)
		s.client = append(s.client, pt.clientDowntime)
		s.frozen = append(s.frozen, pt.downtime)
		xs = append(xs, float64(pt.StateBytes)/mib)
		ys = append(ys, pt.clientDowntime.Lo, pt.clientDowntime.Hi, pt.downtime.Lo, pt.downtime.Hi)
		points++
		runs += len(pt.ok)
		if !pt.downtime.IsCI() {
			ranges++
		}
	}
	if points == 0 {
		return figure{kind: figDowntime, omitted: "No run completed, so there is no downtime to draw."}
	}
	logX, logY := plot.WantLog(xs, 10), plot.WantLog(ys, 20)
	client := plot.New("client downtime (longest stall)", "state (MiB)", "ms")
	frozen := plot.New("migration downtime (reported)", "state (MiB)", "ms")
	legend := newLegend()
	// One colour per mode, unless other factors split a mode into lines.
	byMode := !slices.ContainsFunc(series, func(s *downtimeSeries) bool { return s.label != s.mode })
	for _, p := range []*gplot.Plot{client, frozen} {
		p.Add(plot.Grid(true, true))
	}
	for i, s := range series {
		c := plot.Color(i)
		if byMode {
			c = colors[s.mode]
		}
		var thumbs []gplot.Thumbnailer
		for j, p := range []*gplot.Plot{client, frozen} {
			ivs := s.client
			if j == 1 {
				ivs = s.frozen
			}
			line, marks, bars, err := medianLine(s.mib, ivs, c, logY)
			if err != nil {
				return failed(figDowntime, err)
			}
			if line == nil {
				continue
			}
			p.Add(line, marks, bars)
			if thumbs == nil {
				thumbs = []gplot.Thumbnailer{line, marks}
			}
		}
		if thumbs != nil {
			legend.Add(s.label, thumbs...)
		}
	}
	for _, p := range []*gplot.Plot{client, frozen} {
		if logX {
			plot.LogAxis(&p.X, slices.Min(xs), slices.Max(xs))
		}
		if logY {
			lo, hi := slices.Min(ys), slices.Max(ys)
			plot.LogAxis(&p.Y, lo, hi)
		} else {
			p.Y.Min = math.Min(p.Y.Min, 0)
		}
	}
	svg, err := render([][]*gplot.Plot{{client, frozen}}, legend, figWidth, 3.4*vg.Inch)
	if err != nil {
		return failed(figDowntime, err)
	}
	caption := fmt.Sprintf("Median downtime against state size, one line per mode: left, the longest stall the workload's client saw; right, the downtime ferry reported (freeze to commit). %d grid points from %d completed runs. ", points, runs)
	switch {
	case ranges == 0:
		caption += fmt.Sprintf("Error bars: the %.0f %% confidence interval of the median, from order statistics (distribution-free).", CILevel*100)
	case ranges == points:
		caption += fmt.Sprintf("Every point has fewer than %d completed runs, too few for a %.0f %% confidence interval of the median: the error bars span the minimum to the maximum instead.", MinRunsForCI, CILevel*100)
	default:
		caption += fmt.Sprintf("Error bars: the %.0f %% confidence interval of the median (order statistics, distribution-free) where a point has at least %d completed runs; at the %d points with fewer, too few for one, they span the minimum to the maximum instead.", CILevel*100, MinRunsForCI, ranges)
	}
	return figure{kind: figDowntime, svg: svg, caption: caption}
}

// medianLine is a series' medians joined by a line, with markers and
// error bars from each interval; values a log axis cannot show are left
// out, and a nil line says none was left.
func medianLine(xs []float64, ivs []Interval, c color.Color, logY bool) (*plotter.Line, *plotter.Scatter, *plotter.YErrorBars, error) {
	type pt struct{ x, med, lo, hi float64 }
	var pts []pt
	for i, iv := range ivs {
		if iv.N == 0 || !plot.Usable(iv.Median, logY) || !plot.Usable(iv.Lo, logY) {
			continue
		}
		pts = append(pts, pt{xs[i], iv.Median, iv.Lo, iv.Hi})
	}
	if len(pts) == 0 {
		return nil, nil, nil, nil
	}
	slices.SortFunc(pts, func(a, b pt) int { return int(math.Copysign(1, a.x-b.x)) })
	var errs struct {
		plotter.XYs
		plotter.YErrors
	}
	for _, p := range pts {
		errs.XYs = append(errs.XYs, plotter.XY{X: p.x, Y: p.med})
		errs.YErrors = append(errs.YErrors, struct{ Low, High float64 }{Low: p.med - p.lo, High: p.hi - p.med})
	}
	line, marks, err := plotter.NewLinePoints(errs.XYs)
	if err != nil {
		return nil, nil, nil, err
	}
	line.LineStyle = lineStyle(c, 1.2, false)
	marks.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}
	bars, err := plotter.NewYErrorBars(errs)
	if err != nil {
		return nil, nil, nil, err
	}
	bars.LineStyle = lineStyle(c, 0.8, false)
	bars.CapWidth = vg.Points(5)
	return line, marks, bars, nil
}

// roundsFigure is figure 3: the bytes of each pre-copy round of one
// migration per mode, side by side.
func (w *workload) roundsFigure(colors map[string]color.Color) figure {
	setting, reps := w.representatives(func(r experiment.Run) bool { return r.OK && len(r.Rounds) > 0 })
	if len(reps) == 0 {
		return figure{kind: figRounds, omitted: "No completed run sent memory in rounds (cold and post-copy send it in one go), so there is no figure of rounds."}
	}
	p := plot.New("Bytes per round", "round", "MiB sent")
	p.Add(plot.Grid(false, true))
	legend := newLegend()
	width := 0.8 / float64(len(reps))
	finalStyle := lineStyle(black, 1.6, false)
	var bars boxes
	var finals plotter.XYLabels
	maxIndex := 0
	for k, rep := range reps {
		offset := (float64(k) - float64(len(reps)-1)/2) * width
		c := colors[rep.run.Mode]
		for _, rd := range rep.run.Rounds {
			x, y := float64(rd.Index)+offset, float64(rd.Bytes)/mib
			b := box{x0: x - 0.45*width, x1: x + 0.45*width, y0: 0, y1: y, fill: c}
			if rd.Final {
				b.outline = finalStyle
				finals.XYs = append(finals.XYs, plotter.XY{X: x, Y: y})
				finals.Labels = append(finals.Labels, "final")
			}
			bars = append(bars, b)
			maxIndex = max(maxIndex, rd.Index)
		}
		legend.Add(rep.run.Mode, swatch{fill: c})
	}
	p.Add(bars)
	if len(finals.Labels) > 0 {
		labels, err := plotter.NewLabels(finals)
		if err != nil {
			return failed(figRounds, err)
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i] = text.Style{Font: plot.Font(8), XAlign: draw.XCenter, YAlign: draw.YBottom, Handler: p.TextHandler}
		}
		labels.Offset = vg.Point{Y: vg.Points(2)}
		p.Add(labels)
		legend.Add("final round (frozen)", swatch{outline: finalStyle})
	}
	var ticks []gplot.Tick
	for i := 0; i <= maxIndex; i++ {
		ticks = append(ticks, gplot.Tick{Value: float64(i), Label: fmt.Sprint(i)})
	}
	p.X.Tick.Marker = gplot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = math.Min(p.X.Min, -0.5), math.Max(p.X.Max, float64(maxIndex)+0.5)
	p.Y.Min = 0
	p.Y.Max *= 1.08 // room for the labels
	svg, err := render([][]*gplot.Plot{{p}}, legend, figWidth, 3*vg.Inch)
	if err != nil {
		return failed(figRounds, err)
	}
	caption := fmt.Sprintf("Bytes sent in each pre-copy round by one migration per mode at %s: for each mode the run of median total time among its completed runs with rounds (%s); modes without rounds are left out.",
		describe(setting), chosen(reps))
	if len(finals.Labels) > 0 {
		caption += " Outlined and labelled “final”: hybrid's last round, read while the container is frozen."
	}
	return figure{kind: figRounds, svg: svg, caption: caption + " " + w.runCount()}
}

// clientOffset is where a run's migration began on its client's timeline
// (ms); false when either clock is missing.
func clientOffset(r experiment.Run) (float64, bool) {
	if r.StartUnixMs == 0 || r.Client.StartUnixMs == 0 {
		return 0, false
	}
	return float64(r.StartUnixMs - r.Client.StartUnixMs), true
}

var (
	p50Color   = plot.Palette[0]
	p99Color   = plot.Palette[1]
	opsColor   = plot.Palette[2]
	errorColor = plot.Palette[7]
)

// clientFigure is figure 4: what the service's client saw across one
// migration per mode, latency on the left and throughput on the right.
func (w *workload) clientFigure() figure {
	hasClient := func(r experiment.Run) bool {
		return r.OK && r.Client != nil && len(r.Client.Timeline) > 0 && r.Client.BucketMs > 0
	}
	setting, reps := w.representatives(hasClient)
	if len(reps) == 0 {
		if slices.ContainsFunc(w.runs, func(r experiment.Run) bool { return r.Client != nil }) {
			return figure{kind: figClient, omitted: "No completed run has a client timeline, so there is no figure of what the client saw."}
		}
		return figure{kind: figClient, omitted: "No run has a service client (memhog's probe measures only the longest stall), so there is no figure of latency and throughput."}
	}
	var rows [][]*gplot.Plot
	aligned, unaligned := 0, 0
	withErrors := false
	for _, rep := range reps {
		r, cl := rep.run, rep.run.Client
		offset, ok := clientOffset(r)
		xLabel := "time since the migration started (s)"
		if ok {
			aligned++
		} else {
			unaligned++
			xLabel = "time since the client started (s)"
		}
		n := len(cl.Timeline)
		xs, p50, p99, ops, errs := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		var lat []float64
		for i, b := range cl.Timeline {
			xs[i] = (b.TMs + cl.BucketMs/2 - offset) / 1000
			p50[i], p99[i] = b.P50Ms, b.P99Ms
			ops[i] = float64(b.Ops) / (cl.BucketMs / 1000)
			errs[i] = float64(b.Errors) / (cl.BucketMs / 1000)
			if b.Ops > 0 {
				lat = append(lat, b.P50Ms, b.P99Ms)
			}
		}
		logY := plot.WantLog(lat, 10)
		latency := plot.New(r.Mode+": latency", xLabel, "ms")
		throughput := plot.New(r.Mode+": throughput", xLabel, "requests/s")
		for _, p := range []*gplot.Plot{latency, throughput} {
			if ok {
				p.Add(span{x0: 0, x1: r.TotalMs / 1000, fill: migrationShade})
				if start, frozen := freezeStart(r); frozen && r.DowntimeMs > 0 {
					p.Add(span{x0: start / 1000, x1: (start + r.DowntimeMs) / 1000, fill: downtimeShade})
				}
			}
			p.Add(plot.Grid(false, true))
		}
		answered := func(i int) bool {
			return cl.Timeline[i].Ops > 0 && plot.Usable(p50[i], logY) && plot.Usable(p99[i], logY)
		}
		if err := addLines(latency, xs, p50, answered, lineStyle(p50Color, 1, false)); err != nil {
			return failed(figClient, err)
		}
		if err := addLines(latency, xs, p99, answered, lineStyle(p99Color, 1, false)); err != nil {
			return failed(figClient, err)
		}
		all := func(int) bool { return true }
		if err := addLines(throughput, xs, ops, all, lineStyle(opsColor, 1, false)); err != nil {
			return failed(figClient, err)
		}
		if slices.ContainsFunc(errs, func(e float64) bool { return e > 0 }) {
			withErrors = true
			if err := addLines(throughput, xs, errs, all, lineStyle(errorColor, 1, true)); err != nil {
				return failed(figClient, err)
			}
		}
		if logY {
			plot.LogAxis(&latency.Y, slices.Min(lat), slices.Max(lat))
		} else {
			latency.Y.Min = math.Min(latency.Y.Min, 0)
		}
		throughput.Y.Min = 0
		rows = append(rows, []*gplot.Plot{latency, throughput})
	}
	legend := newLegend()
	legend.Add("p50 latency", lineThumb(lineStyle(p50Color, 1.5, false)))
	legend.Add("p99 latency", lineThumb(lineStyle(p99Color, 1.5, false)))
	legend.Add("answered/s", lineThumb(lineStyle(opsColor, 1.5, false)))
	if withErrors {
		legend.Add("errors/s", lineThumb(lineStyle(errorColor, 1.5, true)))
	}
	if aligned > 0 {
		legend.Add("migration", swatch{fill: migrationShade})
		legend.Add("downtime", swatch{fill: downtimeShade})
	}
	svg, err := render(rows, legend, figWidth, vg.Length(len(rows))*2.3*vg.Inch+0.2*vg.Inch)
	if err != nil {
		return failed(figClient, err)
	}
	service := reps[0].run.Client.Service
	caption := fmt.Sprintf("What the %s client saw during one migration per mode at %s: for each mode the run of median total time among its completed runs with a client timeline (%s). Left, the p50 and p99 latency of the requests sent in each %s ms bucket (a gap: no request answered); right, requests answered per second.",
		orWord(service, "service's"), describe(setting), chosen(reps), trimFloat(reps[0].run.Client.BucketMs))
	if aligned > 0 {
		caption += " Grey: the migration, start to end; red: its downtime, from the freeze for as long as the reported downtime."
	}
	if unaligned > 0 {
		caption += fmt.Sprintf(" %d of the runs lack a start time on one of the two clocks, so their time axis starts with the client and the migration is not marked.", unaligned)
	}
	return figure{kind: figClient, svg: svg, caption: caption + " " + w.runCount()}
}

// addLines draws ys against xs as a line broken where ok is false.
func addLines(p *gplot.Plot, xs, ys []float64, ok func(int) bool, style draw.LineStyle) error {
	for _, seg := range segments(xs, ys, ok) {
		l, err := plotter.NewLine(seg)
		if err != nil {
			return err
		}
		l.LineStyle = style
		p.Add(l)
	}
	return nil
}

// lineThumb is a legend entry's line.
func lineThumb(style draw.LineStyle) gplot.Thumbnailer {
	return &plotter.Line{LineStyle: style}
}

func orWord(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// predictedFigure is figure 5: the model's predictions against the
// measured medians, per grid point.
func (w *workload) predictedFigure() figure {
	var cs []plot.Comparison
	points, runs := 0, 0
	for _, pt := range w.points {
		i := slices.IndexFunc(pt.ok, func(r experiment.Run) bool { return r.Predicted != nil })
		if i < 0 {
			continue
		}
		pred := pt.ok[i].Predicted
		group := pt.Mode
		if w.varies.runtime {
			group += " " + pt.Runtime
		}
		cs = append(cs,
			plot.Comparison{Group: group, Metric: "total", Measured: pt.total.Median, Predicted: pred.TotalMs},
			plot.Comparison{Group: group, Metric: "client downtime", Measured: pt.clientDowntime.Median, Predicted: pred.ClientDowntimeMs})
		points++
		runs += len(pt.ok)
	}
	if points == 0 {
		if slices.ContainsFunc(w.runs, func(r experiment.Run) bool { return r.Predicted != nil }) {
			return figure{kind: figPredicted, omitted: "Only failed runs carry a prediction, so nothing measured can be compared with it."}
		}
		return figure{kind: figPredicted, omitted: "No run carries a prediction (the experiment named no profile), so predictions are not compared with measurements."}
	}
	p, placed, err := plot.PredictedVsMeasured("Predicted against measured (medians)", cs)
	if errors.Is(err, plot.ErrNoPoints) {
		return figure{kind: figPredicted, omitted: "No prediction or measurement is above zero, so none can be placed on the log-log axes of predicted against measured."}
	}
	if err != nil {
		return failed(figPredicted, err)
	}
	svg, err := render([][]*gplot.Plot{{p}}, nil, 6*vg.Inch, 4.6*vg.Inch)
	if err != nil {
		return failed(figPredicted, err)
	}
	caption := fmt.Sprintf("Predicted against measured, log-log: per grid point, the median of its completed runs beside the model's prediction; circles total time, squares client downtime, one colour per mode. On the dashed diagonal y = x the prediction is exact; above it the model overestimates. %d markers for %d grid points from %d completed runs",
		placed, points, runs)
	if left := len(cs) - placed; left > 0 {
		caption += fmt.Sprintf("; %d values of zero are left out", left)
	}
	return figure{kind: figPredicted, svg: svg, caption: caption + "."}
}

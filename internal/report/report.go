// Package report turns an experiment's results into one self-contained
// HTML page: per workload, figures (inline SVG drawn with gonum/plot) and
// a table of every grid point's medians and their confidence intervals.
// The page needs nothing else to open: no script, no file or font fetched.
package report

import (
	"fmt"
	"html/template"
	"image/color"
	"io"
	"math"
	"regexp"
	"slices"
	"strings"

	"github.com/ferry-migrate/ferry/internal/experiment"
	"github.com/ferry-migrate/ferry/internal/plot"
)

// Write writes res as an HTML report. Missing data (no runs, failed runs
// without phases, no client or prediction) leaves out what it would have
// drawn, with a sentence saying why; only a failed write is an error.
func Write(w io.Writer, res experiment.Results) error {
	return page.Execute(w, build(res))
}

// view is what the template shows.
type view struct {
	Title, Machine, Started string
	Runs, OK                int
	FontFace                template.CSS
	Workloads               []workloadView
	MinRuns                 int
	Level                   string
	// Auto is --mode auto held to the measured best (with a profile).
	Auto        []autoView
	AutoSummary string
}

type autoView struct {
	Point, Picked, Measured string
	Agree                   bool
}

type workloadView struct {
	ID, Name, Summary string
	Figures           []figureView
	// Which optional columns the table has.
	Runtime, Dirty, Load bool
	Rows                 []rowView
	Failed               []failedView
}

type figureView struct {
	ID, Kind string
	Number   int
	SVG      template.HTML
	Caption  string
	Omitted  string
}

type rowView struct {
	Runtime, Mode, State, Dirty, Load, Link string
	Runs, OK                                int
	Total, Downtime, Client, MiB            cell
	StateOK                                 string
}

// cell is a median and its interval, as the table prints them.
type cell struct {
	Median, Range, Note string
	// MinMax marks a range that is no confidence interval.
	MinMax bool
}

type failedView struct {
	Point, Error string
	Repeat       int
}

func build(res experiment.Results) view {
	v := view{
		Title:   orWord(res.Name, "ferry experiment"),
		Machine: res.Machine, Started: res.Started,
		Runs:     len(res.Runs),
		FontFace: template.CSS(plot.FontFaceCSS()),
		MinRuns:  MinRunsForCI,
		Level:    fmt.Sprintf("%.0f %%", CILevel*100),
	}
	for _, r := range res.Runs {
		if r.OK {
			v.OK++
		}
	}
	colors := modeColors(res.Runs)
	number := 0
	ids := map[string]int{}
	for _, w := range group(res.Runs) {
		wv := workloadView{Name: orWord(w.name, "(unnamed)"), Summary: w.summary(),
			Runtime: w.has(func(p experiment.Point) bool { return p.Runtime != "" }),
			Dirty:   w.has(func(p experiment.Point) bool { return p.DirtyRate > 0 }),
			Load:    w.has(func(p experiment.Point) bool { return p.Load > 0 })}
		wv.ID = uniqueID(ids, "w-"+slug(wv.Name))
		for _, f := range w.figures(colors) {
			fv := figureView{ID: wv.ID + "-" + f.kind, Kind: f.kind, SVG: f.svg, Caption: f.caption, Omitted: f.omitted}
			if f.svg != "" {
				number++
				fv.Number = number
			}
			wv.Figures = append(wv.Figures, fv)
		}
		for _, p := range w.points {
			wv.Rows = append(wv.Rows, p.row())
			for _, r := range p.runs {
				if !r.OK {
					wv.Failed = append(wv.Failed, failedView{Point: pointName(r.Point), Repeat: r.Repeat,
						Error: orWord(r.Error, "(no error recorded)")})
				}
			}
		}
		v.Workloads = append(v.Workloads, wv)
	}
	for _, c := range res.Auto {
		v.Auto = append(v.Auto, autoView{Point: c.Point.Workload + ": " + strings.TrimPrefix(pointName(c.Point), ", "), Agree: c.Agree,
			Picked: orWord(c.Picked, "none within the budget"), Measured: orWord(c.Measured, "none within the budget")})
	}
	if len(res.Auto) > 0 {
		v.AutoSummary = experiment.AutoSummary(res.Auto, res.BudgetMs)
	}
	return v
}

// modeColors gives each mode one colour across the report.
func modeColors(runs []experiment.Run) map[string]color.Color {
	var modes []string
	for _, r := range runs {
		if !slices.Contains(modes, r.Mode) {
			modes = append(modes, r.Mode)
		}
	}
	slices.SortFunc(modes, compareModes)
	colors := map[string]color.Color{}
	for i, m := range modes {
		colors[m] = plot.Color(i)
	}
	return colors
}

func (w *workload) has(f func(experiment.Point) bool) bool {
	return slices.ContainsFunc(w.points, func(p *point) bool { return f(p.Point) })
}

func (w *workload) summary() string {
	ok := 0
	for _, r := range w.runs {
		if r.OK {
			ok++
		}
	}
	var sizes []string
	for _, p := range w.points {
		if s := formatBytes(p.StateBytes); !slices.Contains(sizes, s) {
			sizes = append(sizes, s)
		}
	}
	return fmt.Sprintf("%d runs at %d grid points (modes %s; state %s): %d completed, %d failed.",
		len(w.runs), len(w.points), strings.Join(w.modes, ", "), strings.Join(sizes, ", "), ok, len(w.runs)-ok)
}

// pointName names a grid point fully, for the list of failed runs.
func pointName(p experiment.Point) string {
	parts := []string{p.Mode}
	if p.Runtime != "" {
		parts = append(parts, p.Runtime)
	}
	parts = append(parts, formatBytes(p.StateBytes))
	if p.DirtyRate > 0 {
		parts = append(parts, fmt.Sprintf("%d pages/s", p.DirtyRate))
	}
	if p.Load > 0 {
		parts = append(parts, fmt.Sprintf("%d req/s", p.Load))
	}
	return strings.Join(append(parts, formatRate(p.BandwidthBps)), ", ")
}

func (p *point) row() rowView {
	r := rowView{Runtime: p.Runtime, Mode: p.Mode, State: formatBytes(p.StateBytes), Link: formatRate(p.BandwidthBps),
		Runs: len(p.runs), OK: len(p.ok), StateOK: fmt.Sprintf("%d/%d", p.stateOK, len(p.runs))}
	if p.DirtyRate > 0 {
		r.Dirty = fmt.Sprint(p.DirtyRate)
	}
	if p.Load > 0 {
		r.Load = fmt.Sprint(p.Load)
	}
	r.Total, r.Downtime, r.Client = msCell(p.total), msCell(p.downtime), msCell(p.clientDowntime)
	b := p.bytesSent
	b.Median, b.Lo, b.Hi = b.Median/mib, b.Lo/mib, b.Hi/mib
	r.MiB = newCell(b, func(v float64) string { return fmt.Sprintf("%.1f", v) })
	return r
}

func msCell(iv Interval) cell { return newCell(iv, formatMs) }

func newCell(iv Interval, format func(float64) string) cell {
	if iv.N == 0 {
		return cell{Median: "–"}
	}
	c := cell{Median: format(iv.Median), Range: format(iv.Lo) + "–" + format(iv.Hi)}
	if iv.IsCI() {
		c.Note = fmt.Sprintf("%.0f %% confidence interval of the median: x(%d) to x(%d) of %d sorted runs, coverage %.1f %%",
			CILevel*100, iv.K, iv.N+1-iv.K, iv.N, iv.Coverage*100)
	} else {
		c.MinMax = true
		c.Note = fmt.Sprintf("minimum to maximum of %d runs: too few for a %.0f %% confidence interval", iv.N, CILevel*100)
	}
	return c
}

// formatMs prints milliseconds to three significant digits or more.
func formatMs(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

var notSlug = regexp.MustCompile(`[^a-z0-9]+`)

func slug(s string) string {
	return orWord(strings.Trim(notSlug.ReplaceAllString(strings.ToLower(s), "-"), "-"), "x")
}

// uniqueID makes ids distinct where two names slug alike.
func uniqueID(seen map[string]int, id string) string {
	seen[id]++
	if n := seen[id]; n > 1 {
		return fmt.Sprintf("%s-%d", id, n)
	}
	return id
}

var page = template.Must(template.Must(template.New("report").Parse(cellTemplate)).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}: ferry experiment report</title>
<style>
{{.FontFace}}
body { font-family: "Liberation Sans", Arimo, Arial, Helvetica, sans-serif; color: #222; margin: 2em auto; max-width: 64em; padding: 0 1em; line-height: 1.45; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
.meta { color: #555; margin-top: 0; }
figure { margin: 1.5em 0; padding: 0.5em; border: 1px solid #e4e4e4; background: #fff; }
figure svg { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { font-size: 0.9em; color: #333; margin-top: 0.5em; }
p.omitted { font-style: italic; color: #666; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; vertical-align: top; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; white-space: nowrap; }
td.num small { display: block; color: #666; }
td.bad { color: #a00; }
code { font-size: 0.9em; }
nav ul { margin: 0; }
</style>
</head>
<body>
<header>
<h1>{{.Title}}</h1>
<p class="meta">{{if .Started}}Started {{.Started}}. {{end}}{{if .Machine}}Machine: {{.Machine}}. {{end}}{{.Runs}} runs, {{.OK}} completed.</p>
{{if gt (len .Workloads) 1}}<nav><ul>{{range .Workloads}}<li><a href="#{{.ID}}">{{.Name}}</a></li>{{end}}</ul></nav>{{end}}
</header>
<section id="method">
<h2>How to read this report</h2>
<p>Each grid point (workload, runtime, mode, state size, dirty rate or load, link) ran several times. Medians are over a point's completed runs; failed runs are counted and listed with their errors but never enter a median. <em>Downtime</em> is what ferry reported, from the freeze to the commit; <em>client downtime</em> is the longest stall the workload's client saw.</p>
<p>The intervals around medians are distribution-free {{.Level}} confidence intervals from order statistics: with a point's n values sorted, x(1) ≤ … ≤ x(n), the count of values below the true median is Binomial(n, ½) whatever the distribution, so [x(k), x(n+1−k)] covers the median with probability 1 − 2·P(B ≤ k−1). The report takes the largest k whose coverage is still at least {{.Level}}. With fewer than {{.MinRuns}} completed runs no such interval exists (even [min, max] covers the median with probability below {{.Level}}); the report then shows the minimum to the maximum instead and marks it with †.</p>
<p>Figures that show one migration per mode (phases, rounds, the client's view) take, at one setting shared by the modes, each mode's run of median total time; their captions name the setting and how many runs each was chosen from.</p>
</section>
{{if not .Workloads}}<p class="omitted">The results hold no runs, so there is nothing to show.</p>{{end}}
{{range $w := .Workloads}}
<section class="workload" id="{{.ID}}">
<h2>Workload {{.Name}}</h2>
<p>{{.Summary}}</p>
{{range .Figures}}{{if .SVG}}
<figure id="{{.ID}}" class="{{.Kind}}">
{{.SVG}}
<figcaption><strong>Figure {{.Number}}.</strong> {{.Caption}}</figcaption>
</figure>
{{else}}
<p class="omitted" id="{{.ID}}" data-figure="{{.Kind}}">{{.Omitted}}</p>
{{end}}{{end}}
<h3>Grid points</h3>
<table class="points">
<thead><tr>{{if .Runtime}}<th>runtime</th>{{end}}<th>mode</th><th>state</th>{{if .Dirty}}<th>dirty (pages/s)</th>{{end}}{{if .Load}}<th>load (req/s)</th>{{end}}<th>link</th><th>completed</th><th>total (ms)</th><th>downtime (ms)</th><th>client downtime (ms)</th><th>sent (MiB)</th><th>state OK</th></tr></thead>
<tbody>
{{range .Rows}}<tr>{{if $w.Runtime}}<td>{{.Runtime}}</td>{{end}}<td>{{.Mode}}</td><td class="num">{{.State}}</td>{{if $w.Dirty}}<td class="num">{{.Dirty}}</td>{{end}}{{if $w.Load}}<td class="num">{{.Load}}</td>{{end}}<td class="num">{{.Link}}</td><td class="num{{if lt .OK .Runs}} bad{{end}}">{{.OK}}/{{.Runs}}</td>{{template "cell" .Total}}{{template "cell" .Downtime}}{{template "cell" .Client}}{{template "cell" .MiB}}<td class="num">{{.StateOK}}</td></tr>
{{end}}</tbody>
</table>
<p class="note">Under each median: its {{$.Level}} confidence interval, or, marked †, the minimum to the maximum where there were fewer than {{$.MinRuns}} completed runs. State OK counts, of all runs, those whose state checked out afterwards.</p>
<h3>Failed runs</h3>
{{if .Failed}}<table class="failed">
<thead><tr><th>grid point</th><th>repeat</th><th>error</th></tr></thead>
<tbody>
{{range .Failed}}<tr><td>{{.Point}}</td><td class="num">{{.Repeat}}</td><td><code>{{.Error}}</code></td></tr>
{{end}}</tbody>
</table>{{else}}<p>None.</p>{{end}}
</section>
{{end}}
{{if .Auto}}<section id="auto">
<h2>--mode auto against the measured best</h2>
<p>{{.AutoSummary}}. At each grid point where every mode ran, the mode the model picks from what the migrations found (memory, dirty rate, link) against the mode that measured best by the planner's own rule: within the budget on the client's longest stall, the modes that keep the source resumable (cold, pre-copy) first, the lowest median total among them; the lazy modes only when neither fits.</p>
<table class="auto">
<thead><tr><th>grid point</th><th>auto picks</th><th>measured best</th><th>agree</th></tr></thead>
<tbody>
{{range .Auto}}<tr><td>{{.Point}}</td><td>{{.Picked}}</td><td>{{.Measured}}</td><td{{if not .Agree}} class="bad"{{end}}>{{if .Agree}}yes{{else}}no{{end}}</td></tr>
{{end}}</tbody>
</table>
</section>{{end}}
</body>
</html>
`))

// cellTemplate prints a median with its interval below it.
const cellTemplate = `{{define "cell"}}<td class="num"{{if .Note}} title="{{.Note}}"{{end}}>{{.Median}}{{if .Range}}<small>{{.Range}}{{if .MinMax}} †{{end}}</small>{{end}}</td>{{end}}`

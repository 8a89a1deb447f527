package report

import (
	"html/template"
	"io"
	"math"
	"strconv"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/ferry-migrate/ferry/internal/followlab"
	"github.com/ferry-migrate/ferry/internal/plot"
)

// WriteFollow writes a follow scenario's report: on one time axis the
// client's latency and each host's round trip, which host served it, each
// decision and each move; then the scores and the moves.
func WriteFollow(w io.Writer, res followlab.Results) error {
	v := followView{Title: res.Spec.Name, FontFace: template.CSS(plot.FontFaceCSS()), S: res.Scores, Error: res.Error,
		Started: time.UnixMilli(res.StartUnixMs).UTC().Format(time.RFC3339), Seconds: res.DurationMs / 1000}
	if svg, err := followFigure(res); err != nil {
		v.Omitted = "The figure could not be drawn: " + err.Error()
	} else {
		v.SVG = svg
	}
	for _, m := range res.Moves {
		v.Moves = append(v.Moves, moveView{Move: m, Over: m.OK && m.TriggerToRunningMs > m.BoundMs, Far: m.OK && m.DowntimeError > 0.2})
	}
	return followPage.Execute(w, v)
}

type followView struct {
	Title, Started, Error string
	Seconds               float64
	FontFace              template.CSS
	SVG                   template.HTML
	Omitted               string
	S                     followlab.Scores
	Moves                 []moveView
}

type moveView struct {
	followlab.Move
	Over, Far bool
}

// followFigure draws the scenario: the latency panel above, the serving
// host below, moves shaded in both.
func followFigure(res followlab.Results) (template.HTML, error) {
	hosts := res.Spec.HostNames()
	colors := map[string]int{}
	for i, h := range hosts {
		colors[h] = i
	}
	end := res.DurationMs / 1000
	lat := plot.New("the client's latency", "time (s)", "ms")
	served := plot.New("the host serving it", "time (s)", "")
	var moves []span
	for _, m := range res.Moves {
		moves = append(moves, span{x0: m.DecidedMs / 1000, x1: m.MovedMs / 1000, fill: migrationShade})
	}
	for _, p := range []*gplot.Plot{lat, served} {
		for _, s := range moves {
			p.Add(s)
		}
		p.X.Min, p.X.Max = 0, end
	}
	lat.Add(plot.Grid(false, true))
	legend := newLegend()

	// Each host's round trip as set (dashed), and the serving host's (solid).
	for _, h := range hosts {
		var xy plotter.XYs
		for i, p := range res.RTTs {
			x1 := end
			if i+1 < len(res.RTTs) {
				x1 = res.RTTs[i+1].TMs / 1000
			}
			xy = append(xy, plotter.XY{X: p.TMs / 1000, Y: p.RTT[h]}, plotter.XY{X: x1, Y: p.RTT[h]})
		}
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return "", err
		}
		l.LineStyle = lineStyle(plot.Color(colors[h]), 0.8, true)
		lat.Add(l)
		legend.Add(h+" round trip (set)", l)
	}
	var xs, ys []float64
	for t := 0.0; t < res.DurationMs; t += 100 {
		if rtt := res.RTTAt(t); rtt != nil {
			xs, ys = append(xs, t/1000), append(ys, rtt[res.ServingAt(t)])
		}
	}
	if len(xs) > 0 {
		style := lineStyle(plot.Palette[7], 1.6, false)
		if err := addLines(lat, xs, ys, func(int) bool { return true }, style); err != nil {
			return "", err
		}
		legend.Add("its host's round trip", lineThumb(style))
	}
	// The client's own median request time, bucket by bucket.
	if c := res.Client; c.BucketMs > 0 {
		off := float64(c.StartUnixMs - res.StartUnixMs)
		var cx, cy []float64
		for _, b := range c.Timeline {
			cx, cy = append(cx, (off+b.TMs+c.BucketMs/2)/1000), append(cy, b.P50Ms)
		}
		style := lineStyle(plot.Palette[3], 1, false)
		if err := addLines(lat, cx, cy, func(i int) bool { return c.Timeline[i].Ops > 0 }, style); err != nil {
			return "", err
		}
		legend.Add("client's median request", lineThumb(style))
	}
	lat.Y.Min = 0

	// Serving host: one box per stretch, at its row.
	var bs boxes
	for _, s := range res.Served {
		y := float64(colors[s.Host])
		bs = append(bs, box{x0: s.FromMs / 1000, x1: s.ToMs / 1000, y0: y - 0.35, y1: y + 0.35, fill: plot.Color(colors[s.Host])})
	}
	served.Add(bs)
	served.Y.Min, served.Y.Max = -0.6, float64(len(hosts))-0.4
	var ticks []gplot.Tick
	for i, h := range hosts {
		ticks = append(ticks, gplot.Tick{Value: float64(i), Label: h})
	}
	served.Y.Tick.Marker = gplot.ConstantTicks(ticks)
	// Decisions: a mark at each, on the row of the host deciding.
	var marks plotter.XYs
	for _, e := range res.Events {
		if e.Kind == "decision" {
			marks = append(marks, plotter.XY{X: float64(e.Time.UnixMilli()-res.StartUnixMs) / 1000, Y: float64(colors[e.Host])})
		}
	}
	if len(marks) > 0 {
		sc, err := plotter.NewScatter(marks)
		if err != nil {
			return "", err
		}
		sc.GlyphStyle.Color, sc.GlyphStyle.Radius = plot.Palette[7], vg.Points(3)
		served.Add(sc)
		legend.Add("decision", sc)
	}
	legend.Add("move (decision to running)", swatch{fill: migrationShade})
	return render([][]*gplot.Plot{{lat}, {served}}, legend, figWidth, 5*vg.Inch)
}

func ms1(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

var followPage = template.Must(template.New("follow").Funcs(template.FuncMap{"ms": ms1,
	"mulf": func(v float64) float64 { return v * 100 }, "sec": func(v float64) float64 { return v / 1000 }}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}: ferry follow scenario</title>
<style>
{{.FontFace}}
body { font-family: "Liberation Sans", Arimo, Arial, Helvetica, sans-serif; color: #222; margin: 2em auto; max-width: 64em; padding: 0 1em; line-height: 1.45; }
figure { margin: 1.5em 0; padding: 0.5em; border: 1px solid #e4e4e4; }
figure svg { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; }
td.bad { color: #a00; }
p.omitted { font-style: italic; color: #666; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p>Started {{.Started}}, {{printf "%.0f" .Seconds}} s. A client's round trip to each edge host follows the scenario's schedule (the lab's delay lines); <code>ferry follow</code> moves the service after it.{{if .Error}} <strong>The run ended with an error:</strong> {{.Error}}{{end}}</p>
{{if .SVG}}<figure id="follow" class="follow">
{{.SVG}}
<figcaption><strong>Figure 1.</strong> Above: each host's round trip to the client as the delay lines were set (dashed), the round trip to the host serving it (black) and the client's own median request time (pink). Below: which host served the client. Grey: a move, from the decision to the service running on its new host; dots: decisions.</figcaption>
</figure>{{else}}<p class="omitted">{{.Omitted}}</p>{{end}}
<h2>Scores</h2>
<table>
<tr><th>Time-weighted mean round trip, following</th><td class="num">{{ms .S.MeanLatencyMs}} ms</td></tr>
<tr><th>… an oracle always on the nearest host</th><td class="num">{{ms .S.OracleMeanLatencyMs}} ms ({{printf "%.2f" .S.VsOracle}}x of it; target at most 1.25x)</td></tr>
<tr><th>… never moving</th><td class="num">{{ms .S.StaticMeanLatencyMs}} ms ({{printf "%.2f" .S.StaticOver}}x following's; target at least 2x)</td></tr>
<tr><th>The client's median request time</th><td class="num">{{ms .S.ClientP50Ms}} ms</td></tr>
<tr><th>Decisions, moves, failed moves</th><td class="num">{{.S.Decisions}}, {{.S.Moves}}, {{.S.FailedMoves}}</td></tr>
<tr><th>Largest downtime prediction error</th><td class="num">{{printf "%.0f" (mulf .S.MaxDowntimeError)}} %</td></tr>
</table>
<h2>Moves</h2>
{{if not .Moves}}<p class="omitted">ferry follow made no move.</p>{{else}}
<table>
<tr><th>ID</th><th>From</th><th>To</th><th>Mode</th><th>Trigger (s)</th><th>Decided (s)</th><th>Running (s)</th><th>Trigger to running (ms)</th><th>Bound: dwell + 1.2x predicted total (ms)</th><th>Downtime predicted / measured (ms)</th><th>Total predicted / measured (ms)</th></tr>
{{range .Moves}}<tr><td><code>{{.ID}}</code></td><td>{{.From}}</td><td>{{.To}}{{if not .OK}} (failed){{end}}</td><td>{{.Mode}}</td>
<td class="num">{{printf "%.1f" (sec .TriggerMs)}}</td><td class="num">{{printf "%.1f" (sec .DecidedMs)}}</td><td class="num">{{printf "%.1f" (sec .RunningMs)}}</td>
<td class="num{{if .Over}} bad{{end}}">{{printf "%.0f" .TriggerToRunningMs}}</td><td class="num">{{printf "%.0f" .BoundMs}}</td>
<td class="num{{if .Far}} bad{{end}}">{{printf "%.0f" .PredictedDowntimeMs}} / {{printf "%.0f" .DowntimeMs}}</td><td class="num">{{printf "%.0f" .PredictedTotalMs}} / {{printf "%.0f" .TotalMs}}</td></tr>
{{end}}</table>{{end}}
</body>
</html>
`))

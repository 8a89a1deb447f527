package plot

import (
	"image/color"
	"math"
	"slices"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Comparison is one predicted value beside the measured one (ms).
type Comparison struct {
	// Group is drawn in one colour (the mode), Metric with one marker
	// (total, downtime); the legend names each pair present.
	Group, Metric       string
	Measured, Predicted float64
}

// markers are the metrics' shapes, in the order metrics first appear.
var markers = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.TriangleGlyph{}, draw.CrossGlyph{}}

// PredictedVsMeasured plots predicted against measured, log-log on one
// shared range so that y = x, drawn dashed, is the square's diagonal: one
// colour per group, one marker per metric. It returns the plot and the
// points it placed; comparisons not positive on both axes are left out,
// and ErrNoPoints says none was left.
func PredictedVsMeasured(title string, cs []Comparison) (*gplot.Plot, int, error) {
	var groups, metrics []string
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cs {
		if !Usable(c.Measured, true) || !Usable(c.Predicted, true) {
			continue
		}
		if !slices.Contains(groups, c.Group) {
			groups = append(groups, c.Group)
		}
		if !slices.Contains(metrics, c.Metric) {
			metrics = append(metrics, c.Metric)
		}
		lo = math.Min(lo, math.Min(c.Measured, c.Predicted))
		hi = math.Max(hi, math.Max(c.Measured, c.Predicted))
	}
	if len(groups) == 0 {
		return nil, 0, ErrNoPoints
	}
	p := New(title, "measured (ms)", "predicted (ms)")
	p.Add(Grid(true, true))
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs = vg.Points(6)
	p.Legend.Padding = vg.Points(2)

	diagonal := plotter.NewFunction(func(x float64) float64 { return x })
	diagonal.LineStyle = draw.LineStyle{Color: color.Gray{Y: 0x88}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(5), vg.Points(3)}}
	p.Add(diagonal)

	placed := 0
	for gi, g := range groups {
		for mi, m := range metrics {
			var xys plotter.XYs
			for _, c := range cs {
				if c.Group == g && c.Metric == m && Usable(c.Measured, true) && Usable(c.Predicted, true) {
					xys = append(xys, plotter.XY{X: c.Measured, Y: c.Predicted})
				}
			}
			if len(xys) == 0 {
				continue
			}
			s, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, 0, err
			}
			s.GlyphStyle = draw.GlyphStyle{Color: Color(gi), Radius: vg.Points(3.5), Shape: markers[mi%len(markers)]}
			p.Add(s)
			p.Legend.Add(g+" "+m, s)
			placed += len(xys)
		}
	}
	p.Legend.Add("y = x", diagonal)
	LogAxis(&p.X, lo, hi)
	LogAxis(&p.Y, lo, hi)
	return p, placed, nil
}

// PredictedVsMeasuredSVG is PredictedVsMeasured as a standalone SVG
// document, 6 × 4.5 in.
func PredictedVsMeasuredSVG(title string, cs []Comparison) ([]byte, error) {
	p, _, err := PredictedVsMeasured(title, cs)
	if err != nil {
		return nil, err
	}
	return PlotSVG(p, 6*vg.Inch, 4.5*vg.Inch)
}

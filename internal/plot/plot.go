// Package plot draws ferry's figures with gonum/plot as SVG, in one house
// style: Liberation Sans text that falls back to metric-compatible fonts, a
// colour-blind-safe palette, log axes labelled at 1, 2 and 5, and the
// predicted-against-measured scatter that the model's validation and the
// experiment report share.
package plot

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"image/color"
	"math"
	"strconv"
	"sync"

	"codeberg.org/go-fonts/liberation/liberationsansregular"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// ErrNoPoints: nothing could be placed on the axes (no points, or only
// non-positive values on a log axis).
var ErrNoPoints = errors.New("plot: no points to draw")

// Palette stays distinct for colour-blind readers (Okabe and Ito), black
// last.
var Palette = []color.Color{
	rgb(0x0072B2), rgb(0xD55E00), rgb(0x009E73), rgb(0xCC79A7),
	rgb(0xE69F00), rgb(0x56B4E9), rgb(0xF0E442), rgb(0x000000),
}

// Color is the palette's i-th colour, wrapping around.
func Color(i int) color.Color { return Palette[i%len(Palette)] }

func rgb(v uint32) color.RGBA {
	return color.RGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 0xff}
}

// sans is the face every text uses. gonum measures text with the embedded
// Liberation Sans; a reader's browser may lack it, so the SVG asks for
// FontFamily, whose fallbacks have the same metrics.
var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// FontFamily is the CSS font-family the SVG's text asks for: Liberation
// Sans, then Arimo, Arial and Helvetica, which share its metrics.
const FontFamily = "'Liberation Sans',Arimo,Arial,Helvetica,sans-serif"

// FontFaceCSS is a CSS @font-face rule carrying Liberation Sans itself (a
// data URL, some 550 kB), for a page holding several figures inline: it
// then shows their text exactly as gonum measured it, offline.
var FontFaceCSS = sync.OnceValue(func() string {
	return `@font-face{font-family:"Liberation Sans";font-style:normal;font-weight:normal;` +
		`src:url(data:font/ttf;base64,` + base64.StdEncoding.EncodeToString(liberationsansregular.TTF) + `) format("truetype")}`
})

// Font is the house face at a size in points, for texts a figure adds
// itself (labels on bars).
func Font(size vg.Length) font.Font { return font.From(sans, size) }

// New returns an empty plot in the house style.
func New(title, xLabel, yLabel string) *gplot.Plot {
	p := gplot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font = Font(11)
	p.Title.Padding = vg.Points(6)
	for _, a := range []*gplot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = Font(10)
		a.Tick.Label.Font = Font(9)
	}
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	p.X.Tick.Marker, p.Y.Tick.Marker = linearTicks{}, linearTicks{}
	p.Legend.TextStyle.Font = Font(9)
	p.Legend.ThumbnailWidth = vg.Points(16)
	return p
}

// Grid is light grid lines, to add first so that the data lies above.
func Grid(vertical, horizontal bool) *plotter.Grid {
	g := plotter.NewGrid()
	line := draw.LineStyle{Color: color.Gray{Y: 0xe0}, Width: vg.Points(0.5)}
	g.Vertical, g.Horizontal = draw.LineStyle{}, draw.LineStyle{}
	if vertical {
		g.Vertical = line
	}
	if horizontal {
		g.Horizontal = line
	}
	return g
}

// SVG renders what draw puts on a w × h canvas as a standalone SVG
// document. gonum panics on some degenerate input (an empty log range);
// that comes back as an error, so one bad figure never takes a report
// down.
func SVG(w, h vg.Length, drawOn func(draw.Canvas)) (svg []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			svg, err = nil, fmt.Errorf("plot: drawing failed: %v", r)
		}
	}()
	c := vgsvg.New(w, h)
	drawOn(draw.New(c))
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	return withFallbackFonts(b.Bytes()), nil
}

// PlotSVG renders one plot filling a w × h canvas.
func PlotSVG(p *gplot.Plot, w, h vg.Length) ([]byte, error) {
	return SVG(w, h, p.Draw)
}

// withFallbackFonts gives the family vgsvg names (the face's own name,
// nothing else) its fallbacks.
func withFallbackFonts(svg []byte) []byte {
	return bytes.ReplaceAll(svg, []byte("font-family:Liberation Sans;"), []byte("font-family:"+FontFamily+";"))
}

// Inline is an SVG document made fit to sit inside HTML: from its <svg>
// element on, without the XML declaration and comment before it.
func Inline(svg []byte) []byte {
	if i := bytes.Index(svg, []byte("<svg")); i >= 0 {
		return svg[i:]
	}
	return svg
}

// Usable says whether v can be placed on an axis: finite, and positive on a
// log one.
func Usable(v float64, log bool) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!log || v > 0)
}

// LogAxis puts a on a log scale over [lo, hi] (both > 0), widened to 1, 2
// or 5 times a power of ten. Call it after adding the data: Add widens
// the range to the data's again.
func LogAxis(a *gplot.Axis, lo, hi float64) {
	lo, hi = logStep(lo, false), logStep(hi, true)
	if lo == hi {
		lo, hi = logStep(lo*0.99, false), logStep(hi*1.01, true)
	}
	a.Scale = gplot.LogScale{}
	a.Tick.Marker = logTicks{}
	a.Min, a.Max = lo, hi
}

// WantLog says whether values spread widely enough for a log axis: all
// positive and the largest at least ratio times the smallest.
func WantLog(vs []float64, ratio float64) bool {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if !Usable(v, true) {
			return false
		}
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	return len(vs) > 0 && hi >= ratio*lo
}

// logTicks marks 1..9 times every power of ten in range; decades get
// labels, and so do 2 and 5 times them when the range spans two decades
// or less (gonum's LogTicks labels decades only, often none at all).
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []gplot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	few := math.Log10(hi)-math.Log10(lo) <= 2
	var ts []gplot.Tick
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		base := math.Pow(10, d)
		for m := 1.0; m < 10; m++ {
			v := m * base
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := gplot.Tick{Value: v}
			if m == 1 || (few && (m == 2 || m == 5)) {
				t.Label = FormatNum(v)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// linearTicks labels about five multiples of 1, 2 or 5 times a power of
// ten, with a minor tick halfway between (gonum's own pick steps like 9).
type linearTicks struct{}

func (linearTicks) Ticks(lo, hi float64) []gplot.Tick {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return gplot.DefaultTicks{}.Ticks(lo, hi)
	}
	step := niceStep((hi - lo) / 5)
	decimals := max(0, -int(math.Floor(math.Log10(step))))
	var ts []gplot.Tick
	for k := math.Floor(lo / step); k*step <= hi+step*1e-9; k++ {
		v := k * step
		if v >= lo-step*1e-9 {
			ts = append(ts, gplot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
		}
		if m := v + step/2; m >= lo && m <= hi {
			ts = append(ts, gplot.Tick{Value: m})
		}
	}
	return ts
}

// niceStep rounds a raw step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if raw <= m*p*(1+1e-12) {
			return m * p
		}
	}
	return 10 * p
}

// logStep rounds v down (or up) to 1, 2 or 5 times a power of ten.
func logStep(v float64, up bool) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	steps := []float64{1, 2, 5, 10}
	if up {
		for _, m := range steps {
			if v <= m*p*(1+1e-12) {
				return m * p
			}
		}
		return 10 * p
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if v >= steps[i]*p*(1-1e-12) {
			return steps[i] * p
		}
	}
	return p
}

// FormatNum prints a tick value briefly: 0.5, 20, 1000, 2e+06.
func FormatNum(v float64) string {
	if v != 0 && (math.Abs(v) >= 1e6 || math.Abs(v) < 1e-3) {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

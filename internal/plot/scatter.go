// Package plot writes small SVG charts without any dependency: a scatter
// plot with axes, ticks, labels, a legend and an optional y = x diagonal,
// enough for a predicted-versus-measured figure.
package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Point is one marker.
type Point struct {
	X, Y float64
	// Label becomes the marker's tooltip (an SVG <title>).
	Label string
}

// Markers a series can use.
const (
	Circle   = "circle"
	Square   = "square"
	Triangle = "triangle"
)

// Series is a set of points drawn alike and named once in the legend.
type Series struct {
	Name   string
	Color  string // any SVG colour; empty picks one from Palette
	Marker string // Circle (default), Square or Triangle
	Points []Point
}

// Scatter describes the chart.
type Scatter struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	// Diagonal draws y = x; both axes then share one range so that the
	// line is the square's diagonal.
	Diagonal      bool
	Width, Height int // pixels; 0 means 720 × 540
	Series        []Series
}

// Palette is a set of colours that stay distinct for colour-blind readers
// (Okabe and Ito).
var Palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

// ErrNoPoints: nothing could be placed on the axes (no points, or only
// non-positive values on a log axis).
var ErrNoPoints = errors.New("plot: no points to draw")

// frame is the plotting area inside the margins.
const (
	marginLeft   = 80
	marginRight  = 190 // the legend lives here
	marginTop    = 40
	marginBottom = 60
)

// axis maps data values to pixels along one direction.
type axis struct {
	log    bool
	lo, hi float64 // data range (log10 of it on a log axis)
	p0, p1 float64 // pixel range
}

func (a axis) tr(v float64) float64 {
	if a.log {
		v = math.Log10(v)
	}
	return a.p0 + (v-a.lo)/(a.hi-a.lo)*(a.p1-a.p0)
}

// usable says whether a value can be placed on the axis.
func usable(v float64, log bool) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!log || v > 0)
}

// WriteSVG renders the chart. Points that cannot be placed (NaN, or ≤ 0 on
// a log axis) are left out; if none remains it returns ErrNoPoints.
func (s Scatter) WriteSVG(w io.Writer) error {
	b, err := s.SVG()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// SVG renders the chart into a byte slice (see WriteSVG).
func (s Scatter) SVG() ([]byte, error) {
	width, height := s.Width, s.Height
	if width <= 0 || height <= 0 {
		width, height = 720, 540
	}
	xlo, xhi, ylo, yhi, n := s.extent()
	if n == 0 {
		return nil, ErrNoPoints
	}
	if s.Diagonal {
		xlo, ylo = math.Min(xlo, ylo), math.Min(xlo, ylo)
		xhi, yhi = math.Max(xhi, yhi), math.Max(xhi, yhi)
	}
	x := axis{log: s.LogX, p0: marginLeft, p1: float64(width - marginRight)}
	y := axis{log: s.LogY, p0: float64(height - marginBottom), p1: marginTop}
	var xt, yt []tick
	x.lo, x.hi, xt = ticks(xlo, xhi, s.LogX)
	y.lo, y.hi, yt = ticks(ylo, yhi, s.LogY)

	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	if s.Title != "" {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" font-size="15">%s</text>`+"\n",
			(marginLeft+width-marginRight)/2, marginTop/2+5, esc(s.Title))
	}
	// Grid and ticks.
	left, right := x.p0, x.p1
	top, bottom := y.p1, y.p0
	b.WriteString(`<g stroke="#ddd" stroke-width="1">` + "\n")
	for _, t := range xt {
		px := x.tr(t.v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", f(px), f(top), f(px), f(bottom))
	}
	for _, t := range yt {
		py := y.tr(t.v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", f(left), f(py), f(right), f(py))
	}
	b.WriteString("</g>\n")
	fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="black"/>`+"\n",
		f(left), f(top), f(right-left), f(bottom-top))
	for _, t := range xt {
		px := x.tr(t.v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="black"/>`+"\n", f(px), f(bottom), f(px), f(bottom+5))
		if t.label != "" {
			fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f(px), f(bottom+18), esc(t.label))
		}
	}
	for _, t := range yt {
		py := y.tr(t.v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="black"/>`+"\n", f(left-5), f(py), f(left), f(py))
		if t.label != "" {
			fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", f(left-8), f(py+4), esc(t.label))
		}
	}
	if s.XLabel != "" {
		fmt.Fprintf(&b, `<text x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", f((left+right)/2), height-15, esc(s.XLabel))
	}
	if s.YLabel != "" {
		fmt.Fprintf(&b, `<text x="18" y="%s" text-anchor="middle" transform="rotate(-90 18 %s)">%s</text>`+"\n",
			f((top+bottom)/2), f((top+bottom)/2), esc(s.YLabel))
	}
	if s.Diagonal {
		// A polyline, so that y = x is right even when only one axis is
		// logarithmic; samples outside the y range are left out.
		var pts []string
		for i := 0; i <= 64; i++ {
			v := x.lo + (x.hi-x.lo)*float64(i)/64
			if x.log {
				v = math.Pow(10, v)
			}
			if !usable(v, y.log) {
				continue
			}
			if py := y.tr(v); py >= top-0.5 && py <= bottom+0.5 {
				pts = append(pts, f(x.tr(v))+","+f(py))
			}
		}
		fmt.Fprintf(&b, `<polyline class="diagonal" points="%s" fill="none" stroke="#888" stroke-dasharray="6 4"/>`+"\n", strings.Join(pts, " "))
	}
	// Markers.
	for i, sr := range s.Series {
		color := sr.Color
		if color == "" {
			color = Palette[i%len(Palette)]
		}
		fmt.Fprintf(&b, `<g class="series" fill="%s" fill-opacity="0.8" stroke="%s">`+"\n", esc(color), esc(color))
		for _, p := range sr.Points {
			if !usable(p.X, s.LogX) || !usable(p.Y, s.LogY) {
				continue
			}
			marker(&b, sr.Marker, "point", x.tr(p.X), y.tr(p.Y), p.Label)
		}
		b.WriteString("</g>\n")
	}
	// Legend, right of the frame.
	lx := right + 20
	for i, sr := range s.Series {
		color := sr.Color
		if color == "" {
			color = Palette[i%len(Palette)]
		}
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<g class="legend" fill="%s" stroke="%s">`, esc(color), esc(color))
		marker(&b, sr.Marker, "key", lx, ly, "")
		fmt.Fprintf(&b, `</g><text x="%s" y="%s">%s</text>`+"\n", f(lx+12), f(ly+4), esc(sr.Name))
	}
	if s.Diagonal {
		ly := top + 10 + float64(len(s.Series))*20
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#888" stroke-dasharray="6 4"/><text x="%s" y="%s">y = x</text>`+"\n",
			f(lx-6), f(ly), f(lx+6), f(ly), f(lx+12), f(ly+4))
	}
	b.WriteString("</svg>\n")
	return b.Bytes(), nil
}

// extent is the range of the usable points and how many there are.
func (s Scatter) extent() (xlo, xhi, ylo, yhi float64, n int) {
	xlo, ylo = math.Inf(1), math.Inf(1)
	xhi, yhi = math.Inf(-1), math.Inf(-1)
	for _, sr := range s.Series {
		for _, p := range sr.Points {
			if !usable(p.X, s.LogX) || !usable(p.Y, s.LogY) {
				continue
			}
			xlo, xhi = math.Min(xlo, p.X), math.Max(xhi, p.X)
			ylo, yhi = math.Min(ylo, p.Y), math.Max(yhi, p.Y)
			n++
		}
	}
	return xlo, xhi, ylo, yhi, n
}

func marker(b *bytes.Buffer, kind, class string, x, y float64, label string) {
	const r = 4.5
	title := ""
	if label != "" {
		title = "<title>" + esc(label) + "</title>"
	}
	switch kind {
	case Square:
		fmt.Fprintf(b, `<rect class="%s" x="%s" y="%s" width="%s" height="%s">%s</rect>`+"\n", class, f(x-r), f(y-r), f(2*r), f(2*r), title)
	case Triangle:
		fmt.Fprintf(b, `<polygon class="%s" points="%s,%s %s,%s %s,%s">%s</polygon>`+"\n",
			class, f(x), f(y-r*1.2), f(x-r*1.1), f(y+r*0.8), f(x+r*1.1), f(y+r*0.8), title)
	default:
		fmt.Fprintf(b, `<circle class="%s" cx="%s" cy="%s" r="%s">%s</circle>`+"\n", class, f(x), f(y), f(r), title)
	}
}

// tick is a position on an axis (in data units) and its label ("" for a
// minor tick).
type tick struct {
	v     float64
	label string
}

// ticks widens [lo, hi] to round values and returns the axis range (log10
// of it on a log axis) and its ticks.
func ticks(lo, hi float64, log bool) (alo, ahi float64, ts []tick) {
	if log {
		return logTicks(lo, hi)
	}
	return linTicks(lo, hi)
}

func linTicks(lo, hi float64) (float64, float64, []tick) {
	if lo == hi {
		pad := math.Max(math.Abs(lo)*0.1, 1)
		lo, hi = lo-pad, hi+pad
	}
	step := niceStep((hi - lo) / 6)
	alo, ahi := math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	var ts []tick
	for i := 0; ; i++ {
		v := alo + float64(i)*step
		if v > ahi+step/2 {
			break
		}
		if math.Abs(v) < step*1e-9 {
			v = 0
		}
		ts = append(ts, tick{v, fmtNum(v)})
	}
	return alo, ahi, ts
}

// niceStep rounds a raw step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// logTicks widens [lo, hi] to 1, 2 or 5 times a power of ten and puts a
// tick on every 1..9 × 10^k inside. Decades get labels; so do 2× and 5×
// when the range spans two decades or less.
func logTicks(lo, hi float64) (float64, float64, []tick) {
	lo, hi = logStep(lo, false), logStep(hi, true)
	if lo == hi {
		lo, hi = lo/2, hi*2
	}
	alo, ahi := math.Log10(lo), math.Log10(hi)
	few := ahi-alo <= 2
	var ts []tick
	for d := math.Floor(alo); d <= math.Ceil(ahi); d++ {
		base := math.Pow(10, d)
		for m := 1.0; m < 10; m++ {
			v := m * base
			if lv := math.Log10(v); lv < alo-1e-9 || lv > ahi+1e-9 {
				continue
			}
			label := ""
			if m == 1 || (few && (m == 2 || m == 5)) {
				label = fmtNum(v)
			}
			ts = append(ts, tick{v, label})
		}
	}
	return alo, ahi, ts
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

// fmtNum prints a tick value briefly: 0.5, 20, 1000, 2e+06.
func fmtNum(v float64) string {
	if v != 0 && (math.Abs(v) >= 1e6 || math.Abs(v) < 1e-3) {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// f formats a pixel coordinate.
func f(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

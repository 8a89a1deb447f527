package plot

import (
	"bytes"
	"encoding/base64"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// texts parses an SVG document as XML and returns its texts.
func texts(t *testing.T, svg []byte) []string {
	t.Helper()
	var out []string
	d := xml.NewDecoder(bytes.NewReader(svg))
	inText := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			inText = e.Name.Local == "text"
		case xml.EndElement:
			inText = false
		case xml.CharData:
			if inText {
				out = append(out, string(e))
			}
		}
	}
}

func TestPredictedVsMeasured(t *testing.T) {
	cs := []Comparison{
		{Group: "cold", Metric: "total", Measured: 900, Predicted: 1000},
		{Group: "cold", Metric: "downtime", Measured: 800, Predicted: 700},
		{Group: "precopy", Metric: "total", Measured: 2000, Predicted: 2500},
		{Group: "precopy", Metric: "downtime", Measured: 0, Predicted: 90},         // not on a log axis
		{Group: "precopy", Metric: "downtime", Measured: math.NaN(), Predicted: 1}, // nor this
		{Group: "postcopy", Metric: "total", Measured: 50, Predicted: 45},
	}
	p, placed, err := PredictedVsMeasured("predicted <vs> measured", cs)
	if err != nil {
		t.Fatal(err)
	}
	if placed != 4 {
		t.Errorf("placed %d points, want 4", placed)
	}
	// One range for both axes, widened to 1-2-5 steps, so that y = x is
	// the diagonal.
	if p.X.Min != p.Y.Min || p.X.Max != p.Y.Max {
		t.Errorf("axes differ: x [%v, %v], y [%v, %v]", p.X.Min, p.X.Max, p.Y.Min, p.Y.Max)
	}
	if p.X.Min != 20 || p.X.Max != 5000 {
		t.Errorf("range [%v, %v], want [20, 5000]", p.X.Min, p.X.Max)
	}

	svg, err := PredictedVsMeasuredSVG("predicted <vs> measured", cs)
	if err != nil {
		t.Fatal(err)
	}
	got := texts(t, svg)
	// precopy downtime had no placeable point: no legend entry.
	for _, want := range []string{"predicted <vs> measured", "cold total", "cold downtime", "precopy total", "postcopy total",
		"y = x", "measured (ms)", "predicted (ms)", "100", "1000"} {
		if !slices.Contains(got, want) {
			t.Errorf("text %q missing from %q", want, got)
		}
	}
	if slices.Contains(got, "precopy downtime") {
		t.Error("a legend entry for a series with no point")
	}
	if !bytes.Contains(svg, []byte("font-family:"+FontFamily+";")) || bytes.Contains(svg, []byte("font-family:Liberation Sans;")) {
		t.Error("the text's font has no fallbacks")
	}
}

func TestPredictedVsMeasuredNoPoints(t *testing.T) {
	for _, cs := range [][]Comparison{nil, {{Group: "cold", Metric: "total", Measured: 0, Predicted: 5}, {Group: "cold", Metric: "total", Measured: 5, Predicted: -1}}} {
		if _, _, err := PredictedVsMeasured("", cs); !errors.Is(err, ErrNoPoints) {
			t.Errorf("%v: got %v, want ErrNoPoints", cs, err)
		}
		if _, err := PredictedVsMeasuredSVG("", cs); !errors.Is(err, ErrNoPoints) {
			t.Errorf("%v: SVG got %v, want ErrNoPoints", cs, err)
		}
	}
}

// One point: the log range must still be a range.
func TestPredictedVsMeasuredSinglePoint(t *testing.T) {
	for _, v := range []float64{5, 100, 0.3} {
		svg, err := PredictedVsMeasuredSVG("", []Comparison{{Group: "a", Metric: "m", Measured: v, Predicted: v}})
		if err != nil {
			t.Fatal(err)
		}
		texts(t, svg)
		if bytes.Contains(svg, []byte("NaN")) || bytes.Contains(svg, []byte("Inf")) {
			t.Errorf("%v: coordinates contain NaN or Inf", v)
		}
	}
}

func labels(ts []gplot.Tick) []string {
	var out []string
	for _, t := range ts {
		if t.Label != "" {
			out = append(out, t.Label)
		}
	}
	return out
}

func TestLogTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []string
		ticks  int
	}{
		{100, 1000, []string{"100", "200", "500", "1000"}, 10},
		{20, 5000, []string{"100", "1000"}, 22}, // over two decades: decades only
		{1, 10000, []string{"1", "10", "100", "1000", "10000"}, 37},
		{0.5, 2, []string{"0.5", "1", "2"}, 7},
	} {
		ts := logTicks{}.Ticks(c.lo, c.hi)
		if got := labels(ts); !slices.Equal(got, c.want) {
			t.Errorf("[%v, %v]: labels %q, want %q", c.lo, c.hi, got, c.want)
		}
		if len(ts) != c.ticks {
			t.Errorf("[%v, %v]: %d ticks, want %d", c.lo, c.hi, len(ts), c.ticks)
		}
	}
	if ts := (logTicks{}).Ticks(0, 10); ts != nil {
		t.Errorf("a log range from 0 has ticks %v", ts)
	}
}

func TestLinearTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []string
	}{
		{0, 19.5, []string{"0", "5", "10", "15"}},
		{0, 1, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}},
		{-3, 11, []string{"0", "5", "10"}},
		{130, 980, []string{"200", "400", "600", "800"}},
	} {
		ts := linearTicks{}.Ticks(c.lo, c.hi)
		if got := labels(ts); !slices.Equal(got, c.want) {
			t.Errorf("[%v, %v]: labels %q, want %q", c.lo, c.hi, got, c.want)
		}
		for _, tk := range ts {
			if tk.Value < c.lo-1e-9 || tk.Value > c.hi+1e-9 {
				t.Errorf("[%v, %v]: tick %v outside", c.lo, c.hi, tk.Value)
			}
		}
	}
}

func TestSteps(t *testing.T) {
	for raw, want := range map[float64]float64{0.7: 1, 1.3: 2, 3: 5, 7: 10, 130: 200, 0.004: 0.005, 2: 2} {
		if got := niceStep(raw); math.Abs(got-want) > 1e-12 {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
	for _, c := range []struct {
		v    float64
		up   bool
		want float64
	}{{130, false, 100}, {130, true, 200}, {13386, true, 20000}, {240, false, 200}, {600, false, 500}, {600, true, 1000}, {100, true, 100}, {100, false, 100}} {
		if got := logStep(c.v, c.up); math.Abs(got-c.want) > 1e-9*c.want {
			t.Errorf("logStep(%v, %v) = %v, want %v", c.v, c.up, got, c.want)
		}
	}
}

func TestWantLog(t *testing.T) {
	for _, c := range []struct {
		vs   []float64
		want bool
	}{{[]float64{1, 100}, true}, {[]float64{1, 5}, false}, {[]float64{0, 100}, false}, {nil, false}, {[]float64{math.NaN(), 100}, false}} {
		if got := WantLog(c.vs, 10); got != c.want {
			t.Errorf("WantLog(%v) = %v", c.vs, got)
		}
	}
}

// gonum panics on some input; SVG turns that into an error.
func TestSVGRecovers(t *testing.T) {
	_, err := SVG(vg.Inch, vg.Inch, func(draw.Canvas) { panic("degenerate") })
	if err == nil || !strings.Contains(err.Error(), "degenerate") {
		t.Fatalf("got %v", err)
	}
}

func TestInline(t *testing.T) {
	svg, err := PlotSVG(New("t", "x", "y"), 2*vg.Inch, 2*vg.Inch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(svg, []byte("<?xml")) {
		t.Fatalf("a standalone SVG starts with %q", svg[:20])
	}
	if in := Inline(svg); !bytes.HasPrefix(in, []byte("<svg")) || !bytes.HasSuffix(bytes.TrimSpace(in), []byte("</svg>")) {
		t.Errorf("inline SVG: %.40q…", in)
	}
}

func TestFontFaceCSS(t *testing.T) {
	css := FontFaceCSS()
	const prefix = "url(data:font/ttf;base64,"
	i := strings.Index(css, prefix)
	if !strings.Contains(css, `font-family:"Liberation Sans"`) || i < 0 {
		t.Fatalf("no embedded Liberation Sans: %.80q", css)
	}
	data := css[i+len(prefix):]
	data = data[:strings.IndexByte(data, ')')]
	ttf, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(ttf, []byte{0, 1, 0, 0}) {
		t.Errorf("not a TrueType font: % x", ttf[:4])
	}
}

// Every text of a plot in the house style is Liberation Sans.
func TestNewStyle(t *testing.T) {
	p := New("title", "x", "y")
	for name, f := range map[string]font.Variant{
		"title": p.Title.TextStyle.Font.Variant, "x label": p.X.Label.TextStyle.Font.Variant, "y label": p.Y.Label.TextStyle.Font.Variant,
		"x ticks": p.X.Tick.Label.Font.Variant, "y ticks": p.Y.Tick.Label.Font.Variant, "legend": p.Legend.TextStyle.Font.Variant,
	} {
		if f != "Sans" {
			t.Errorf("%s in variant %q", name, f)
		}
	}
	if _, ok := p.X.Tick.Marker.(linearTicks); !ok {
		t.Error("the x axis does not use the house ticks")
	}
	svg, err := PlotSVG(p, 3*vg.Inch, 2*vg.Inch)
	if err != nil {
		t.Fatal(err)
	}
	got := texts(t, svg)
	for _, want := range []string{"title", "x", "y"} {
		if !slices.Contains(got, want) {
			t.Errorf("no text %q in %q", want, got)
		}
	}
	if bytes.Contains(svg, []byte("Liberation Serif")) {
		t.Error("a text in gonum's default serif")
	}
}

func TestColorAndFormat(t *testing.T) {
	if Color(0) != Color(len(Palette)) || Color(1) == Color(0) {
		t.Error("the palette does not wrap")
	}
	for v, want := range map[float64]string{0: "0", 0.5: "0.5", 20: "20", 1000: "1000", 2e6: "2e+06", 0.0002: "0.0002"} {
		if got := FormatNum(v); got != want {
			t.Errorf("FormatNum(%v) = %q, want %q", v, got, want)
		}
	}
	if !Usable(1, true) || Usable(0, true) || !Usable(0, false) || Usable(math.Inf(1), false) || Usable(math.NaN(), false) {
		t.Error("Usable")
	}
}

// LogAxis widens to 1-2-5 steps and never leaves an empty range.
func TestLogAxis(t *testing.T) {
	for _, c := range []struct{ lo, hi, wantLo, wantHi float64 }{
		{130, 980, 100, 1000}, {40, 40, 20, 50}, {3, 7000, 2, 10000}, {100, 100, 50, 200},
	} {
		var a gplot.Axis
		LogAxis(&a, c.lo, c.hi)
		if a.Min != c.wantLo || a.Max != c.wantHi {
			t.Errorf("LogAxis(%v, %v) = [%v, %v], want [%v, %v]", c.lo, c.hi, a.Min, a.Max, c.wantLo, c.wantHi)
		}
		if _, ok := a.Scale.(gplot.LogScale); !ok {
			t.Error("not a log scale")
		}
	}
}

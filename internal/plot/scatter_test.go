package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// elements parses the SVG as XML and counts elements by name and class.
func elements(t *testing.T, svg []byte) (byName map[string]int, byClass map[string]int, texts []string) {
	t.Helper()
	byName, byClass = map[string]int{}, map[string]int{}
	d := xml.NewDecoder(bytes.NewReader(svg))
	inText := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, svg)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			byName[e.Name.Local]++
			for _, a := range e.Attr {
				if a.Name.Local == "class" {
					byClass[a.Value]++
				}
			}
			inText = e.Name.Local == "text"
		case xml.EndElement:
			inText = false
		case xml.CharData:
			if inText {
				texts = append(texts, string(e))
			}
		}
	}
	return byName, byClass, texts
}

func TestScatterLogLog(t *testing.T) {
	s := Scatter{
		Title: "predicted <vs> measured & more", XLabel: "measured (ms)", YLabel: "predicted (ms)",
		LogX: true, LogY: true, Diagonal: true,
		Series: []Series{
			{Name: "cold", Points: []Point{{X: 120, Y: 130, Label: "cold 96M"}, {X: 900, Y: 800}}},
			{Name: "precopy", Marker: Square, Points: []Point{{X: 2000, Y: 2500}, {X: 0, Y: 10}, {X: math.NaN(), Y: 1}}},
			{Name: "postcopy", Marker: Triangle, Color: "#123456", Points: []Point{{X: 50, Y: 45}}},
		},
	}
	svg, err := s.SVG()
	if err != nil {
		t.Fatal(err)
	}
	names, classes, texts := elements(t, svg)
	if names["svg"] != 1 {
		t.Fatalf("want one <svg>, got %d", names["svg"])
	}
	// 4 placeable points: 0 and NaN are dropped on log axes.
	if got := classes["point"]; got != 4 {
		t.Errorf("point markers: got %d, want 4", got)
	}
	if got := classes["key"]; got != 3 {
		t.Errorf("legend markers: got %d, want 3", got)
	}
	if classes["diagonal"] != 1 {
		t.Errorf("want one y = x diagonal, got %d", classes["diagonal"])
	}
	if classes["legend"] != 3 {
		t.Errorf("want 3 legend entries, got %d", classes["legend"])
	}
	joined := strings.Join(texts, "|")
	for _, want := range []string{"cold", "precopy", "postcopy", "y = x", "measured (ms)", "predicted (ms)",
		"predicted <vs> measured & more", "100", "1000"} {
		if !strings.Contains(joined, want) {
			t.Errorf("text %q missing from %q", want, joined)
		}
	}
	if !bytes.Contains(svg, []byte(`fill="#123456"`)) {
		t.Error("the series' own colour is not used")
	}
	if !bytes.Contains(svg, []byte("<title>cold 96M</title>")) {
		t.Error("the point's label is not its tooltip")
	}
}

func TestScatterLinear(t *testing.T) {
	s := Scatter{Series: []Series{{Name: "a", Points: []Point{{X: -3, Y: 2}, {X: 7, Y: 11}, {X: 4, Y: 4}}}}}
	svg, err := s.SVG()
	if err != nil {
		t.Fatal(err)
	}
	_, classes, texts := elements(t, svg)
	if classes["point"] != 3 {
		t.Errorf("point markers: got %d, want 3", classes["point"])
	}
	if classes["diagonal"] != 0 {
		t.Error("a diagonal was drawn though not asked for")
	}
	joined := "|" + strings.Join(texts, "|") + "|"
	for _, want := range []string{"|0|", "|-4|", "|12|"} {
		if !strings.Contains(joined, want) {
			t.Errorf("tick label %q missing from %q", want, joined)
		}
	}
}

// Every marker must land inside the frame, whatever the data.
func TestScatterPointsInsideFrame(t *testing.T) {
	s := Scatter{LogX: true, LogY: true, Diagonal: true, Width: 400, Height: 300,
		Series: []Series{{Points: []Point{{X: 3, Y: 7000}, {X: 45000, Y: 0.2}, {X: 1, Y: 1}}}}}
	svg, err := s.SVG()
	if err != nil {
		t.Fatal(err)
	}
	type circle struct {
		Cx    float64 `xml:"cx,attr"`
		Cy    float64 `xml:"cy,attr"`
		Class string  `xml:"class,attr"`
	}
	d := xml.NewDecoder(bytes.NewReader(svg))
	n := 0
	for {
		tok, err := d.Token()
		if err != nil {
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "circle" {
			var c circle
			if err := d.DecodeElement(&c, &se); err != nil {
				t.Fatal(err)
			}
			if c.Class != "point" {
				continue
			}
			if c.Cx < marginLeft || c.Cx > float64(400-marginRight) || c.Cy < marginTop || c.Cy > float64(300-marginBottom) {
				t.Errorf("marker at (%v, %v) outside the frame", c.Cx, c.Cy)
			}
			n++
		}
	}
	if n != 3 {
		t.Errorf("got %d markers, want 3", n)
	}
}

func TestScatterNoPoints(t *testing.T) {
	s := Scatter{LogX: true, Series: []Series{{Points: []Point{{X: 0, Y: 1}, {X: -1, Y: 2}}}}}
	if _, err := s.SVG(); !errors.Is(err, ErrNoPoints) {
		t.Fatalf("got %v, want ErrNoPoints", err)
	}
	if _, err := (Scatter{}).SVG(); !errors.Is(err, ErrNoPoints) {
		t.Fatalf("empty chart: got %v, want ErrNoPoints", err)
	}
}

func TestSinglePoint(t *testing.T) {
	for _, log := range []bool{false, true} {
		s := Scatter{LogX: log, LogY: log, Diagonal: true, Series: []Series{{Points: []Point{{X: 5, Y: 5}}}}}
		svg, err := s.SVG()
		if err != nil {
			t.Fatal(err)
		}
		elements(t, svg)
		if bytes.Contains(svg, []byte("NaN")) || bytes.Contains(svg, []byte("Inf")) {
			t.Errorf("log=%v: coordinates contain NaN or Inf", log)
		}
	}
}

func TestNiceStep(t *testing.T) {
	for raw, want := range map[float64]float64{0.7: 1, 1.3: 2, 3: 5, 7: 10, 130: 200, 0.004: 0.005} {
		if got := niceStep(raw); math.Abs(got-want) > 1e-12 {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
}

func TestLogStep(t *testing.T) {
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

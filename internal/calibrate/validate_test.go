package calibrate

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/fit/fittest"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/plot"
)

// scaledBench reports, for every point, the profile's own prediction with
// total time ×1.1 and downtime ×0.8, and two live rounds for pre-copy
// and hybrid (plus hybrid's final round, which is not a live one).
func scaledBench(p model.Profile, rounds *[]int) Runner {
	return func(_ context.Context, o bench.MigrateOptions) (bench.MigrateResult, error) {
		in := model.Inputs{MemoryBytes: float64(o.MemoryBytes), DirtyRatePagesPerSec: float64(o.DirtyRate), BandwidthBps: float64(o.BandwidthBps) / 8}
		n := 0
		if o.Mode == model.ModePrecopy || o.Mode == model.ModeHybrid {
			n = 2
		}
		*rounds = append(*rounds, n)
		pr := model.Predict(p, in, o.Mode, max(n, 1))
		res := bench.MigrateResult{Mode: o.Mode, MedianTotalMs: 1.1 * pr.TotalMs, MedianDowntimeMs: 0.8 * pr.DowntimeMs,
			MedianClientDowntimeMs: pr.DowntimeMs}
		for range o.Repeat {
			r := bench.Run{OK: true, BytesSent: int64(pr.Bytes), TotalMs: res.MedianTotalMs, DowntimeMs: res.MedianDowntimeMs}
			for i := range n {
				r.Rounds = append(r.Rounds, engine.Round{Index: i})
			}
			if o.Mode == model.ModeHybrid {
				r.Rounds = append(r.Rounds, engine.Round{Index: n, Final: true})
			}
			res.Runs = append(res.Runs, r)
		}
		// One failed run must not count.
		res.Runs = append(res.Runs, bench.Run{OK: false, Error: "boom"})
		return res, nil
	}
}

func TestValidateMAPE(t *testing.T) {
	p := fittest.Truth()
	var rounds []int
	v, err := Validate(context.Background(), ValidateOptions{Profile: p, Quick: true, Run: scaledBench(p, &rounds)})
	if err != nil {
		t.Fatal(err)
	}
	if v.Repeat != 3 || len(v.Points) != 8 || len(v.Modes) != 4 {
		t.Fatalf("repeat %d, %d points, %d modes", v.Repeat, len(v.Points), len(v.Modes))
	}
	for _, s := range v.Modes {
		if s.Points != 2 {
			t.Errorf("%s: %d points", s.Mode, s.Points)
		}
		fittest.Near(t, s.Mode+" total MAPE", *s.Model.TotalPct, 100*(1-1/1.1), 1e-9)
		fittest.Near(t, s.Mode+" downtime MAPE", *s.Model.DowntimePct, 25, 1e-9)
		fittest.Near(t, s.Mode+" client downtime MAPE", *s.Model.ClientDowntimePct, 0, 1e-9)
		if s.Ideal.TotalPct == nil || s.Ideal.DowntimePct == nil {
			t.Errorf("%s: no ideal MAPE", s.Mode)
		}
	}
	for _, pt := range v.Points {
		want := 0
		if pt.Mode == model.ModePrecopy || pt.Mode == model.ModeHybrid {
			want = 2
		}
		if pt.Rounds != want || pt.OKRuns != 3 || pt.Runs != 4 {
			t.Errorf("%s: rounds %d, ok %d of %d", pt.Point, pt.Rounds, pt.OKRuns, pt.Runs)
		}
	}

	dir := t.TempDir()
	if err := v.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "validation.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Validation
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Points) != 8 {
		t.Errorf("validation.json has %d points", len(back.Points))
	}
	md, _ := os.ReadFile(filepath.Join(dir, "validation.md"))
	for _, want := range []string{"| cold | 2 |", "| hybrid |", "9.1 %", "25.0 %"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("validation.md lacks %q:\n%s", want, md)
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, "predicted-vs-measured.svg"))
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	d := xml.NewDecoder(bytes.NewReader(svg))
	inText := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			inText = e.Name.Local == "text"
		case xml.EndElement:
			inText = false
		case xml.CharData:
			if inText {
				texts = append(texts, string(e))
			}
		}
	}
	// A legend entry per mode and metric: every series has points.
	for _, mode := range validatedModes {
		for _, metric := range []string{"total", "downtime"} {
			if !slices.Contains(texts, mode+" "+metric) {
				t.Errorf("SVG legend lacks %q: %q", mode+" "+metric, texts)
			}
		}
	}
	for _, want := range []string{"y = x", "measured (ms)", "predicted (ms)"} {
		if !slices.Contains(texts, want) {
			t.Errorf("SVG lacks the text %q", want)
		}
	}
}

func TestIdealBaseline(t *testing.T) {
	p := fittest.Truth()
	in := model.Inputs{MemoryBytes: 100e6, DirtyRatePagesPerSec: 1000, BandwidthBps: 100e6}
	c := ideal(p, in, model.ModeCold, 1)
	fittest.Near(t, "cold", c.DowntimeMs, 1000+p.RestoreFixedS*1000, 1e-12)
	pc := ideal(p, in, model.ModePostcopy, 1)
	fittest.Near(t, "postcopy downtime", pc.DowntimeMs, p.RestoreFixedS*1000, 1e-12)
	fittest.Near(t, "postcopy total", pc.TotalMs, 1000+p.RestoreFixedS*1000, 1e-12)
	// One live round: V0 = M for 1 s, dirtying 1000·4096·1 s; Stop&Copy
	// sends that.
	pre := ideal(p, in, model.ModePrecopy, 1)
	q := 1000 * 4096 / 100e6
	fittest.Near(t, "precopy downtime", pre.DowntimeMs, 1000*q+p.RestoreFixedS*1000, 1e-9)
	fittest.Near(t, "precopy total", pre.TotalMs, 1000+1000*q+p.RestoreFixedS*1000, 1e-9)
	fittest.Near(t, "precopy bytes", pre.Bytes, 100e6*(1+q), 1e-9)
}

func TestComparePointWithoutRuns(t *testing.T) {
	pts, sums := Compare(fittest.Truth(), []Measured{{Point: Point{Mode: "cold", MemoryBytes: 1 << 20, BandwidthBps: 1e9}, Error: "lab down"}})
	if len(pts) != 1 || pts[0].OKRuns != 0 || sums[0].Points != 0 || sums[0].Model.TotalPct != nil {
		t.Fatalf("points %+v, summaries %+v", pts, sums)
	}
	v := Validation{Points: pts, Modes: sums}
	if _, err := json.Marshal(v); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.Markdown(), "failed: lab down") {
		t.Error("the failure is not in the table")
	}
	if _, err := v.ScatterSVG(); !errors.Is(err, plot.ErrNoPoints) {
		t.Errorf("a chart without points: got %v, want plot.ErrNoPoints", err)
	}
}

func TestPredictedTermsAddUp(t *testing.T) {
	p := fittest.Truth()
	in := model.Inputs{MemoryBytes: 200e6, DirtyRatePagesPerSec: 500, BandwidthBps: 125e6}
	for _, mode := range validatedModes {
		pr := model.Predict(p, in, mode, 3)
		tt := predictedTerms(p, in, mode, pr)
		sum := tt.Rounds + tt.Freeze + tt.Dump + tt.Restore + tt.Lazy
		if math.Abs(sum-pr.TotalMs) > 1e-6 {
			t.Errorf("%s: terms add to %v, total %v", mode, sum, pr.TotalMs)
		}
	}
}

package fit

import (
	"math"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/fit/fittest"
	"github.com/ferry-migrate/ferry/internal/model"
)

func TestMissingModesKeepDefaults(t *testing.T) {
	def := model.DefaultProfile()
	run := fittest.Bench(fittest.Truth(), 0)
	// Only cold points: nothing for read-hash, lazy setup, lazy pages, link.
	var ms []Measured
	for _, mem := range []int64{64 << 20, 256 << 20} {
		res := run("cold", mem, 0, 0, 1)
		ms = append(ms, Measured{Point: Point{Mode: "cold", MemoryBytes: mem}, Result: &res})
	}
	p, terms, warns := Fit(ms, def)
	fittest.Near(t, "DumpBps from cold alone", p.DumpBps, fittest.Truth().DumpBps, 1e-9)
	for _, term := range terms {
		if term.Name == "dump" && !strings.Contains(term.From, "no pre-copy measured") {
			t.Errorf("dump term: %q", term.From)
		}
	}
	if p.LazyBps != def.LazyBps || p.LinkEfficiency != def.LinkEfficiency || p.ReadHashBps != def.ReadHashBps {
		t.Errorf("unmeasured fields changed: %+v", p)
	}
	if len(warns) < 3 {
		t.Errorf("want warnings for the unmeasured terms, got %v", warns)
	}
	if err := p.Validate(); err != nil {
		t.Error(err)
	}
}

func TestFixedPlusRateConvex(t *testing.T) {
	// Time growing faster than linearly: the free line's intercept is
	// negative, so the fit goes through the origin and names a knee.
	term := Term{X: []float64{64, 64, 128, 128, 256, 256, 512, 512}, Y: []float64{0.15, 0.16, 0.22, 0.21, 0.66, 0.67, 1.5, 1.6}}
	for i := range term.X {
		term.X[i] *= 1 << 20
	}
	f, why, err := fixedPlusRate(&term)
	if err != nil {
		t.Fatal(err)
	}
	if f.A != 0 || !(f.B > 0) || term.Free == nil || term.Free.A >= 0 {
		t.Errorf("fit %+v, free %+v", f, term.Free)
	}
	if !strings.Contains(why, "through the origin") || !strings.Contains(why, "a knee at") {
		t.Errorf("note: %q", why)
	}
	// A line with a positive intercept stays as it is.
	term = Term{X: []float64{1, 2, 3}, Y: []float64{2, 3, 4}}
	f, why, err = fixedPlusRate(&term)
	if err != nil || f.A != 1 || f.B != 1 || why != "" || term.Free != nil {
		t.Errorf("fit %+v, note %q, err %v", f, why, err)
	}
}

func TestDumpLineWithoutPostcopy(t *testing.T) {
	want := fittest.Truth()
	run := fittest.Bench(want, 0)
	var ms []Measured
	for _, mode := range []string{"cold", "precopy"} {
		for _, mem := range []int64{64 << 20, 256 << 20} {
			res := run(mode, mem, 0, 0, 1)
			ms = append(ms, Measured{Point: Point{Mode: mode, MemoryBytes: mem}, Result: &res})
		}
	}
	p, terms, _ := Fit(ms, model.DefaultProfile())
	fittest.Near(t, "DumpFixedS", p.DumpFixedS, want.DumpFixedS, 1e-9)
	fittest.Near(t, "DumpBps", p.DumpBps, want.DumpBps, 1e-9)
	for _, term := range terms {
		if term.Name == "dump" && term.Kind != "line" {
			t.Errorf("dump term: %+v", term)
		}
	}
}

// TestFitFaultWait: a writer that can fault at most 1/w times a second
// counts c·t1 + R·(T − t1)²/(2T) faults over a pull of T seconds; the fit
// finds w back, and finds no bound in runs that faulted freely.
func TestFitFaultWait(t *testing.T) {
	const w = 0.0008
	var runs []pullRun
	for _, r := range []struct{ rate, T float64 }{{2000, 3}, {3000, 4}, {4000, 8}} {
		c := 1 / w
		t1 := math.Max(r.T*(1-c/r.rate), 0)
		runs = append(runs, pullRun{rate: r.rate, y: r.T, faults: c*t1 + r.rate*(r.T-t1)*(r.T-t1)/(2*r.T)})
	}
	got, ok := fitFaultWait(runs)
	if !ok {
		t.Fatal("no bound found")
	}
	fittest.Near(t, "fault_wait_s", got, w, 1e-3)
	if _, ok := fitFaultWait([]pullRun{{rate: 500, y: 2, faults: 500}}); ok {
		t.Error("a run that faulted R·T/2 times shows no bound")
	}
}

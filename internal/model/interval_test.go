package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

// exactProfile is the defaults with intervals of zero width, so Best
// judges budgets by the point predictions.
func exactProfile() Profile {
	p := DefaultProfile()
	for _, m := range append(EngineModes, ModeNativePrecopy) {
		p.Intervals = append(p.Intervals, Interval{Mode: m, Samples: MinIntervalSamples, DowntimeLow: 1, DowntimeHigh: 1, TotalLow: 1, TotalHigh: 1})
	}
	return p
}

func TestPredictCarriesTheInterval(t *testing.T) {
	in := Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	q := Predict(DefaultProfile(), in, ModeCold, 1)
	if q.DowntimeLowMs != q.DowntimeMs*DefaultDowntimeLow || q.DowntimeHighMs != q.DowntimeMs*DefaultDowntimeHigh ||
		q.TotalLowMs != q.TotalMs*DefaultTotalLow || q.TotalHighMs != q.TotalMs*DefaultTotalHigh {
		t.Errorf("default interval not applied: %+v", q)
	}
	p := DefaultProfile()
	p.Intervals = []Interval{{Mode: ModeCold, Samples: MinIntervalSamples, DowntimeLow: 0.9, DowntimeHigh: 1.2, TotalLow: 0.95, TotalHigh: 1.1}}
	q = Predict(p, in, ModeCold, 1)
	if math.Abs(q.DowntimeHighMs-1.2*q.DowntimeMs) > 1e-9 || math.Abs(q.TotalLowMs-0.95*q.TotalMs) > 1e-9 {
		t.Errorf("fitted interval not applied: %+v", q)
	}
	// Too few samples: the default, whatever the ratios say.
	p.Intervals[0].Samples = MinIntervalSamples - 1
	if q = Predict(p, in, ModeCold, 1); q.DowntimeHighMs != q.DowntimeMs*DefaultDowntimeHigh {
		t.Errorf("an interval from %d samples was used", p.Intervals[0].Samples)
	}
	p.Intervals[0] = Interval{Mode: ModeCold, DowntimeLow: 2, DowntimeHigh: 1, TotalLow: 1, TotalHigh: 1}
	if p.Validate() == nil {
		t.Error("an interval whose low is above its high was accepted")
	}
}

// Best judges a budget by the upper bound: a mode whose point prediction
// fits but whose interval reaches past the budget is not feasible.
func TestBestChoosesByTheUpperBound(t *testing.T) {
	in := Inputs{MemoryBytes: 64 << 20, DirtyRatePagesPerSec: 100, BandwidthBps: 125e6}
	p := exactProfile()
	cold := Predict(p, in, ModeCold, 1)
	budget := cold.DowntimeMs * 1.1
	if _, feasible, _, _ := Best(p, in, budget); !contains(feasible, ModeCold) {
		t.Fatalf("cold (%.0f ms) should fit %.0f ms with an exact interval: %v", cold.DowntimeMs, budget, feasible)
	}
	for i := range p.Intervals {
		if p.Intervals[i].Mode == ModeCold {
			p.Intervals[i].DowntimeHigh = 1.3 // its 90th percentile is 30 % over the point
		}
	}
	preds, feasible, rec, _ := Best(p, in, budget)
	if contains(feasible, ModeCold) || rec == ModeCold {
		t.Errorf("cold fits by its point (%.0f ms) but not by its upper bound (%.0f ms): feasible %v, recommended %q",
			cold.DowntimeMs, cold.DowntimeMs*1.3, feasible, rec)
	}
	for _, q := range preds {
		if contains(feasible, q.Mode) && q.DowntimeHighMs > budget {
			t.Errorf("%s feasible with an upper bound of %.0f ms over %.0f ms", q.Mode, q.DowntimeHighMs, budget)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// An interval from the 10th and 90th percentiles of past ratios covers
// about 80 % of runs it did not see.
func TestFitIntervalCoversHeldOutRuns(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	draw := func() float64 { return math.Exp(0.2*r.NormFloat64() + 0.05) } // a biased, skewed error
	var down, total []float64
	for range 60 {
		down, total = append(down, draw()), append(total, draw())
	}
	iv := FitInterval(ModePrecopy, down, total)
	if iv.Samples != 60 {
		t.Fatalf("samples %d", iv.Samples)
	}
	in := 0
	const held = 2000
	for range held {
		if x := draw(); x >= iv.DowntimeLow && x <= iv.DowntimeHigh {
			in++
		}
	}
	if c := float64(in) / held; c < 0.7 || c > 0.9 {
		t.Errorf("the interval [%.3f, %.3f] covers %.0f %% of held-out runs, want about 80 %%", iv.DowntimeLow, iv.DowntimeHigh, c*100)
	}
	if d := FitInterval(ModeCold, down[:5], total[:5]); d.DowntimeHigh != DefaultDowntimeHigh || d.Samples != 5 {
		t.Errorf("5 samples gave %+v, want the default width", d)
	}
}

func TestQuantile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct{ q, want float64 }{{0, 1}, {0.5, 3}, {1, 5}, {0.1, 1.4}, {0.9, 4.6}} {
		if got := Quantile(xs, c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if !math.IsNaN(Quantile(nil, 0.5)) {
		t.Error("no values must give NaN")
	}
}

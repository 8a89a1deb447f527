package model

import (
	"errors"
	"math"
	"testing"
)

func TestFitLinearExact(t *testing.T) {
	// Restore-like data: ψ = 0.1 s, ω = 0.2 s per 256 MiB, M in bytes.
	var x, y []float64
	for m := float64(1 << 20); m <= 1<<32; m *= 2 {
		x = append(x, m)
		y = append(y, 0.1+m*0.2/(256<<20))
	}
	f, err := FitLinear(x, y)
	if err != nil {
		t.Fatal(err)
	}
	approx(t, "a", f.A, 0.1)
	approx(t, "b", f.B, 0.2/(256<<20))
	approx(t, "R²", f.R2, 1)
	if f.RMSE > 1e-12 || f.N != len(x) {
		t.Errorf("rmse %v n %d", f.RMSE, f.N)
	}
}

func TestFitLinearKnownNoise(t *testing.T) {
	// Noise orthogonal to 1 and x: the fit recovers a and b exactly and
	// the residuals are the noise.
	x := []float64{-2, -1, 0, 1, 2}
	noise := []float64{0.1, -0.2, 0.2, -0.2, 0.1}
	y := make([]float64, len(x))
	for i := range x {
		y[i] = 1 + 3*x[i] + noise[i]
	}
	f, err := FitLinear(x, y)
	if err != nil {
		t.Fatal(err)
	}
	approx(t, "a", f.A, 1)
	approx(t, "b", f.B, 3)
	for i := range noise {
		approx(t, "residual", f.Residuals[i], noise[i])
	}
	approx(t, "R²", f.R2, 1-0.14/90.14)
	approx(t, "RMSE", f.RMSE, math.Sqrt(0.14/5))
}

func TestFitLinearErrors(t *testing.T) {
	if _, err := FitLinear([]float64{1, 1, 1}, []float64{1, 2, 3}); !errors.Is(err, ErrDegenerate) {
		t.Errorf("equal x: %v", err)
	}
	if _, err := FitLinear([]float64{1}, []float64{1}); !errors.Is(err, ErrDegenerate) {
		t.Errorf("one point: %v", err)
	}
	if _, err := FitLinear([]float64{1, 2}, []float64{1}); err == nil {
		t.Error("length mismatch accepted")
	}
}

func TestFitPiecewiseKnownKnee(t *testing.T) {
	// μ^d from the paper: 8 + 44·R̂ below 0.5, 30 above.
	mud := DefaultPAM().MuD
	var x, y []float64
	for i := 0; i <= 10; i++ {
		x = append(x, float64(i)/10)
		y = append(y, mud.At(float64(i)/10))
	}
	f, err := FitPiecewise(x, y, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	approx(t, "below a", f.Below.A, 8)
	approx(t, "below b", f.Below.B, 44)
	approx(t, "above a", f.Above.A, 30)
	approx(t, "above b", f.Above.B, 0)
	approx(t, "R²", f.R2, 1)
	approx(t, "at 0.3", f.At(0.3), 8+44*0.3)
}

func TestFitPiecewiseAuto(t *testing.T) {
	// A jump between x = 4 and x = 5, like Eq 15's N^d at 10^5 B.
	var x, y []float64
	for i := 0; i <= 9; i++ {
		x = append(x, float64(i))
		if i <= 4 {
			y = append(y, 2+float64(i))
		} else {
			y = append(y, 20+3*float64(i))
		}
	}
	f, err := FitPiecewiseAuto(x, y)
	if err != nil {
		t.Fatal(err)
	}
	approx(t, "knee", f.Knee, 4.5)
	approx(t, "below b", f.Below.B, 1)
	approx(t, "above a", f.Above.A, 20)
	approx(t, "above b", f.Above.B, 3)
	if _, err := FitPiecewiseAuto([]float64{1, 2, 3}, []float64{1, 2, 3}); err == nil {
		t.Error("three points accepted for a knee search")
	}
}

func TestMAPE(t *testing.T) {
	approx(t, "MAPE", MAPE([]float64{100, 200, 0}, []float64{110, 180, 5}), 10)
	if !math.IsNaN(MAPE(nil, nil)) {
		t.Error("MAPE of nothing should be NaN")
	}
}

func TestFitThroughOrigin(t *testing.T) {
	f, ok := FitThroughOrigin([]float64{1, 2, 4}, []float64{2, 4, 8})
	if !ok || f.B != 2 || f.R2 != 1 {
		t.Errorf("got %+v", f)
	}
	if _, ok := FitThroughOrigin(nil, nil); ok {
		t.Error("fitted no points")
	}
	// Data with a large intercept: the line through the origin is worse
	// than the mean.
	f, _ = FitThroughOrigin([]float64{1, 2}, []float64{10, 10.1})
	if f.R2 >= 0 {
		t.Errorf("R² %v, want negative", f.R2)
	}
}

func TestTwoRatesRecoversABend(t *testing.T) {
	const mib = 1 << 20
	var x, y []float64
	for _, m := range []float64{64 * mib, 128 * mib, 256 * mib, 512 * mib} {
		for range 2 {
			x = append(x, m)
			if m <= 128*mib {
				y = append(y, m/2e9)
			} else {
				y = append(y, 128*mib/2e9+(m-128*mib)/0.3e9)
			}
		}
	}
	knee, below, above, rmse, ok := FitTwoRates(x, y)
	if !ok || knee != 128*mib || math.Abs(1/below-2e9) > 1 || math.Abs(1/above-0.3e9) > 1 || rmse > 1e-9 {
		t.Fatalf("knee %v below %v above %v rmse %v ok %v", knee, 1/below, 1/above, rmse, ok)
	}
}

func TestGoldenSection(t *testing.T) {
	got := GoldenSection(func(x float64) float64 { return (x - 0.3) * (x - 0.3) }, -1, 2, 60)
	if math.Abs(got-0.3) > 1e-9 {
		t.Errorf("minimum at %v, want 0.3", got)
	}
	// A minimum on the edge of the interval is found at the edge.
	if got := GoldenSection(func(x float64) float64 { return x }, 0, 1, 60); got > 1e-9 {
		t.Errorf("minimum of x on [0,1] at %v, want 0", got)
	}
}

func TestFitConstant(t *testing.T) {
	f := FitConstant([]float64{1, 2, 3})
	if f.A != 2 || f.N != 3 || f.R2 != 0 || math.Abs(f.RMSE-math.Sqrt(2.0/3)) > 1e-12 {
		t.Errorf("got %+v", f)
	}
	if f := FitConstant(nil); !math.IsNaN(f.A) {
		t.Errorf("mean of nothing is %v, want NaN", f.A)
	}
}

func TestFitResiduals(t *testing.T) {
	f := FitResiduals([]float64{1, 2, 3}, []float64{1, 2, 3})
	if f.R2 != 1 || f.RMSE != 0 {
		t.Errorf("perfect prediction: %+v", f)
	}
	f = FitResiduals([]float64{1, 2, 3}, []float64{2, 2, 2})
	if f.R2 != 0 || f.Residuals[0] != -1 {
		t.Errorf("the mean as prediction: %+v", f)
	}
}

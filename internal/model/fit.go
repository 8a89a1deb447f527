package model

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// LinearFit is an ordinary least-squares line y = A + B·x.
type LinearFit struct {
	A         float64   `json:"a"`
	B         float64   `json:"b"`
	R2        float64   `json:"r2"`   // coefficient of determination
	RMSE      float64   `json:"rmse"` // root mean square residual
	Residuals []float64 `json:"residuals"`
	N         int       `json:"n"`
}

// At evaluates the line.
func (f LinearFit) At(x float64) float64 { return f.A + f.B*x }

// PiecewiseFit is two independent lines: Below for x < Knee, Above otherwise.
// The pieces need not meet at the knee (Eq 15's N^d jumps there).
type PiecewiseFit struct {
	Knee      float64   `json:"knee"`
	Below     LinearFit `json:"below"`
	Above     LinearFit `json:"above"`
	R2        float64   `json:"r2"`
	RMSE      float64   `json:"rmse"`
	Residuals []float64 `json:"residuals"` // in input order
}

// At evaluates the piece x falls in.
func (f PiecewiseFit) At(x float64) float64 {
	if x < f.Knee {
		return f.Below.At(x)
	}
	return f.Above.At(x)
}

// ErrDegenerate: the points cannot determine a line (fewer than two
// distinct x values).
var ErrDegenerate = errors.New("fit: need at least two distinct x values")

// FitLinear fits y = a + b·x by least squares.
func FitLinear(x, y []float64) (LinearFit, error) {
	if len(x) != len(y) {
		return LinearFit{}, fmt.Errorf("fit: %d x values but %d y values", len(x), len(y))
	}
	n := float64(len(x))
	if len(x) < 2 {
		return LinearFit{}, ErrDegenerate
	}
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx, my = mx/n, my/n
	// Centred sums keep precision when x is large (bytes) and spread small.
	var sxx, sxy float64
	for i := range x {
		dx := x[i] - mx
		sxx += dx * dx
		sxy += dx * (y[i] - my)
	}
	if sxx == 0 || math.IsNaN(sxx) {
		return LinearFit{}, ErrDegenerate
	}
	f := LinearFit{B: sxy / sxx, N: len(x)}
	f.A = my - f.B*mx
	f.Residuals = make([]float64, len(x))
	for i := range x {
		f.Residuals[i] = y[i] - f.At(x[i])
	}
	f.R2, f.RMSE = goodness(y, f.Residuals)
	return f, nil
}

// goodness returns R² and the RMSE of residuals against the data.
func goodness(y, res []float64) (r2, rmse float64) {
	var my float64
	for _, v := range y {
		my += v
	}
	my /= float64(len(y))
	var ssTot, ssRes float64
	for i, v := range y {
		ssTot += (v - my) * (v - my)
		ssRes += res[i] * res[i]
	}
	rmse = math.Sqrt(ssRes / float64(len(y)))
	switch {
	case ssRes == 0:
		r2 = 1
	case ssTot == 0:
		r2 = 0 // flat data, imperfect fit
	default:
		r2 = 1 - ssRes/ssTot
	}
	return r2, rmse
}

// FitPiecewise fits one line to the points with x < knee and another to
// the rest. Each side needs two distinct x values.
func FitPiecewise(x, y []float64, knee float64) (PiecewiseFit, error) {
	if len(x) != len(y) {
		return PiecewiseFit{}, fmt.Errorf("fit: %d x values but %d y values", len(x), len(y))
	}
	var bx, by, ax, ay []float64
	for i := range x {
		if x[i] < knee {
			bx, by = append(bx, x[i]), append(by, y[i])
		} else {
			ax, ay = append(ax, x[i]), append(ay, y[i])
		}
	}
	below, err := FitLinear(bx, by)
	if err != nil {
		return PiecewiseFit{}, fmt.Errorf("below the knee %v: %w", knee, err)
	}
	above, err := FitLinear(ax, ay)
	if err != nil {
		return PiecewiseFit{}, fmt.Errorf("above the knee %v: %w", knee, err)
	}
	f := PiecewiseFit{Knee: knee, Below: below, Above: above, Residuals: make([]float64, len(x))}
	for i := range x {
		f.Residuals[i] = y[i] - f.At(x[i])
	}
	f.R2, f.RMSE = goodness(y, f.Residuals)
	return f, nil
}

// FitPiecewiseAuto searches the knee: every midpoint between consecutive
// distinct x values that leaves two distinct x values on each side; the
// knee with the smallest squared error wins (the lowest, on a tie).
func FitPiecewiseAuto(x, y []float64) (PiecewiseFit, error) {
	if len(x) != len(y) {
		return PiecewiseFit{}, fmt.Errorf("fit: %d x values but %d y values", len(x), len(y))
	}
	xs := append([]float64(nil), x...)
	sort.Float64s(xs)
	var distinct []float64
	for i, v := range xs {
		if i == 0 || v != xs[i-1] {
			distinct = append(distinct, v)
		}
	}
	var best PiecewiseFit
	found := false
	for i := 2; i+2 <= len(distinct); i++ {
		knee := (distinct[i-1] + distinct[i]) / 2
		f, err := FitPiecewise(x, y, knee)
		if err != nil {
			continue
		}
		if !found || f.RMSE < best.RMSE {
			best, found = f, true
		}
	}
	if !found {
		return PiecewiseFit{}, errors.New("fit: need at least four distinct x values for a knee")
	}
	return best, nil
}

// MAPE is the mean absolute percentage error of predictions against
// measurements, skipping measurements of zero.
func MAPE(measured, predicted []float64) float64 {
	var sum float64
	n := 0
	for i := range min(len(measured), len(predicted)) {
		if measured[i] == 0 {
			continue
		}
		sum += math.Abs((predicted[i] - measured[i]) / measured[i])
		n++
	}
	if n == 0 {
		return math.NaN()
	}
	return 100 * sum / float64(n)
}

// GoldenSection is a golden-section search for the minimum of f on [lo, hi],
// in steps iterations (each shrinks the interval by 0.618).
func GoldenSection(f func(float64) float64, lo, hi float64, steps int) float64 {
	const g = 0.6180339887498949
	a, b := lo, hi
	x1, x2 := b-g*(b-a), a+g*(b-a)
	f1, f2 := f(x1), f(x2)
	for range steps {
		if f1 <= f2 {
			b, x2, f2 = x2, x1, f1
			x1 = b - g*(b-a)
			f1 = f(x1)
		} else {
			a, x1, f1 = x1, x2, f2
			x2 = a + g*(b-a)
			f2 = f(x2)
		}
	}
	return (a + b) / 2
}

// FitTwoRates fits y = x·below up to a knee and knee·below + (x−knee)·above
// past it (continuous, through the origin), trying each measured x but the
// largest as the knee; it returns the best fit by RMSE.
func FitTwoRates(x, y []float64) (knee, below, above, rmse float64, ok bool) {
	xs := append([]float64(nil), x...)
	sort.Float64s(xs)
	best := math.Inf(1)
	for _, k := range xs[:max(len(xs)-1, 0)] {
		var bx, by, ax, ay []float64
		for i := range x {
			if x[i] <= k {
				bx, by = append(bx, x[i]), append(by, y[i])
			}
		}
		fb, okb := FitThroughOrigin(bx, by)
		if !okb || !(fb.B > 0) {
			continue
		}
		for i := range x {
			if x[i] > k {
				ax, ay = append(ax, x[i]-k), append(ay, y[i]-k*fb.B)
			}
		}
		fa, oka := FitThroughOrigin(ax, ay)
		if !oka || !(fa.B > 0) || len(ax) < 2 || len(bx) < 2 {
			continue
		}
		var ss float64
		for i := range x {
			pred := x[i] * fb.B
			if x[i] > k {
				pred = k*fb.B + (x[i]-k)*fa.B
			}
			ss += (y[i] - pred) * (y[i] - pred)
		}
		if r := math.Sqrt(ss / float64(len(x))); r < best {
			best, knee, below, above, ok = r, k, fb.B, fa.B, true
		}
	}
	return knee, below, above, best, ok
}

// FitThroughOrigin fits y = b·x by least squares, for model terms that
// have no fixed part (the profile has nowhere to put an intercept). R² is
// measured against the mean of y, as for FitLinear, so it can be negative
// when the line through the origin is worse than the mean.
func FitThroughOrigin(x, y []float64) (LinearFit, bool) {
	var sxy, sxx float64
	for i := range x {
		sxy += x[i] * y[i]
		sxx += x[i] * x[i]
	}
	if len(x) == 0 || sxx == 0 {
		return LinearFit{}, false
	}
	b := sxy / sxx
	pred := make([]float64, len(x))
	for i := range x {
		pred[i] = b * x[i]
	}
	f := FitResiduals(y, pred)
	f.B = b
	return f, true
}

// FitResiduals describes how well pred matches y: residuals, RMSE and R².
func FitResiduals(y, pred []float64) LinearFit {
	f := LinearFit{N: len(y), Residuals: make([]float64, len(y))}
	var my, ssTot, ssRes float64
	for _, v := range y {
		my += v
	}
	my /= float64(max(len(y), 1))
	for i := range y {
		f.Residuals[i] = y[i] - pred[i]
		ssRes += f.Residuals[i] * f.Residuals[i]
		ssTot += (y[i] - my) * (y[i] - my)
	}
	if len(y) > 0 {
		f.RMSE = math.Sqrt(ssRes / float64(len(y)))
	}
	switch {
	case ssRes == 0:
		f.R2 = 1
	case ssTot == 0:
		f.R2 = 0
	default:
		f.R2 = 1 - ssRes/ssTot
	}
	return f
}

// FitConstant describes y by its mean, for constant model terms: the
// residuals are the deviations and R² is 0 by definition.
func FitConstant(y []float64) LinearFit {
	f := LinearFit{A: math.NaN(), N: len(y), Residuals: make([]float64, len(y))}
	if len(y) > 0 {
		var sum float64
		for _, v := range y {
			sum += v
		}
		f.A = sum / float64(len(y))
	}
	var ss float64
	for i, v := range y {
		f.Residuals[i] = v - f.A
		ss += f.Residuals[i] * f.Residuals[i]
	}
	if len(y) > 0 {
		f.RMSE = math.Sqrt(ss / float64(len(y)))
	}
	return f
}

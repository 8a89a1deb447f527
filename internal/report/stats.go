package report

import (
	"math"
	"slices"
)

// The report's intervals for a median are distribution-free: with n values
// sorted, x(1) ≤ … ≤ x(n), the number of values below the true median is
// Binomial(n, 1/2) whatever the distribution, so [x(k), x(n+1-k)] covers
// the median with probability 1 − 2·P(B ≤ k−1). MedianCI takes the
// narrowest such interval (the largest k) whose coverage is still at least
// 95 %. Below MinRunsForCI values even [min, max] falls short; the report
// then draws and prints the min–max range, marked as such.

// CILevel is the confidence the report's intervals reach at least.
const CILevel = 0.95

// MinRunsForCI is the fewest values with a 95 % interval: [min, max]
// covers the median with probability 1 − 2·0.5^n, 0.96875 at n = 6 but
// 0.9375 at n = 5.
const MinRunsForCI = 6

// Interval is a median and a range around it.
type Interval struct {
	N      int
	Median float64
	// Lo and Hi are x(k) and x(n+1−k): a confidence interval for the
	// median when Coverage > 0, else the minimum and the maximum.
	Lo, Hi float64
	// Coverage is the interval's exact confidence (≥ CILevel), or 0 when
	// there were fewer than MinRunsForCI values.
	Coverage float64
	// K is the order statistic the interval starts at (1 = the minimum).
	K int
}

// IsCI says whether Lo and Hi are a confidence interval rather than the
// min–max range.
func (iv Interval) IsCI() bool { return iv.Coverage > 0 }

// MedianCI is the median of xs (NaN left out) and its distribution-free
// 95 % confidence interval, or the min–max range with fewer than
// MinRunsForCI values. With none, every field but N is NaN.
func MedianCI(xs []float64) Interval {
	s := sortedFinite(xs)
	n := len(s)
	if n == 0 {
		return Interval{Median: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	iv := Interval{N: n, Median: median(s), Lo: s[0], Hi: s[n-1], K: 1}
	k := 0 // the largest k whose interval still reaches CILevel
	for c := 1; 2*c <= n+1; c++ {
		if 1-2*binomCDF(c-1, n) < CILevel {
			break
		}
		k = c
	}
	if k == 0 {
		return iv
	}
	iv.K = k
	iv.Lo, iv.Hi = s[k-1], s[n-k]
	iv.Coverage = 1 - 2*binomCDF(k-1, n)
	return iv
}

func sortedFinite(xs []float64) []float64 {
	s := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			s = append(s, x)
		}
	}
	slices.Sort(s)
	return s
}

func median(s []float64) float64 {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// binomCDF is P(B ≤ k) for B ~ Binomial(n, 1/2), summed in logs so that
// 2^n never overflows.
func binomCDF(k, n int) float64 {
	if k < 0 {
		return 0
	}
	lgN, _ := math.Lgamma(float64(n + 1))
	var p float64
	for i := 0; i <= k && i <= n; i++ {
		lgI, _ := math.Lgamma(float64(i + 1))
		lgR, _ := math.Lgamma(float64(n - i + 1))
		p += math.Exp(lgN - lgI - lgR - float64(n)*math.Ln2)
	}
	return math.Min(p, 1)
}

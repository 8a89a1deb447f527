package report

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// MedianCI's median: the middle value, the mean of the two middle ones for
// an even count, NaN for none, NaN values left out, the input unsorted.
func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{7}, 7},
		{[]float64{5, math.NaN(), 1}, 3}, // NaN left out
		{[]float64{-2, 10, 0, 4, 100}, 4},
	} {
		in := slices.Clone(c.xs)
		if got := MedianCI(c.xs).Median; got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.xs, got, c.want)
		}
		if !slices.EqualFunc(in, c.xs, func(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }) {
			t.Errorf("Median sorted its input: %v", c.xs)
		}
	}
	if got := MedianCI(nil).Median; !math.IsNaN(got) {
		t.Errorf("Median of nothing = %v, want NaN", got)
	}
}

// The intervals against hand computation: P(B ≤ k) for B ~ Binomial(n, ½)
// is the sum of C(n, i) for i ≤ k over 2^n.
func TestMedianCI(t *testing.T) {
	seq := func(n int, scale float64) []float64 {
		var xs []float64
		for i := n; i >= 1; i-- { // descending: MedianCI must sort
			xs = append(xs, float64(i)*scale)
		}
		return xs
	}
	for _, c := range []struct {
		name     string
		xs       []float64
		median   float64
		lo, hi   float64
		k        int
		coverage float64 // 0: the min–max range
	}{
		// n = 5: even [x(1), x(5)] covers with 1 − 2/32 = 0.9375 < 0.95.
		{"n=5", seq(5, 10), 30, 10, 50, 1, 0},
		// n = 6: [x(1), x(6)], 1 − 2/64.
		{"n=6", []float64{5, 1, 4, 2, 6, 3}, 3.5, 1, 6, 1, 1 - 2.0/64},
		// n = 8: P(B ≤ 1) = 9/256 = 0.035 > 0.025, so k = 1: 1 − 2/256.
		{"n=8", seq(8, 1), 4.5, 1, 8, 1, 1 - 2.0/256},
		// n = 9: P(B ≤ 1) = 10/512 = 0.0195, P(B ≤ 2) = 46/512 = 0.0898:
		// k = 2, [x(2), x(8)], 1 − 20/512.
		{"n=9", seq(9, 10), 50, 20, 80, 2, 1 - 20.0/512},
		// n = 10: P(B ≤ 1) = 11/1024, P(B ≤ 2) = 56/1024: k = 2,
		// [x(2), x(9)], 1 − 22/1024.
		{"n=10", seq(10, 1), 5.5, 2, 9, 2, 1 - 22.0/1024},
		// n = 20: P(B ≤ 5) = 21700/2^20 = 0.0207, P(B ≤ 6) = 60460/2^20
		// = 0.0577: k = 6, [x(6), x(15)].
		{"n=20", seq(20, 1), 10.5, 6, 15, 6, 1 - 2*21700.0/(1<<20)},
		{"n=1", []float64{42}, 42, 42, 42, 1, 0},
		{"n=2", []float64{3, 1}, 2, 1, 3, 1, 0},
	} {
		iv := MedianCI(c.xs)
		if iv.N != len(c.xs) || iv.Median != c.median || iv.Lo != c.lo || iv.Hi != c.hi || iv.K != c.k {
			t.Errorf("%s: got n %d, median %v, [%v, %v] from k %d; want median %v, [%v, %v] from k %d",
				c.name, iv.N, iv.Median, iv.Lo, iv.Hi, iv.K, c.median, c.lo, c.hi, c.k)
		}
		if math.Abs(iv.Coverage-c.coverage) > 1e-12 {
			t.Errorf("%s: coverage %v, want %v", c.name, iv.Coverage, c.coverage)
		}
		if iv.IsCI() != (c.coverage > 0) {
			t.Errorf("%s: IsCI %v", c.name, iv.IsCI())
		}
	}
	none := MedianCI(nil)
	if none.N != 0 || !math.IsNaN(none.Median) || !math.IsNaN(none.Lo) || !math.IsNaN(none.Hi) || none.IsCI() {
		t.Errorf("no values: %+v", none)
	}
	nan := MedianCI([]float64{math.NaN(), 1, 2, 3})
	if nan.N != 3 || nan.Median != 2 {
		t.Errorf("NaN must be left out: %+v", nan)
	}
}

// MinRunsForCI is the first n with a 95 % interval, and every larger n
// has one that reaches it.
func TestMinRunsForCI(t *testing.T) {
	for n := 1; n <= 200; n++ {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(i)
		}
		iv := MedianCI(xs)
		if iv.IsCI() != (n >= MinRunsForCI) {
			t.Fatalf("n=%d: IsCI %v, MinRunsForCI %d", n, iv.IsCI(), MinRunsForCI)
		}
		if iv.IsCI() && (iv.Coverage < CILevel || iv.Lo > iv.Median || iv.Hi < iv.Median) {
			t.Fatalf("n=%d: %+v", n, iv)
		}
		// The next k in would fall short: the interval is the narrowest.
		if iv.IsCI() && 2*(iv.K+1) <= n+1 && 1-2*binomCDF(iv.K, n) >= CILevel {
			t.Fatalf("n=%d: k=%d is not the largest", n, iv.K)
		}
	}
}

func TestBinomCDF(t *testing.T) {
	for _, c := range []struct {
		k, n int
		want float64
	}{
		{0, 1, 0.5}, {1, 1, 1}, {2, 10, 56.0 / 1024}, {5, 10, 638.0 / 1024}, {10, 10, 1}, {-1, 10, 0},
		{1500, 3000, 0.5 + 0.5*0.014565}, // P(B = n/2) ≈ sqrt(2/(πn)) ≈ 0.01457
	} {
		if got := binomCDF(c.k, c.n); math.Abs(got-c.want) > 1e-5 {
			t.Errorf("binomCDF(%d, %d) = %v, want %v", c.k, c.n, got, c.want)
		}
	}
}

// Simulated: the intervals cover the true median as often as their
// coverage says, whatever the distribution (here exponential, skewed,
// median ln 2), and the min–max of five values falls short of 95 %.
func TestMedianCICoverageSimulated(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	truth := math.Ln2
	for _, n := range []int{5, 6, 10, 25, 60} {
		const trials = 4000
		covered := 0
		var coverage float64
		for range trials {
			xs := make([]float64, n)
			for i := range xs {
				xs[i] = rng.ExpFloat64()
			}
			iv := MedianCI(xs)
			coverage = iv.Coverage
			if iv.Lo <= truth && truth <= iv.Hi {
				covered++
			}
		}
		got := float64(covered) / trials
		want := coverage
		if n < MinRunsForCI {
			want = 1 - 2*math.Pow(0.5, float64(n)) // what min–max covers
			if want >= CILevel {
				t.Fatalf("n=%d: min–max would reach %v", n, want)
			}
		}
		// Four standard errors of a proportion near 0.95 over 4000 trials.
		if math.Abs(got-want) > 4*math.Sqrt(want*(1-want)/trials) {
			t.Errorf("n=%d: covered %.4f of trials, want %.4f", n, got, want)
		}
	}
}

// P(B ≤ k) + P(B ≤ n−k−1) = 1 for B ~ Binomial(n, ½), by symmetry.
func TestBinomCDFSymmetric(t *testing.T) {
	for _, n := range []int{1, 7, 30, 301} {
		for k := 0; k < n; k++ {
			if s := binomCDF(k, n) + binomCDF(n-k-1, n); math.Abs(s-1) > 1e-9 {
				t.Fatalf("n=%d k=%d: %v", n, k, s)
			}
		}
	}
}

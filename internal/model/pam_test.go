package model

import (
	"math"
	"testing"
)

// approx fails unless got is within a relative 1e-9 of want (or 1e-12 absolute).
func approx(t *testing.T, name string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-12+1e-9*math.Abs(want) {
		t.Errorf("%s = %.12g, want %.12g", name, got, want)
	}
}

// handPAM has round numbers so the expected values can be worked out by
// hand (below, in the comments of TestPAMHandComputed).
func handPAM() PAMParams {
	p := DefaultPAM()
	p.Alpha1, p.Alpha2, p.Alpha3, p.Alpha4 = 2, 1, 1, 1.5
	p.Beta, p.PhiP, p.PhiD = 0.01, 0.1, 0.2
	p.Gamma, p.Zeta = 1e-10, 2
	p.Delta, p.Lambda = 0.05, 1e-9
	p.Psi, p.Omega = 0.3, 1e-9
	p.RMin, p.RMax = 0, 10000
	p.DirtyPages = DirtyDynamic
	return p
}

func TestPAMHandComputed(t *testing.T) {
	p := handPAM()
	// M = 1e9 B, R = 1000 pages/s (R̂ = 0.1), L = 1e8 B/s, I = 1.
	r := PAM(p, PAMInputs{M: 1e9, R: 1000, L: []float64{1e8}, I: 1})
	if len(r.Iters) != 3 {
		t.Fatalf("got %d iterations, want 3 (pre-dump, one dump, Stop&Copy)", len(r.Iters))
	}
	// Eq 11: T^{p,frozen} = 0.1 + 1e-10·2·1e9 = 0.3; Eq 13: T^{p,mem} = 0.05 + 1 = 1.05.
	// Eq 9: 2·1·(0.01 + 0.3 + 1.05) = 2.72; V_0 = 1e9, T^net = 10; Eq 17: T_0 = 12.72.
	approx(t, "T0", r.Iters[0].T, 12.72)
	approx(t, "V0", r.Iters[0].Volume, 1e9)
	// Eq 12: ξ = 2.5, T^{d,frozen} = 0.2 + 1e-10·2.5·1e9 = 0.45; Eq 10: 2·(0.01+0.45) = 0.92.
	// Eq 4: N_1 = 1000·(12.72 − 0.3) = 12420 pages, V_1 = 50 872 320 B.
	approx(t, "N1", r.Iters[1].Pages, 12420)
	approx(t, "V1", r.Iters[1].Volume, 50872320)
	approx(t, "T1", r.Iters[1].T, 0.92+0.5087232) // Eq 18
	// Stop&Copy: N_2 = 1000·(1.4287232 − 0.45) pages; Eq 16: 1·1.5·(0.3 + 1) = 1.95.
	approx(t, "N2", r.Iters[2].Pages, 978.7232)
	approx(t, "restore", r.Restore, 1.95)
	approx(t, "Tdown", r.Downtime, 0.92+978.7232*4096/1e8+1.95) // Eq 19
	approx(t, "Tmig", r.Total, 12.72+1.4287232+r.Downtime)      // Eq 1
	approx(t, "frozen", r.Frozen, (0.01+0.3)+(0.01+0.45))
	approx(t, "bytes", r.Bytes, 1e9+50872320+978.7232*4096)
}

// With the fitted N^d, every dump sends the same volume, and Eq 20 as
// printed (a single T^net, (I+1) dumps) must equal Eq 1.
func TestPAMEq20EqualsEq1(t *testing.T) {
	p := handPAM()
	p.DirtyPages = DirtyFitted
	for _, I := range []int{0, 1, 3, 7} {
		in := PAMInputs{M: 5e8, R: 4000, L: []float64{2e8}, I: I}
		r := PAM(p, in)
		rh := p.RHat(in.R)
		tnet0 := p.Rho * p.Tau1 * in.M / 2e8
		tnet := p.Rho * p.Tau2At(in.M, rh) * p.PagesD(in.M, rh) * p.Sigma / 2e8
		eq20 := p.CkpPre(in.M) + tnet0 + float64(I+1)*(p.CkpDump(in.M, rh)+tnet) + p.Restore(in.M)
		approx(t, "Eq 20", r.Total, eq20)
	}
}

func TestPAMPaperRDependences(t *testing.T) {
	p := DefaultPAM()
	for _, c := range []struct {
		rh, xi, eta, nud, mud float64
	}{
		{0, 0, 0.01, 0, 8},
		{0.25, 6.25, 0.2575, 6.25e-5, 19},
		{0.5, 12.5, 0.505, 1.25e-4, 30}, // μ^d is continuous at the knee
		{1, 25, 1, 2.5e-4, 30},
	} {
		approx(t, "ξ", p.Xi.At(c.rh), c.xi)
		approx(t, "η", p.Eta.At(c.rh), c.eta)
		approx(t, "ν^d", p.NuD.At(c.rh), c.nud)
		approx(t, "μ^d", p.MuD.At(c.rh), c.mud)
	}
	approx(t, "μ^d just below the knee", p.MuD.At(0.4999999), 8+44*0.4999999)
}

func TestPAMPagesAndSplit(t *testing.T) {
	p := DefaultPAM()
	// Eq 15: at and below 10^5 B only μ^d counts (≤, see small()).
	approx(t, "N^d small", p.PagesD(1e5, 1), 30)
	approx(t, "N^d large", p.PagesD(2e5, 1), 30+2.5e-4*2e5)
	approx(t, "N^p", p.PagesP(4096*10), 10)
	// R̂ is clamped to the fitted range.
	approx(t, "R̂ below", p.RHat(-5), 0)
	approx(t, "R̂ above", p.RHat(1e12), 1)
	approx(t, "R̂ mid", p.RHat(p.RMax/4), 0.25)
	// Neutral τ2 is 1 on both sides of the split.
	approx(t, "τ2 small", p.Tau2At(1e3, 0.3), 1)
	approx(t, "τ2 large", p.Tau2At(1e9, 0.3), 1)
}

func TestPAMDirtySources(t *testing.T) {
	in := PAMInputs{M: 1e9, R: 1000, L: []float64{1e8}, I: 0}
	p := handPAM()
	dyn := PAM(p, in).Iters[1].Pages
	p.DirtyPages = DirtyFitted
	fit := PAM(p, in).Iters[1].Pages
	p.DirtyPages = DirtyMax
	both := PAM(p, in).Iters[1].Pages
	approx(t, "fitted N^d", fit, 8+44*0.1+2.5e-5*1e9)
	approx(t, "max", both, math.Max(dyn, fit))
	// The dynamic count never exceeds memory's pages.
	p.DirtyPages = DirtyDynamic
	huge := PAM(p, PAMInputs{M: 1e6, R: 1e9, L: []float64{1e3}, I: 0}).Iters[1].Pages
	approx(t, "capped", huge, 1e6/4096)
}

func TestPAMPerIterationLink(t *testing.T) {
	p := handPAM()
	r := PAM(p, PAMInputs{M: 1e9, R: 0, L: []float64{1e8, 5e7, 2.5e7}, I: 3})
	approx(t, "T^net_0", r.Iters[0].Net, 10)
	// R = 0 with the dynamic source: nothing dirty, nothing to send.
	for i := 1; i < len(r.Iters); i++ {
		approx(t, "V_i", r.Iters[i].Volume, 0)
	}
	p.DirtyPages = DirtyFitted
	r = PAM(p, PAMInputs{M: 1e9, R: 0, L: []float64{1e8, 5e7, 2.5e7}, I: 3})
	v := r.Iters[1].Volume
	approx(t, "T^net_1", r.Iters[1].Net, v/5e7)
	approx(t, "T^net_2", r.Iters[2].Net, v/2.5e7)
	approx(t, "T^net_4 repeats the last L", r.Iters[4].Net, v/2.5e7)
}

func TestPAMDumpMemOption(t *testing.T) {
	p := handPAM()
	in := PAMInputs{M: 1e9, R: 1000, L: []float64{1e8}, I: 0}
	without := PAM(p, in)
	p.DumpMemInFrozen = true
	with := PAM(p, in)
	// T^{d,mem} = 0.05 + 1e-9·η(0.1)·1e9 = 0.05 + 0.109 = 0.159, times α1α2 = 2.
	approx(t, "dump with T^{d,mem}", with.Iters[1].Ckp-without.Iters[1].Ckp, 2*0.159)
}

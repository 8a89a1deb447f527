package model

import (
	"math"
)

// Lin is a straight line in the normalised dirty rate: A + B·R̂.
type Lin struct {
	A float64 `json:"a"`
	B float64 `json:"b"`
}

// At evaluates the line.
func (l Lin) At(x float64) float64 { return l.A + l.B*x }

// Piecewise is two lines joined at Knee: Below for x < Knee, Above otherwise.
type Piecewise struct {
	Knee  float64 `json:"knee"`
	Below Lin     `json:"below"`
	Above Lin     `json:"above"`
}

// At evaluates the piece x falls in.
func (p Piecewise) At(x float64) float64 {
	if x < p.Knee {
		return p.Below.At(x)
	}
	return p.Above.At(x)
}

// Tau2Fit is τ2, the encapsulation overhead on dirty-page volumes. The paper
// fits it as logarithmic in R̂ for small states and hyperbolic for large
// ones but prints no coefficients, so the forms are ours and the neutral
// default (A=1, B=0) means "no overhead" until a calibration says otherwise.
type Tau2Fit struct {
	LogA float64 `json:"log_a"` // small M: LogA + LogB·ln(R̂ + LogC)
	LogB float64 `json:"log_b"`
	LogC float64 `json:"log_c"`
	HypA float64 `json:"hyp_a"` // large M: HypA + HypB/(R̂ + HypC)
	HypB float64 `json:"hyp_b"`
	HypC float64 `json:"hyp_c"`
}

// PAMParams are the PAM model's constants for one testbed. Only the
// R-dependences (ξ, η, ν^d, μ^d) have published values; everything else
// must be calibrated (DefaultPAM gives rough values for this machine).
type PAMParams struct {
	Alpha1 float64 `json:"alpha1"` // α1: engine (Podman) / runtime checkpoint time
	Alpha2 float64 `json:"alpha2"` // α2: runtime (runc) / CRIU checkpoint time
	Alpha3 float64 `json:"alpha3"` // α3: engine / runtime restore time
	Alpha4 float64 `json:"alpha4"` // α4: runtime / CRIU restore time

	Beta   float64 `json:"beta_s"`            // β: CRIU freezing time
	PhiP   float64 `json:"phi_p_s"`           // φ^p: pre-dump frozen time at M = 0
	PhiD   float64 `json:"phi_d_s"`           // φ^d: dump frozen time at M = 0
	Gamma  float64 `json:"gamma_s_per_byte"`  // Γ: frozen time per byte, scaled by ζ or ξ(R)
	Zeta   float64 `json:"zeta"`              // ζ: pre-dump scale of Γ
	Delta  float64 `json:"delta_s"`           // δ: memory time at M = 0
	Lambda float64 `json:"lambda_s_per_byte"` // Λ: memory time per byte
	Psi    float64 `json:"psi_s"`             // ψ: restore (relocation) time at M = 0
	Omega  float64 `json:"omega_s_per_byte"`  // ω: restore time per byte

	Rho  float64 `json:"rho"`  // ρ: compressed / uncompressed volume
	Tau1 float64 `json:"tau1"` // τ1: encapsulation overhead of the first (full) image
	Tau2 Tau2Fit `json:"tau2"` // τ2(M, R̂): overhead of dirty-page images

	MuP  float64   `json:"mu_p"`  // μ^p: pages a pre-dump writes at M = 0 (Eq 14)
	NuP  float64   `json:"nu_p"`  // ν^p: pre-dump pages per byte of state (Eq 14)
	Xi   Lin       `json:"xi"`    // ξ(R̂): dump frozen-time scale (paper: 25·R̂)
	Eta  Lin       `json:"eta"`   // η(R̂): dump memory-time scale (paper: 0.01 + 0.99·R̂)
	NuD  Lin       `json:"nu_d"`  // ν^d(R̂): dump pages per byte (paper: 2.5e-4·R̂)
	MuD  Piecewise `json:"mu_d"`  // μ^d(R̂): minimum dump pages (paper: 8+44·R̂ below 0.5, 30 above)
	RMin float64   `json:"r_min"` // R_min, pages/s: R̂ = 0
	RMax float64   `json:"r_max"` // R_max, pages/s: R̂ = 1

	Sigma      float64 `json:"sigma"`             // σ: page size, bytes
	SmallState float64 `json:"small_state_bytes"` // the 10^5 B split of Eq 15 and τ2

	// DirtyPages picks where N_i comes from (see PAM); "" means DirtyMax.
	DirtyPages string `json:"dirty_pages,omitempty"`
	// DumpMemInFrozen adds T^{d,mem} (Eq 13) to each dump's frozen time.
	// Eq 2 says a dump's memory time is already inside its frozen time, so
	// the default leaves it out; a calibration that measures frozen time
	// without the memory part turns this on.
	DumpMemInFrozen bool `json:"dump_mem_in_frozen,omitempty"`
}

// Sources of N_i, the dirty pages a dump iteration writes.
const (
	DirtyDynamic = "dynamic" // Eq 4: rate × the time the service ran in the previous iteration
	DirtyFitted  = "fitted"  // Eq 15: the fitted N^d(M, R)
	DirtyMax     = "max"     // the larger: Eq 15 is CRIU's floor, Eq 4 what the workload adds
)

// DefaultPAM returns the paper's published R-dependences with the other
// constants set from this machine's rough rates (runc driving CRIU, so
// α = 1). They are placeholders for native pre-copy, which this machine's
// kernel (no soft-dirty) cannot run; calibrate on a host that can.
func DefaultPAM() PAMParams {
	const dumpBps, restoreBps = 0.4e9, (256 << 20) / 0.2
	return PAMParams{
		Alpha1: 1, Alpha2: 1, Alpha3: 1, Alpha4: 1,
		Beta: 0.005, PhiP: 0.05, PhiD: 0.1,
		// Γ·ξ(R̂=1) = 1/dumpBps: at the highest rate a dump writes all of M.
		Gamma: 1 / (25 * dumpBps), Zeta: 1,
		Delta: 0.01, Lambda: 1 / dumpBps,
		Psi: 0.1, Omega: 1 / restoreBps,
		Rho: 1, Tau1: 1,
		Tau2: Tau2Fit{LogA: 1, LogC: 1, HypA: 1, HypC: 1},
		MuP:  0, NuP: 1.0 / 4096,
		Xi:   Lin{0, 25},
		Eta:  Lin{0.01, 0.99},
		NuD:  Lin{0, 2.5e-4},
		MuD:  Piecewise{Knee: 0.5, Below: Lin{8, 44}, Above: Lin{30, 0}},
		RMin: 0, RMax: 262144, // 1 GiB/s of dirtying: a placeholder
		Sigma: 4096, SmallState: 1e5,
		DirtyPages: DirtyMax,
	}
}

// RHat is the normalised dirty rate R̂ = (R − R_min)/(R_max − R_min),
// clamped to [0, 1]: the fits are only known inside the measured range.
func (p PAMParams) RHat(r float64) float64 {
	if p.RMax <= p.RMin {
		return 0
	}
	return math.Min(1, math.Max(0, (r-p.RMin)/(p.RMax-p.RMin)))
}

// small reports whether M is on the small side of the 10^5 B split. Eq 15
// writes M ≤ 10^5 and the τ2 text M < 10^5; we use ≤ for both.
func (p PAMParams) small(m float64) bool { return m <= p.SmallState }

// FrozenP is Eq 11: T^{p,frozen} = φ^p + Γ·ζ·M.
func (p PAMParams) FrozenP(m float64) float64 { return p.PhiP + p.Gamma*p.Zeta*m }

// FrozenD is Eq 12: T^{d,frozen} = φ^d + Γ·ξ(R)·M.
func (p PAMParams) FrozenD(m, rh float64) float64 { return p.PhiD + p.Gamma*p.Xi.At(rh)*m }

// MemP is Eq 13 for a pre-dump: T^{p,mem} = δ + Λ·M.
func (p PAMParams) MemP(m float64) float64 { return p.Delta + p.Lambda*m }

// MemD is Eq 13 for a dump: T^{d,mem} = δ + Λ·η(R)·M.
func (p PAMParams) MemD(m, rh float64) float64 { return p.Delta + p.Lambda*p.Eta.At(rh)*m }

// PagesP is Eq 14: N^p(M) = μ^p + ν^p·M.
func (p PAMParams) PagesP(m float64) float64 { return p.MuP + p.NuP*m }

// PagesD is Eq 15: N^d = μ^d(R) for small M, μ^d(R) + ν^d(R)·M otherwise.
func (p PAMParams) PagesD(m, rh float64) float64 {
	if p.small(m) {
		return p.MuD.At(rh)
	}
	return p.MuD.At(rh) + p.NuD.At(rh)*m
}

// Tau2At is τ2(M, R̂).
func (p PAMParams) Tau2At(m, rh float64) float64 {
	t := p.Tau2
	if p.small(m) {
		return t.LogA + t.LogB*math.Log(rh+t.LogC)
	}
	return t.HypA + t.HypB/(rh+t.HypC)
}

// CkpPre is Eq 9 with β for T^freeze: the engine-level pre-dump time
// α1·α2·(β + T^{p,frozen} + T^{p,mem}).
func (p PAMParams) CkpPre(m float64) float64 {
	return p.Alpha1 * p.Alpha2 * (p.Beta + p.FrozenP(m) + p.MemP(m))
}

// frozenDump is the dump's frozen time, with T^{d,mem} when asked for.
func (p PAMParams) frozenDump(m, rh float64) float64 {
	f := p.FrozenD(m, rh)
	if p.DumpMemInFrozen {
		f += p.MemD(m, rh)
	}
	return f
}

// CkpDump is Eq 10: α1·α2·(β + T^{d,frozen}).
func (p PAMParams) CkpDump(m, rh float64) float64 {
	return p.Alpha1 * p.Alpha2 * (p.Beta + p.frozenDump(m, rh))
}

// Restore is Eq 16: α3·α4·(ψ + ω·M); forking time is neglected (Eq 5).
func (p PAMParams) Restore(m float64) float64 {
	return p.Alpha3 * p.Alpha4 * (p.Psi + p.Omega*m)
}

// PAMInputs are the workload and the link for one PAM evaluation.
type PAMInputs struct {
	M float64   // state size, bytes
	R float64   // dirty page rate, pages/s
	L []float64 // L_i, link capacity per iteration in bytes/s (i = 0..I+1); the last value repeats
	I int       // dump iterations after the pre-dump; I+1 iterations in all before Stop&Copy
}

// PAMIter is one iteration: i = 0 is the pre-dump, 1..I the dumps while
// running, and the last entry the Stop&Copy dump.
type PAMIter struct {
	Pages   float64 // N_i (for i = 0, the pre-dump's N^p)
	Volume  float64 // V_i, bytes sent
	Ckp     float64 // engine-level checkpoint time (Eq 9 or 10)
	Net     float64 // T^net = V_i / L_i
	Frozen  float64 // CRIU-level freeze + frozen time
	Running float64 // time the service ran during the iteration (Eq 4)
	T       float64 // T_i (Eq 17 or 18)
}

// PAMResult holds the KPIs.
type PAMResult struct {
	Iters    []PAMIter
	Restore  float64 // α3·α4·T^reloc (Eq 16)
	Downtime float64 // T^down (Eq 19)
	Total    float64 // T^mig (Eq 1 = Eq 20)
	// Frozen sums the freezes before Stop&Copy (Σ β + T^{x,frozen}): the
	// service disruption the paper says pre-copy iterations add.
	Frozen float64
	Bytes  float64 // Σ V_i
}

// linkAt returns L_i: the i-th entry, or the last one past the end.
func linkAt(l []float64, i int) float64 {
	if len(l) == 0 {
		return 0
	}
	return l[min(i, len(l)-1)]
}

// xfer is bytes/bps, with nothing to send costing nothing and a dead link
// taking forever.
func xfer(bytes, bps float64) float64 {
	if bytes <= 0 {
		return 0
	}
	if bps <= 0 {
		return math.Inf(1)
	}
	return bytes / bps
}

// PAM evaluates Iterative PreCopy: a pre-dump (Eq 17), I dumps while the
// service runs (Eq 18), then Stop&Copy (Eq 19); T^mig per Eq 1.
//
// Choices where the paper leaves room (docs/MODEL.md, "PAM"):
//   - Eq 4 is read with R in pages/s, so N_i = R·(T_{i-1} − T^{x,frozen}_{i-1}),
//     capped at M/σ. It is applied to the engine-level iteration duration:
//     the service runs during the engine's overhead too (with α = 1 this is
//     the CRIU-level reading).
//   - Eq 4 and Eq 15 both give N_i; DirtyPages chooses (default: the larger).
//   - T^net is per iteration, V_i/L_i; Eq 20's single T^net is read as such,
//     which makes Eq 20 equal to Eq 1: T0 + Σ_{i=1..I} T_i + T^down.
func PAM(p PAMParams, in PAMInputs) PAMResult {
	m, r := in.M, in.R
	rh := p.RHat(r)
	a12 := p.Alpha1 * p.Alpha2
	frozenD := p.frozenDump(m, rh)

	var res PAMResult
	// i = 0: the pre-dump sends the whole state, V_0 = ρ·τ1·M.
	v0 := p.Rho * p.Tau1 * m
	it := PAMIter{Pages: p.PagesP(m), Volume: v0, Ckp: p.CkpPre(m), Net: xfer(v0, linkAt(in.L, 0))}
	it.Frozen = p.Beta + p.FrozenP(m)
	it.T = it.Ckp + it.Net
	it.Running = math.Max(0, it.T-p.FrozenP(m))
	res.Iters = append(res.Iters, it)

	for i := 1; i <= in.I+1; i++ {
		prev := res.Iters[i-1]
		dyn := math.Min(m/p.Sigma, r*prev.Running)
		var n float64
		switch p.DirtyPages {
		case DirtyDynamic:
			n = dyn
		case DirtyFitted:
			n = p.PagesD(m, rh)
		default:
			n = math.Max(dyn, p.PagesD(m, rh))
		}
		v := p.Rho * p.Tau2At(m, rh) * n * p.Sigma
		it := PAMIter{Pages: n, Volume: v, Ckp: a12 * (p.Beta + frozenD), Net: xfer(v, linkAt(in.L, i))}
		it.Frozen = p.Beta + frozenD
		it.T = it.Ckp + it.Net
		it.Running = math.Max(0, it.T-frozenD)
		res.Iters = append(res.Iters, it)
	}

	res.Restore = p.Restore(m)
	last := res.Iters[len(res.Iters)-1]
	res.Downtime = last.Ckp + last.Net + res.Restore // Eq 19
	for i, it := range res.Iters {
		res.Bytes += it.Volume
		if i < len(res.Iters)-1 {
			res.Total += it.T
			res.Frozen += it.Frozen
		}
	}
	res.Total += res.Downtime // Eq 1
	return res
}

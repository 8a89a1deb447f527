package model

import "math"

// IdealResult is the ideal pre-copy model's prediction.
type IdealResult struct {
	Volumes   []float64 // V_0..V_{I+1}; the last is Stop&Copy's
	Durations []float64 // V_i / L
	Downtime  float64
	Total     float64
	Converges bool // Rσ < L: volumes shrink
}

// Ideal is the processing-free pre-copy model PAM is compared with (He,
// Toosi, Buyya, JSS 2021, as the PAM paper describes it): iteration i sends
// what was dirtied while iteration i-1 was on the wire, so volumes shrink
// geometrically, V_i = M·(R·σ/L)^i, and each iteration lasts V_i/L. After
// I+1 iterations (i = 0..I), Stop&Copy sends V_{I+1} and resumes in a
// constant time: T^down = V_{I+1}/L + resume, T^mig = Σ_{i=0..I} V_i/L + T^down.
// R is in pages/s, σ in bytes, L in bytes/s; volumes are not capped at M,
// as in the published form, so with R·σ ≥ L they grow.
func Ideal(m, r, sigma, l float64, iters int, resume float64) IdealResult {
	q := r * sigma / l
	res := IdealResult{Converges: q < 1}
	for i := 0; i <= iters+1; i++ {
		v := m * math.Pow(q, float64(i))
		d := xfer(v, l)
		res.Volumes = append(res.Volumes, v)
		res.Durations = append(res.Durations, d)
		if i <= iters {
			res.Total += d
		}
	}
	res.Downtime = res.Durations[iters+1] + resume
	res.Total += res.Downtime
	return res
}

// The textbook timelines of Yu's thesis, §2.2: each returns the migration
// time and the downtime from measured phase durations (seconds).

// ColdTimeline is Eqs 2.1-2.2: T_migrate = T_c + T_t + T_r (checkpoint,
// transfer, restore), and T_down = T_migrate since the service is stopped
// throughout.
func ColdTimeline(checkpoint, transfer, restore float64) (migrate, down float64) {
	migrate = checkpoint + transfer + restore
	return migrate, migrate
}

// PrecopyTimeline is Eqs 2.3-2.4: T_migrate = T_pre + T_mem + T_post
// (preparation; iterative copy and stop-and-copy; commitment and
// activation), and T_down = T_d + T'_post (stop-and-copy with the dirty
// pages' transfer, plus the part of post-migration before the service is
// active again).
func PrecopyTimeline(pre, mem, post, stopCopy, postInactive float64) (migrate, down float64) {
	return pre + mem + post, stopCopy + postInactive
}

// PostcopyTimeline is Eqs 2.5-2.6: T_migrate = T_prepare + T_transmit +
// T_resume, and T_down = T_transmit (the minimal state's transfer; the
// thesis counts the lazy page fetches in T_resume, after the service runs).
func PostcopyTimeline(prepare, transmit, resume float64) (migrate, down float64) {
	return prepare + transmit + resume, transmit
}

package fit

import (
	"fmt"
	"math"

	"github.com/ferry-migrate/ferry/internal/model"
)

// fitLazy fits the lazy-pages daemon's pull (model.LazyPull) to post-copy's
// commit+lazy-pages phases. fault_wait_s comes from the faults the runs
// counted; lazy_request_s is searched (a log grid, then golden section);
// for each, lazy_bps follows in closed form from the unshaped runs with
// nothing written (pull = requests(M)·lazy_request_s + M/lazy_bps),
// fault_s by golden section over the other unshaped runs, and
// lazy_serial_share the same way over the runs on the shaped link (which
// is why link_efficiency comes first); the least relative squared error
// over every run wins. Without quiet runs (the quick grid: one dirty rate)
// round trips cannot be told from bytes: lazy_request_s and fault_s keep
// their values and lazy_bps is searched.
func fitLazy(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "lazy-pages", Kind: "model",
		From: "post-copy's commit+lazy-pages vs memory, dirty rate and link (model.LazyPull)"}
	var quiet, faulting, shaped []pullRun
	byRate := map[string][2][]float64{}
	for _, s := range collect(ms, func(pt Point) bool { return pt.Mode == model.ModePostcopy }) {
		r := pullRun{m: s.m, rate: float64(s.p.DirtyRate), y: PhaseS(s.r, "commit", "lazy-pages"), faults: float64(s.r.PagesFaulted),
			link: p.LinkEfficiency * float64(s.p.BandwidthBps) / 8}
		switch {
		case r.y <= 0:
		case r.link > 0:
			shaped = append(shaped, r)
		case r.rate == 0:
			r.requests = model.LazyRequests(r.m) // once, not per searched lazy_request_s
			quiet = append(quiet, r)
		default:
			faulting = append(faulting, r)
		}
		if r.y > 0 && r.link == 0 {
			k := fmt.Sprintf("at %d pages/s", s.p.DirtyRate)
			xy := byRate[k]
			byRate[k] = [2][]float64{append(xy[0], r.m), append(xy[1], r.y)}
		}
	}
	if len(quiet)+len(faulting) == 0 {
		return t, ErrNoData
	}
	unshapedRuns := append(append([]pullRun(nil), quiet...), faulting...)
	all := append(append([]pullRun(nil), unshapedRuns...), shaped...)
	// No run that faulted less than free writes would: no bound (0).
	p.FaultWaitS, _ = fitFaultWait(append(append([]pullRun(nil), faulting...), shaped...))
	fitFor := func(c float64) (model.Profile, float64) {
		q := *p
		q.LazyRequestS = c
		if len(quiet) > 0 {
			q.LazyBps = quietRate(quiet, c)
			if len(faulting) > 0 {
				q.FaultS = model.GoldenSection(func(f float64) float64 { q.FaultS = f; return pullError(q, faulting) }, 0, 0.02, 40)
			}
		} else {
			logPerByte := model.GoldenSection(func(l float64) float64 { q.LazyBps = math.Exp(-l); return pullError(q, unshapedRuns) }, math.Log(1e-10), math.Log(1e-6), 40)
			q.LazyBps = math.Exp(-logPerByte)
		}
		if len(shaped) > 0 && q.LazyBps > 0 {
			q.LazySerialShare = model.GoldenSection(func(k float64) float64 { q.LazySerialShare = k; return pullError(q, shaped) }, 0, 1, 30)
		}
		return q, pullError(q, all)
	}
	best, bestErr := fitFor(p.LazyRequestS)
	if len(quiet) > 0 { // else one dirty rate cannot tell round trips from bytes: keep lazy_request_s
		bestC := 0.0
		for c := 1e-5; c <= 0.02; c *= 1.5 {
			if q, e := fitFor(c); e < bestErr && q.LazyBps > 0 {
				best, bestErr, bestC = q, e, c
			}
		}
		if bestC > 0 {
			c := math.Exp(model.GoldenSection(func(lc float64) float64 { _, e := fitFor(math.Exp(lc)); return e }, math.Log(bestC/1.5), math.Log(bestC*1.5), 30))
			if q, e := fitFor(c); e < bestErr && q.LazyBps > 0 {
				best = q
			}
		}
	}
	if !(best.LazyBps > 0) {
		return t, ErrNoData
	}
	p.LazyRequestS, p.LazyBps, p.FaultS, p.LazySerialShare = best.LazyRequestS, best.LazyBps, best.FaultS, best.LazySerialShare
	t.Sets = map[string]float64{"lazy_bps": p.LazyBps}
	if len(quiet) > 0 {
		t.Sets["lazy_request_s"] = p.LazyRequestS
	}
	if len(quiet) > 0 && len(faulting) > 0 {
		t.Sets["fault_s"] = p.FaultS
	}
	if len(faulting)+len(shaped) > 0 {
		t.Sets["fault_wait_s"] = p.FaultWaitS
	}
	if len(shaped) > 0 {
		t.Sets["lazy_serial_share"] = p.LazySerialShare
	}
	pred := make([]float64, len(all))
	for i, r := range all {
		t.X, t.Y = append(t.X, r.m), append(t.Y, r.y)
		pred[i] = p.LazyPull(r.m, r.link, r.rate)
	}
	t.Fit = model.FitResiduals(t.Y, pred)
	if len(byRate) > 1 {
		t.Note = "unshaped, by dirty rate: " + subFits(byRate)
	}
	return t, nil
}

// pullRun is one measured post-copy pull: memory, dirty rate, seconds, the
// pages that faulted meanwhile, the link's payload rate (0: unshaped), and
// for quiet runs the daemon's request count (model.LazyRequests).
type pullRun struct{ m, rate, y, faults, link, requests float64 }

// fitFaultWait fits fault_wait_s to the faults the runs counted: over a pull
// of T seconds the missing share falls from 1 to 0 about linearly, so a
// writer at R pages/s faults ∫ min(R·(1 − t/T), 1/w) dt = c·t1 + R·(T −
// t1)²/(2T) times, c = 1/w, t1 = T·(1 − c/R) (0 when c ≥ R). It returns
// false when no run faulted less than unbounded writes would (no bound seen).
func fitFaultWait(runs []pullRun) (float64, bool) {
	faults := func(r pullRun, w float64) float64 {
		c := 1 / w
		t1 := math.Max(r.y*(1-c/r.rate), 0)
		return c*t1 + r.rate*(r.y-t1)*(r.y-t1)/(2*r.y)
	}
	var bounded []pullRun
	for _, r := range runs {
		if r.faults > 0 && r.faults < 0.9*r.rate*r.y/2 {
			bounded = append(bounded, r)
		}
	}
	if len(bounded) == 0 {
		return 0, false
	}
	logW := model.GoldenSection(func(l float64) float64 {
		var e float64
		for _, r := range bounded {
			d := (faults(r, math.Exp(l)) - r.faults) / r.faults
			e += d * d
		}
		return e
	}, math.Log(1e-5), math.Log(0.1), 50)
	return math.Exp(logW), true
}

// pullError is the relative squared error of p's pulls against runs
// (each memory and rate predicted once: the search calls this thousands
// of times).
func pullError(p model.Profile, runs []pullRun) float64 {
	var e float64
	pred := map[[3]float64]float64{}
	for _, r := range runs {
		k := [3]float64{r.m, r.rate, r.link}
		v, ok := pred[k]
		if !ok {
			v = p.LazyPull(r.m, r.link, r.rate)
			pred[k] = v
		}
		d := (v - r.y) / r.y
		e += d * d
	}
	return e
}

// quietRate is lazy_bps for a given lazy_request_s from pulls with nothing
// written, y = n(M)·c + M·k with k = 1/lazy_bps, least squares in relative
// error (0 when the round trips alone exceed the pulls).
func quietRate(runs []pullRun, c float64) float64 {
	var num, den float64
	for _, r := range runs {
		a := r.m / r.y
		num += a * (1 - r.requests*c/r.y)
		den += a * a
	}
	if den == 0 || num <= 0 {
		return 0
	}
	return den / num
}

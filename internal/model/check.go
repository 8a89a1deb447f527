package model

import (
	"math"
	"slices"

	"github.com/ferry-migrate/ferry/api"
)

// What one migration says of each profile term: the term's prediction for
// the phases it governs beside what those phases took. The phases and the
// runs each term uses are the fitters' (internal/fit/terms.go), so a
// report's checks and the refit from it agree on what a term is.

// InputsOf turns a report's plan inputs into model inputs. An unknown
// link (0) is one that does not limit.
func InputsOf(pi api.PlanInputs) Inputs {
	bw := pi.BandwidthBps
	if bw <= 0 {
		bw = math.Inf(1)
	}
	return Inputs{MemoryBytes: pi.MemoryBytes, DirtyRatePagesPerSec: pi.DirtyRate, BandwidthBps: bw,
		SharedBytes: pi.SharedBytes, NoLazyRestore: pi.NoLazyRestore, CopiesImages: pi.CopiesImages}
}

// PredictReport predicts a finished migration's mode at the live rounds
// it ran, from its plan inputs.
func PredictReport(p Profile, pi api.PlanInputs, mode string) Prediction {
	q := Predict(p, InputsOf(pi), mode, max(pi.Rounds, 1))
	if math.IsInf(q.Bytes, 0) {
		q.Bytes = 0 // an unknown link; JSON has no infinity
	}
	return q
}

// CheckTerms lists the terms a successful migration measured (the
// report r, of mode r.Mode), each predicted by p from pi.
func CheckTerms(p Profile, pi api.PlanInputs, r api.Report) []api.TermCheck {
	if !r.OK {
		return nil
	}
	in := InputsOf(pi)
	m := in.MemoryBytes
	var out []api.TermCheck
	add := func(name string, predS, measS float64) {
		if measS > 0 && predS > 0 && !math.IsInf(predS, 0) && !math.IsNaN(predS) {
			out = append(out, api.TermCheck{Name: name, PredictedMs: predS * 1000, MeasuredMs: measS * 1000})
		}
	}
	ph := func(names ...string) float64 { return PhasesS(r.Phases, names...) }
	if HasPhase(r.Phases, "freeze") {
		add("freeze", p.FreezeS, ph("freeze"))
	}
	setup := ph("prepare", "rootfs-sync")
	if !LazyMode(r.Mode) {
		setup += ph("commit")
	}
	add("setup", p.SetupS, setup)
	var live []api.Round
	var final *api.Round
	for i := range r.Rounds {
		if r.Rounds[i].Final {
			final = &r.Rounds[i]
		} else {
			live = append(live, r.Rounds[i])
		}
	}
	if !pi.Tracked && (r.Mode == ModePrecopy || r.Mode == ModeHybrid) {
		var s []float64
		for _, rd := range live {
			if rd.Index >= 1 {
				s = append(s, rd.DurationMs/1000)
			}
		}
		if len(s) > 0 {
			add("read-hash", m/p.ReadHashBps, mean(s))
		}
		if final != nil {
			add("frozen-read", m/p.frozenRead(), final.DurationMs/1000)
		}
	}
	switch r.Mode {
	case ModePostcopy:
		add("dump-fixed", p.DumpFixedS, ph("dump", "images"))
		add("lazy-setup", p.DumpFixedS+p.RestoreFixedS+p.LazySetupS, ph("dump", "images", "restore"))
		add("lazy-pages", p.PushPull(m, p.link(in, 0), in.DirtyRatePagesPerSec), ph("commit", "lazy-pages"))
	case ModeHybrid:
		add("local-fill", m/p.localFill(), ph("commit", "lazy-pages"))
	case ModeCold, ModePrecopy:
		if r.FillMs > 0 {
			add("image-fill", m/p.ImageFillBps, r.FillMs/1000)
		} else if r.Mode == ModePrecopy {
			add("dump", p.DumpFixedS+p.dumpTime(m)+m/p.ReadHashBps, ph("dump", "images"))
		}
		if !r.RestoreFromOwnImages {
			add("restore", p.restore(m), ph("restore")-r.FillMs/1000)
		}
	}
	return out
}

// PhasesS sums the named phases' durations, in seconds.
func PhasesS(phases []api.PhaseSpan, names ...string) float64 {
	var s float64
	for _, p := range phases {
		if slices.Contains(names, p.Name) {
			s += p.EndMs - p.StartMs
		}
	}
	return s / 1000
}

// HasPhase says whether the phases include name.
func HasPhase(phases []api.PhaseSpan, name string) bool {
	return slices.ContainsFunc(phases, func(p api.PhaseSpan) bool { return p.Name == name })
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

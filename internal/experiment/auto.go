package experiment

import (
	"fmt"
	"math"
	"slices"

	"github.com/ferry-migrate/ferry/internal/model"
)

// AutoCheck holds `--mode auto` to one grid point whose every engine mode
// was measured: the mode the model picks from what the migrations found
// (memory, dirty rate, link) against the mode that measured best by the
// planner's own rule.
type AutoCheck struct {
	Point Point `json:"point"` // Mode empty
	// Picked is model.Best's recommendation ("" when it found no mode
	// within the budget); Measured the best measured by the same rule
	// ("" when no mode's median stall was within the budget).
	Picked   string `json:"picked"`
	Measured string `json:"measured"`
	Agree    bool   `json:"agree"`
}

// CheckAuto compares, at each point where every engine mode has a
// completed run, the model's pick with the measured best under a client
// stall budget (0: none). The rule is model.Best's: within the budget,
// the modes that keep the source resumable (cold, pre-copy) come first,
// the lowest median total among them; the lazy modes only when neither
// fits, again the lowest total. Bounded modes (precopy/1) are not
// auto's to pick and are left out.
func CheckAuto(res Results, profile model.Profile, budgetMs float64) []AutoCheck {
	type medians struct{ stall, total, memory, rate, shared, rootfs []float64 }
	byPoint := map[Point]map[string]*medians{}
	var order []Point
	for _, r := range res.Runs {
		if !r.OK || !slices.Contains(model.EngineModes, r.Mode) {
			continue
		}
		q := r.Point
		q.Mode = ""
		if byPoint[q] == nil {
			byPoint[q] = map[string]*medians{}
			order = append(order, q)
		}
		m := byPoint[q][r.Mode]
		if m == nil {
			m = &medians{}
			byPoint[q][r.Mode] = m
		}
		m.stall = append(m.stall, r.ClientDowntimeMs)
		m.total = append(m.total, r.TotalMs)
		m.memory = append(m.memory, float64(r.MemoryBytes))
		m.shared = append(m.shared, float64(r.SharedBytes))
		m.rootfs = append(m.rootfs, float64(r.RootfsBytes))
		if r.DirtyRateMeasured > 0 {
			m.rate = append(m.rate, r.DirtyRateMeasured)
		}
	}
	var out []AutoCheck
	for _, q := range order {
		modes := byPoint[q]
		if len(modes) < len(model.EngineModes) {
			continue // not every mode measured: the best is unknown
		}
		var memory, rates, shared, rootfs []float64
		for _, m := range modes {
			memory = append(memory, m.memory...)
			rates = append(rates, m.rate...)
			shared = append(shared, m.shared...)
			rootfs = append(rootfs, m.rootfs...)
		}
		rate := float64(q.DirtyRate)
		if workloads[q.Workload].service != nil {
			rate = Median(rates)
		}
		in := model.Inputs{MemoryBytes: Median(memory), DirtyRatePagesPerSec: rate, BandwidthBps: float64(q.BandwidthBps) / 8,
			SharedBytes: Median(shared), RootfsBytes: Median(rootfs)}
		_, _, picked, _ := model.Best(profile, in, budgetMs)
		measured := ""
		for _, resumable := range []bool{true, false} {
			low := math.Inf(1)
			for _, mode := range model.EngineModes {
				m := modes[mode]
				isResumable := mode == model.ModeCold || mode == model.ModePrecopy
				if isResumable != resumable || (budgetMs > 0 && Median(m.stall) > budgetMs) {
					continue
				}
				if t := Median(m.total); t < low {
					low, measured = t, mode
				}
			}
			if measured != "" {
				break
			}
		}
		out = append(out, AutoCheck{Point: q, Picked: picked, Measured: measured, Agree: picked == measured})
	}
	return out
}

// AutoSummary says how often auto agreed, for a person.
func AutoSummary(checks []AutoCheck, budgetMs float64) string {
	agreed := 0
	for _, c := range checks {
		if c.Agree {
			agreed++
		}
	}
	budget := "no budget"
	if budgetMs > 0 {
		budget = fmt.Sprintf("a %.0f ms budget", budgetMs)
	}
	return fmt.Sprintf("--mode auto picked the mode that measured best at %d of %d points (%s)", agreed, len(checks), budget)
}

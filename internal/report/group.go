package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/experiment"
)

// workload is one workload's share of the results: its own figures and
// table.
type workload struct {
	name   string
	runs   []experiment.Run
	points []*point
	// modes in the report's order; varies says which of the grid's other
	// factors take more than one value here (they then appear in labels).
	modes  []string
	varies factors
}

// point is one grid point's runs and the statistics of its completed ones.
type point struct {
	experiment.Point
	runs []experiment.Run // all, in the order they ran
	ok   []experiment.Run // completed
	// Over the completed runs.
	total, downtime, clientDowntime, bytesSent Interval
	// stateOK counts the runs, of all, whose state checked out afterwards.
	stateOK int
}

// factors are the grid's factors other than the workload and the mode.
type factors struct{ runtime, state, dirty, load, bandwidth bool }

// modeOrder is ferry's modes from the simplest; others follow by name.
var modeOrder = []string{engine.ModeCold, engine.ModePrecopy, engine.ModePostcopy, engine.ModeHybrid, engine.ModeAuto}

func compareModes(a, b string) int {
	// precopy/1 (a bound on the rounds) sorts beside precopy.
	ba, _, _ := strings.Cut(a, "/")
	bb, _, _ := strings.Cut(b, "/")
	ia, ib := slices.Index(modeOrder, ba), slices.Index(modeOrder, bb)
	if ia < 0 {
		ia = len(modeOrder)
	}
	if ib < 0 {
		ib = len(modeOrder)
	}
	return cmp.Or(cmp.Compare(ia, ib), strings.Compare(a, b))
}

// group splits the runs by workload, in the order workloads first ran, and
// each workload's runs by grid point, sorted by runtime, mode and size.
func group(runs []experiment.Run) []*workload {
	var ws []*workload
	byName := map[string]*workload{}
	for _, r := range runs {
		w := byName[r.Workload]
		if w == nil {
			w = &workload{name: r.Workload}
			byName[r.Workload] = w
			ws = append(ws, w)
		}
		w.runs = append(w.runs, r)
	}
	for _, w := range ws {
		byPoint := map[experiment.Point]*point{}
		for _, r := range w.runs {
			p := byPoint[r.Point]
			if p == nil {
				p = &point{Point: r.Point}
				byPoint[r.Point] = p
				w.points = append(w.points, p)
			}
			p.runs = append(p.runs, r)
			if r.OK {
				p.ok = append(p.ok, r)
			}
			if r.StateOK {
				p.stateOK++
			}
			if !slices.Contains(w.modes, r.Mode) {
				w.modes = append(w.modes, r.Mode)
			}
		}
		slices.SortFunc(w.modes, compareModes)
		slices.SortStableFunc(w.points, func(a, b *point) int { return comparePoints(a.Point, b.Point) })
		for _, p := range w.points {
			p.summarize()
		}
		w.varies = varying(w.points)
	}
	return ws
}

func comparePoints(a, b experiment.Point) int {
	return cmp.Or(strings.Compare(a.Runtime, b.Runtime), compareModes(a.Mode, b.Mode),
		cmp.Compare(a.StateBytes, b.StateBytes), cmp.Compare(a.DirtyRate, b.DirtyRate),
		cmp.Compare(a.Load, b.Load), cmp.Compare(a.BandwidthBps, b.BandwidthBps))
}

func (p *point) summarize() {
	var total, down, client, bytes []float64
	for _, r := range p.ok {
		total = append(total, r.TotalMs)
		down = append(down, r.DowntimeMs)
		client = append(client, r.ClientDowntimeMs)
		bytes = append(bytes, float64(r.BytesSent))
	}
	p.total, p.downtime, p.clientDowntime, p.bytesSent = MedianCI(total), MedianCI(down), MedianCI(client), MedianCI(bytes)
}

func varying(pts []*point) factors {
	distinct := func(f func(experiment.Point) string) bool {
		seen := map[string]bool{}
		for _, p := range pts {
			seen[f(p.Point)] = true
		}
		return len(seen) > 1
	}
	return factors{
		runtime:   distinct(func(p experiment.Point) string { return p.Runtime }),
		state:     distinct(func(p experiment.Point) string { return fmt.Sprint(p.StateBytes) }),
		dirty:     distinct(func(p experiment.Point) string { return fmt.Sprint(p.DirtyRate) }),
		load:      distinct(func(p experiment.Point) string { return fmt.Sprint(p.Load) }),
		bandwidth: distinct(func(p experiment.Point) string { return fmt.Sprint(p.BandwidthBps) }),
	}
}

// label names a point by its mode and whichever other factors vary in the
// workload (the state size only if withState).
func (w *workload) label(p experiment.Point, withState bool) string {
	parts := []string{p.Mode}
	if w.varies.runtime {
		parts = append(parts, p.Runtime)
	}
	if withState && w.varies.state {
		parts = append(parts, formatBytes(p.StateBytes))
	}
	if w.varies.dirty {
		parts = append(parts, fmt.Sprintf("%d pages/s", p.DirtyRate))
	}
	if w.varies.load {
		parts = append(parts, fmt.Sprintf("%d req/s", p.Load))
	}
	if w.varies.bandwidth {
		parts = append(parts, formatRate(p.BandwidthBps))
	}
	return strings.Join(parts, ", ")
}

// describe is a setting (a point less its mode) in words, for captions.
func describe(p experiment.Point) string {
	parts := []string{}
	if p.Runtime != "" {
		parts = append(parts, p.Runtime)
	}
	parts = append(parts, formatBytes(p.StateBytes)+" of state")
	if p.DirtyRate > 0 {
		parts = append(parts, fmt.Sprintf("%d pages/s dirtied", p.DirtyRate))
	}
	if p.Load > 0 {
		parts = append(parts, fmt.Sprintf("%d requests/s", p.Load))
	}
	parts = append(parts, "link "+formatRate(p.BandwidthBps))
	return strings.Join(parts, ", ")
}

// representative is one run standing for its mode in a figure.
type representative struct {
	run experiment.Run
	// of is how many runs it was chosen from.
	of int
}

// representatives picks, for a figure showing one run per mode, a setting
// (a grid point less its mode: modes side by side must share it) and, at
// that setting, each mode's run of median total time among those that
// fit (the lower middle one for an even count). The setting is the one
// where the most modes have a fitting run, then the largest state, then
// the first in the table's order.
func (w *workload) representatives(fits func(experiment.Run) bool) (experiment.Point, []representative) {
	type setting struct {
		key   experiment.Point
		modes map[string][]experiment.Run
	}
	var settings []*setting
	byKey := map[experiment.Point]*setting{}
	for _, p := range w.points {
		key := p.Point
		key.Mode = ""
		s := byKey[key]
		if s == nil {
			s = &setting{key: key, modes: map[string][]experiment.Run{}}
			byKey[key] = s
			settings = append(settings, s)
		}
		for _, r := range p.runs {
			if fits(r) {
				s.modes[r.Mode] = append(s.modes[r.Mode], r)
			}
		}
	}
	var best *setting
	for _, s := range settings {
		if len(s.modes) == 0 {
			continue
		}
		if best == nil || len(s.modes) > len(best.modes) ||
			(len(s.modes) == len(best.modes) && s.key.StateBytes > best.key.StateBytes) {
			best = s
		}
	}
	if best == nil {
		return experiment.Point{}, nil
	}
	var reps []representative
	for _, mode := range w.modes {
		runs := slices.Clone(best.modes[mode])
		if len(runs) == 0 {
			continue
		}
		slices.SortStableFunc(runs, func(a, b experiment.Run) int { return cmp.Compare(a.TotalMs, b.TotalMs) })
		reps = append(reps, representative{run: runs[(len(runs)-1)/2], of: len(runs)})
	}
	return best.key, reps
}

// formatBytes prints a size in binary units: 512 MiB, 1.5 GiB.
func formatBytes(b int64) string {
	const ki = 1024
	v, units := float64(b), []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= ki && i < len(units)-1 {
		v /= ki
		i++
	}
	return trimFloat(v) + " " + units[i]
}

// formatRate prints a link's rate in bits per second; 0 is an unshaped
// link.
func formatRate(bps int64) string {
	if bps <= 0 {
		return "unshaped"
	}
	v, units := float64(bps), []string{"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"}
	i := 0
	for v >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return trimFloat(v) + " " + units[i]
}

// trimFloat prints up to two decimals, without trailing zeros.
func trimFloat(v float64) string {
	s := strings.TrimRight(fmt.Sprintf("%.2f", v), "0")
	return strings.TrimSuffix(s, ".")
}

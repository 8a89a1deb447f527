package fit

import (
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/runresult"
)

// Helpers that turn a run's phase spans into the quantities the model
// terms predict. Phase names are the engine's (prepare, rootfs-sync,
// round-N, freeze, dump, images, restore, commit, lazy-pages, cleanup).

// PhaseS sums the durations of the named phases, in seconds.
func PhaseS(r runresult.Run, names ...string) float64 {
	var s float64
	for _, p := range r.Phases {
		if slices.Contains(names, p.Name) {
			s += p.EndMs - p.StartMs
		}
	}
	return s / 1000
}

// hasPhase says whether the run recorded the phase.
func hasPhase(r runresult.Run, name string) bool {
	return slices.ContainsFunc(r.Phases, func(p api.PhaseSpan) bool { return p.Name == name })
}

// RoundsS sums the live rounds' phases (round-N), in seconds.
func RoundsS(r runresult.Run) float64 {
	var s float64
	for _, p := range r.Phases {
		if strings.HasPrefix(p.Name, "round-") {
			s += p.EndMs - p.StartMs
		}
	}
	return s / 1000
}

// LiveRounds counts the rounds sent while the container ran (hybrid's
// final round, read while frozen, is not one).
func LiveRounds(r runresult.Run) int {
	n := 0
	for _, rd := range r.Rounds {
		if !rd.Final {
			n++
		}
	}
	return n
}

// OKRuns returns the successful runs.
func OKRuns(res runresult.MigrateResult) []runresult.Run {
	var out []runresult.Run
	for _, r := range res.Runs {
		if r.OK {
			out = append(out, r)
		}
	}
	return out
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// Median is the middle value of xs (NaN when empty).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// distinct counts the different values in xs.
func distinct(xs []float64) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return len(slices.Compact(s))
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// Package learn is an agent's model learning from its own migrations:
// it keeps their reports (Store), refits the host's profile from them
// (fit.FitOnline) with prediction intervals from their residuals,
// and tells each term's recent error and whether the profile drifts from
// what is measured (docs/MODEL.md, "Learning from every migration").
package learn

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/fit"
	"github.com/ferry-migrate/ferry/internal/model"
)

const (
	// RecentCount is how many of a term's latest checks its recent error
	// averages.
	RecentCount = 20
	// DriftBound is the recent error beyond which a term drifts, once
	// MinDriftSamples checks are behind it.
	DriftBound      = 0.25
	MinDriftSamples = 5
	// IntervalRuns is how many of a mode's latest migrations its interval
	// comes from.
	IntervalRuns = 50
)

// Error floors: a term's error is counted against the larger of its
// measurement and the floor, so that a few milliseconds' miss on a term
// of a few milliseconds is not called drift; downtime's floor is the
// one issue 50's targets use.
const (
	termFloorMs     = 10
	downtimeFloorMs = 100
)

// Learner holds an agent's history and the profile refitted from it. Its
// methods are safe for concurrent use.
type Learner struct {
	mu      sync.Mutex
	store   *Store
	base    model.Profile
	profile model.Profile
	terms   []fit.OnlineTerm
	// since is, by term, when the host last changed under it: a term that
	// drifted is fitted only from the migrations in its recent window,
	// not from the history of a host that is no more (kept in sinceFile).
	since map[string]time.Time
}

// sinceFile keeps Learner.since beside the history.
const sinceFile = "since.json"

// Open loads the history in dir and refits base from it.
func Open(dir string, base model.Profile, keep int) (*Learner, error) {
	s, err := OpenStore(dir, keep)
	if err != nil {
		return nil, err
	}
	l := &Learner{store: s, base: base, since: map[string]time.Time{}}
	if b, err := os.ReadFile(filepath.Join(dir, sinceFile)); err == nil {
		_ = json.Unmarshal(b, &l.since) // unreadable: the whole history counts again
	}
	l.refit()
	return l, nil
}

// Record keeps a migration's report, if it has something to learn from
// (it succeeded and carries its prediction), and refits.
func (l *Learner) Record(r api.Report) error {
	if !r.OK || r.Model == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.store.Add(r)
	if l.refit() {
		if b, merr := json.Marshal(l.since); merr == nil && err == nil {
			err = os.WriteFile(filepath.Join(l.store.dir, sinceFile), b, 0o600)
		}
	}
	return err
}

// Profile is the profile to plan with now.
func (l *Learner) Profile() model.Profile {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.profile
	p.Intervals = slices.Clone(p.Intervals)
	return p
}

// refit fits the profile again from the history (l.mu held); it says
// whether a term's window moved (the host changed under it).
func (l *Learner) refit() (moved bool) {
	reps := l.store.Reports()
	for name, e := range RecentErrors(reps) {
		if !e.Drift {
			continue
		}
		if t0 := recentStart(reps, name); t0.After(l.since[name]) {
			l.since[name], moved = t0, true
		}
	}
	p, terms := fit.FitOnline(reps, l.base, fit.MinOnlineSamples, l.since)
	n := 0
	for _, t := range terms {
		if t.Refitted {
			n++
		}
	}
	if n > 0 {
		p.Source = fmt.Sprintf("%s; %d terms refitted from this host's last %d migrations", l.base.Source, n, len(reps))
	}
	p.Intervals = mergeIntervals(l.base.Intervals, fit.FitIntervals(reps, p, IntervalRuns))
	l.profile, l.terms = p, terms
	return moved
}

// recentStart is when the first of term name's last RecentCount checks
// started.
func recentStart(reps []api.Report, name string) time.Time {
	n := 0
	for i := len(reps) - 1; i >= 0; i-- {
		r := reps[i]
		if r.Model == nil || !r.OK || !slices.ContainsFunc(r.Model.Terms, func(c api.TermCheck) bool { return c.Name == name }) {
			continue
		}
		if n++; n == RecentCount {
			return r.StartedAt
		}
	}
	for _, r := range reps {
		if r.Model != nil && r.OK && slices.ContainsFunc(r.Model.Terms, func(c api.TermCheck) bool { return c.Name == name }) {
			return r.StartedAt
		}
	}
	return time.Time{}
}

// mergeIntervals keeps the base profile's interval of a mode the history
// has too few migrations of.
func mergeIntervals(base, fitted []model.Interval) []model.Interval {
	out := slices.Clone(fitted)
	for i, iv := range out {
		if iv.Samples >= model.MinIntervalSamples {
			continue
		}
		for _, b := range base {
			if b.Mode == iv.Mode && b.Samples >= model.MinIntervalSamples {
				out[i] = b
			}
		}
	}
	return out
}

// Status is what the learner knows: each term's migrations, refit and
// recent error, the intervals, and the profile in use.
func (l *Learner) Status() api.ModelStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	reps := l.store.Reports()
	st := api.ModelStatus{Migrations: len(reps), Base: l.base.Source, DriftBound: DriftBound}
	if b, err := json.Marshal(l.profile); err == nil {
		st.Profile = b
	}
	errs := RecentErrors(reps)
	seen := map[string]bool{}
	for _, t := range l.terms {
		ts := errs[t.Name]
		ts.Name, ts.Migrations, ts.Refitted = t.Name, max(ts.Migrations, t.Migrations), t.Refitted
		if t.Refitted {
			ts.Sets = t.Sets
		}
		st.Terms = append(st.Terms, ts)
		seen[t.Name] = true
	}
	// Checked but not refitted here (lazy-pages), then the whole
	// predictions.
	for _, name := range sortedNames(errs) {
		if !seen[name] {
			st.Terms = append(st.Terms, errs[name])
		}
	}
	for _, t := range st.Terms {
		st.Drift = st.Drift || t.Drift
	}
	st.Intervals = append(st.Intervals, l.profile.Intervals...)
	return st
}

// RecentErrors is each term's recent error in reps (and "downtime" and
// "total", the whole predictions'): the mean absolute relative error of
// its last RecentCount checks, each prediction made before its migration
// ran, and whether that is drift. Migrations counts every check.
func RecentErrors(reps []api.Report) map[string]api.TermStatus {
	type check struct{ pred, meas, floor float64 }
	by := map[string][]check{}
	for _, r := range reps {
		if !r.OK || r.Model == nil {
			continue
		}
		for _, t := range r.Model.Terms {
			by[t.Name] = append(by[t.Name], check{t.PredictedMs, t.MeasuredMs, termFloorMs})
		}
		if q := r.Model.Prediction; q.DowntimeMs > 0 && q.TotalMs > 0 {
			by["downtime"] = append(by["downtime"], check{q.DowntimeMs, r.DowntimeMs, downtimeFloorMs})
			by["total"] = append(by["total"], check{q.TotalMs, r.TotalMs, termFloorMs})
		}
	}
	out := map[string]api.TermStatus{}
	for name, cs := range by {
		recent := cs[max(0, len(cs)-RecentCount):]
		var sum float64
		for _, c := range recent {
			sum += math.Abs(c.pred-c.meas) / math.Max(c.meas, c.floor)
		}
		e := sum / float64(len(recent))
		out[name] = api.TermStatus{Name: name, Migrations: len(cs), RecentError: e, RecentCount: len(recent),
			Drift: len(recent) >= MinDriftSamples && e > DriftBound}
	}
	return out
}

// Drifting lists the terms of the history in dir whose recent error is
// beyond the bound (ferry check, without the agent).
func Drifting(dir string) ([]api.TermStatus, int, error) {
	s, err := OpenStore(dir, 0)
	if err != nil {
		return nil, 0, err
	}
	errs := RecentErrors(s.Reports())
	var out []api.TermStatus
	for _, name := range sortedNames(errs) {
		if errs[name].Drift {
			out = append(out, errs[name])
		}
	}
	return out, len(s.Reports()), nil
}

func sortedNames(m map[string]api.TermStatus) []string {
	var names []string
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

package engine

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
)

// A migration's report carries the prediction it was planned with, from
// the profile the source was given, and what it measured against it term
// by term; it stays valid JSON.
func TestReportCarriesItsPrediction(t *testing.T) {
	pid := sleeper(t)
	prof := model.DefaultProfile()
	prof.Source = "the test's profile"
	prof.FreezeS = 0.5 // far from a fake freeze: its check must say so
	r := newSourceRun(t, func(r *sourceRun) {
		r.src.ctr.PID = pid
		r.s.CurrentProfile = func() model.Profile { return prof }
	})
	rep := r.migrate(ModePrecopy, PrecopyOptions{Engine: PrecopyContent, MaxRounds: 2})
	if !rep.OK {
		t.Fatalf("migration failed at %s: %s", rep.FailedAt, rep.Error)
	}
	c := rep.Model
	if c == nil {
		t.Fatal("no model check in the report")
	}
	if c.Profile != prof.Source || c.Prediction.Mode != ModePrecopy || c.Inputs.MemoryBytes <= 0 || c.Inputs.Rounds != len(rep.Rounds) {
		t.Errorf("planned with %q: %+v, inputs %+v (rounds %d)", c.Profile, c.Prediction, c.Inputs, len(rep.Rounds))
	}
	if q := c.Prediction; !(q.DowntimeLowMs <= q.DowntimeMs && q.DowntimeMs <= q.DowntimeHighMs && q.TotalLowMs <= q.TotalMs && q.TotalMs <= q.TotalHighMs) || q.DowntimeHighMs == 0 {
		t.Errorf("prediction without its interval: %+v", q)
	}
	i := slices.IndexFunc(c.Terms, func(tc api.TermCheck) bool { return tc.Name == "freeze" })
	if i < 0 {
		t.Fatalf("no freeze check: %+v", c.Terms)
	}
	if f := c.Terms[i]; f.PredictedMs != 500 || f.MeasuredMs <= 0 || f.MeasuredMs >= 500 {
		t.Errorf("freeze check %+v: predicted 500 ms, measured the fake's freeze", f)
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Errorf("the report is not JSON: %v", err)
	}
}

// A migration refused before the freeze planned nothing.
func TestNoPredictionBeforeTheFreeze(t *testing.T) {
	r := newSourceRun(t, func(r *sourceRun) { r.rt.prepareErr = errors.New("a container named web exists here") })
	if rep := r.migrate(ModeCold); rep.OK || rep.Model != nil {
		t.Errorf("a refused migration: ok %v, model %+v", rep.OK, rep.Model)
	}
}

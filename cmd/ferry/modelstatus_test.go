package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/model"
)

// ferry plan prints each prediction's interval, and a budget is judged by
// its upper bound.
func TestPlanPrintsIntervals(t *testing.T) {
	p := model.DefaultProfile()
	in := model.Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	out := plan(p, in, 0)
	var b bytes.Buffer
	printPlan(&b, out)
	cold := out.Predictions[0]
	want := msInterval(cold.DowntimeMs, cold.DowntimeLowMs, cold.DowntimeHighMs)
	if !strings.Contains(b.String(), "DOWNTIME (P10-P90)") || !strings.Contains(b.String(), want) {
		t.Errorf("no interval %q in:\n%s", want, b.String())
	}
	// A budget between a mode's point and its upper bound: whatever is
	// feasible (at its own round count) fits by its upper bound.
	for _, q := range out.Predictions {
		budget := time.Duration((q.DowntimeMs + q.DowntimeHighMs) / 2 * float64(time.Millisecond))
		o := plan(p, in, budget)
		for _, r := range o.Predictions {
			if slices.Contains(o.Feasible, r.Mode) && r.DowntimeHighMs > float64(budget)/float64(time.Millisecond) {
				t.Errorf("%s feasible within %v: predicted %.0f ms, up to %.0f ms", r.Mode, budget, r.DowntimeMs, r.DowntimeHighMs)
			}
			if r.Mode == q.Mode && r.Rounds == q.Rounds && slices.Contains(o.Feasible, r.Mode) {
				t.Errorf("%s at %d rounds feasible within %v, its upper bound %.0f ms", r.Mode, r.Rounds, budget, r.DowntimeHighMs)
			}
		}
	}
}

// ferry check names the drifting terms of the agent's history.
func TestCheckModelDrift(t *testing.T) {
	state := t.TempDir()
	if checkModel(state) != nil {
		t.Error("a host without history has something to say about its model")
	}
	var reps []api.Report
	for range 6 {
		reps = append(reps, api.Report{OK: true, Mode: "cold", DowntimeMs: 1000, TotalMs: 1100,
			Model: &api.ModelCheck{Prediction: api.Prediction{Mode: "cold", DowntimeMs: 1000, TotalMs: 1100},
				Terms: []api.TermCheck{{Name: "restore", PredictedMs: 100, MeasuredMs: 300}, {Name: "freeze", PredictedMs: 20, MeasuredMs: 21}}}})
	}
	b, _ := json.Marshal(reps)
	dir := agent.ModelDir(state)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "reports.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	c := checkModel(state)
	if c == nil || c.Migrations != 6 || len(c.Drifting) != 1 || c.Drifting[0].Name != "restore" {
		t.Fatalf("check: %+v", c)
	}
	if txt := c.text(); !strings.Contains(txt, "drift           restore: 67 % off on its last 6 migrations") {
		t.Errorf("check's text:\n%s", txt)
	}
}

// A report prints its prediction and what fell outside it.
func TestReportPrintsItsPrediction(t *testing.T) {
	r := api.Report{OK: true, Container: "web", Mode: "cold", DowntimeMs: 900, TotalMs: 1000,
		Model: &api.ModelCheck{Prediction: api.Prediction{Mode: "cold", DowntimeMs: 500, DowntimeLowMs: 300, DowntimeHighMs: 800, TotalMs: 1000, TotalLowMs: 850, TotalHighMs: 1250},
			Outside: []string{"downtime"}}}
	var b bytes.Buffer
	printReport(&b, r)
	for _, want := range []string{"predicted     downtime 500 ms (300-800), total 1000 ms (850-1250)", "outside       the measured downtime fell outside the predicted interval"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in:\n%s", want, b.String())
		}
	}
}

func TestPrintModelStatus(t *testing.T) {
	prof, _ := json.Marshal(model.Profile{Source: "ferry calibrate, quick grid; 2 terms refitted from this host's last 12 migrations"})
	st := api.ModelStatus{Migrations: 12, Base: "ferry calibrate, quick grid", Profile: prof, Drift: true, DriftBound: 0.25,
		Terms: []api.TermStatus{
			{Name: "freeze", Migrations: 12, Refitted: true, RecentError: 0.05, RecentCount: 12, Sets: map[string]float64{"freeze_s": 0.02}},
			{Name: "restore", Migrations: 12, RecentError: 0.6, RecentCount: 12, Drift: true},
		},
		Intervals: []api.ModeInterval{model.DefaultInterval("cold")}}
	var b bytes.Buffer
	printModelStatus(&b, st)
	for _, want := range []string{"12 migrations kept", "in use: ferry calibrate, quick grid; 2 terms", "freeze_s=0.02", "60.0 % of 12  DRIFT",
		"cold      downtime x0.60-1.60, total x0.85-1.25 (default width, 0 of 10 migrations needed)", "DRIFT: a term's recent error is beyond 25 %"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in:\n%s", want, b.String())
		}
	}
}

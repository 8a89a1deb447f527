package agent

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/model"
)

// The agent keeps what it learns from under its state directory, plans
// with the refitted profile, tells it in its status, and serves each
// term's recent error and drift as metrics.
func TestAgentLearnsFromItsMigrations(t *testing.T) {
	state := t.TempDir()
	a := &Agent{Host: host.Config{Name: "h1", StateDir: state}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.jobs = newJobs(t.TempDir())
	a.metrics = newMetrics(a.jobs)
	a.openLearner()
	if a.learner == nil || a.planProfile() == nil {
		t.Fatal("the agent does not learn")
	}
	// Migrations whose freeze took 60 ms where the profile says 6: the
	// freeze drifts, then refits.
	base := model.DefaultProfile()
	pi := api.PlanInputs{MemoryBytes: 64 << 20, BandwidthBps: 125e6}
	for range 6 {
		rep := engine.Report{OK: true, Mode: model.ModeCold, DowntimeMs: 900, TotalMs: 1000,
			Phases: []engine.PhaseSpan{{Name: "prepare", EndMs: 100}, {Name: "freeze", StartMs: 100, EndMs: 160}},
			Model:  &api.ModelCheck{Inputs: pi, Prediction: model.PredictReport(base, pi, model.ModeCold)}}
		rep.Model.Terms = model.CheckTerms(base, pi, rep)
		a.learned(rep)
		a.learned(engine.Report{Mode: model.ModeCold}) // failed: nothing to learn
	}
	if got := a.planProfile()().FreezeS; got < 0.059 || got > 0.061 {
		t.Errorf("the agent plans with freeze_s %v, want the 60 ms its migrations measured", got)
	}
	st := a.modelStatus()
	if st == nil || st.Migrations != 6 || !st.Drift {
		t.Fatalf("status %+v: want 6 migrations and drift", st)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { _ = a.metrics.serve(l) }()
	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := string(b)
	for _, want := range []string{`ferry_model_term_error_ratio{term="freeze"} 0.9`, `ferry_model_drift{term="freeze"} 1`, `ferry_model_term_migrations{term="freeze"} 6`} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s in:\n%s", want, out)
		}
	}

	// A restarted agent has its history.
	again := &Agent{Host: a.Host, Log: a.Log, jobs: a.jobs, metrics: newMetrics(a.jobs)}
	again.openLearner()
	if st := again.modelStatus(); st == nil || st.Migrations != 6 {
		t.Errorf("after a restart: %+v", st)
	}
}

package agent

import (
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/learn"
	"github.com/ferry-migrate/ferry/internal/model"
)

// The agent learns its model from the migrations it runs as their source
// (package learn): their reports kept under --state/model, the profile
// refitted from them and planned with, each term's error in the metrics.

// ModelDir is where an agent with state directory stateDir keeps the
// reports it learns from.
func ModelDir(stateDir string) string { return filepath.Join(stateDir, "model") }

// openLearner loads the history and refits; without one (an unreadable
// history) the agent plans with its base profile and says why.
func (a *Agent) openLearner() {
	base := model.DefaultProfile()
	if a.Profile != nil {
		base = *a.Profile
	}
	l, err := learn.Open(ModelDir(a.Host.StateDir), base, learn.DefaultKeep)
	if err != nil {
		a.Log.Warn("not learning from migrations: its history cannot be read", "error", err)
		return
	}
	a.learner = l
	a.metrics.reg.MustRegister(modelCollector{l})
}

// planProfile is the source's CurrentProfile: the refitted profile, or
// nil (the base profile stands) when the agent does not learn.
func (a *Agent) planProfile() func() model.Profile {
	if a.learner == nil {
		return nil
	}
	return a.learner.Profile
}

// learned records a finished migration's report.
func (a *Agent) learned(rep engine.Report) {
	if a.learner == nil {
		return
	}
	if err := a.learner.Record(rep); err != nil {
		a.Log.Warn("could not keep the migration's report for the model", "id", rep.ID, "error", err)
	}
}

// modelStatus is what the agent learned, for its status.
func (a *Agent) modelStatus() *api.ModelStatus {
	if a.learner == nil {
		return nil
	}
	st := a.learner.Status()
	return &st
}

// modelCollector serves each term's recent error and drift, read from the
// learner at each scrape.
type modelCollector struct{ l *learn.Learner }

var (
	termErrorDesc = prometheus.NewDesc("ferry_model_term_error_ratio",
		"Mean absolute relative error of a model term's last predictions against what this agent's migrations measured (downtime and total: the whole predictions').",
		[]string{"term"}, nil)
	termMigrationsDesc = prometheus.NewDesc("ferry_model_term_migrations",
		"Migrations kept that measured a model term.", []string{"term"}, nil)
	driftDesc = prometheus.NewDesc("ferry_model_drift",
		"1 when a model term's recent error is beyond the drift bound: the profile no longer describes this host.", []string{"term"}, nil)
)

func (modelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- termErrorDesc
	ch <- termMigrationsDesc
	ch <- driftDesc
}

func (c modelCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Status()
	for _, t := range st.Terms {
		ch <- prometheus.MustNewConstMetric(termMigrationsDesc, prometheus.GaugeValue, float64(t.Migrations), t.Name)
		if t.RecentCount == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(termErrorDesc, prometheus.GaugeValue, t.RecentError, t.Name)
		drift := 0.0
		if t.Drift {
			drift = 1
		}
		ch <- prometheus.MustNewConstMetric(driftDesc, prometheus.GaugeValue, drift, t.Name)
	}
}

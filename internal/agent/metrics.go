package agent

import (
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferry-migrate/ferry/internal/engine"
)

// metrics are what the agent serves to Prometheus (--metrics): its
// migrations as a source, by technique, runtime and outcome. A registry of
// its own, not the process-wide default: two agents in one test process
// keep separate counts.
type metrics struct {
	reg      *prometheus.Registry
	ended    *prometheus.CounterVec
	downtime *prometheus.HistogramVec
	total    *prometheus.HistogramVec
	sent     *prometheus.CounterVec
	settles  *prometheus.CounterVec
}

// newMetrics counts migrations as they end; those in flight are js's.
func newMetrics(js *jobs) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_migrations_total",
			Help: "Migrations this agent ran as their source, by technique, runtime and outcome (ok, failed, in_doubt, lost).",
		}, []string{"mode", "runtime", "outcome"}),
		downtime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_migration_downtime_seconds",
			Help:    "Downtime of the successful migrations: from the freeze until the copy ran at the destination.",
			Buckets: []float64{0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10, 30},
		}, []string{"mode"}),
		total: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_migration_total_seconds",
			Help:    "Total time of the successful migrations, until the destination owned the container and all of its memory.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300},
		}, []string{"mode"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_migration_bytes_sent_total",
			Help: "Bytes migrations sent on the wire, whatever their outcome.",
		}, []string{"mode"}),
	}
	m.settles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ferry_migrations_settled_total",
		Help: "Migrations left in doubt that this agent settled later with their destination, by runtime and outcome (removed, resumed, lost, diverged).",
	}, []string{"runtime", "outcome"})
	inFlight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ferry_migrations_in_flight",
		Help: "Migrations running now with this agent as their source.",
	}, func() float64 { return float64(js.running()) })
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ferry_lazy_pages_pending",
		Help: "Pages of frozen sources the destinations of this agent's running post-copy and hybrid migrations have not yet stored.",
	}, func() float64 { return float64(js.lazyPagesPending()) })
	m.reg.MustRegister(m.ended, m.downtime, m.total, m.sent, m.settles, inFlight, pending)
	return m
}

// done counts an ended migration.
func (m *metrics) done(req engine.Request, rep engine.Report) {
	mode, rt := rep.Mode, rep.Runtime
	if mode == "" {
		mode = req.Mode
	}
	outcome := "failed"
	switch {
	case rep.OK:
		outcome = "ok"
		m.downtime.WithLabelValues(mode).Observe(rep.DowntimeMs / 1000)
		m.total.WithLabelValues(mode).Observe(rep.TotalMs / 1000)
	case rep.InDoubtID != "":
		outcome = "in_doubt"
	case rep.SourceState == "lost":
		outcome = "lost" // worth an alert: the container runs nowhere
	}
	m.ended.WithLabelValues(mode, rt, outcome).Inc()
	m.sent.WithLabelValues(mode).Add(float64(rep.BytesSent))
}

// serve answers GET /metrics on l until it closes.
func (m *metrics) serve(l net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(l)
}

// settled counts a migration left in doubt once it is settled: "lost" and
// "diverged" are worth an alert.
func (m *metrics) settled(runtime, outcome string) {
	m.settles.WithLabelValues(runtime, outcome).Inc()
}

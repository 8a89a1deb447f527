package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/engine"
)

// The served metrics count migrations by mode, runtime and outcome, time
// the successful ones, and follow those in flight.
func TestMetrics(t *testing.T) {
	js := newJobs(t.TempDir())
	m := newMetrics(js)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { _ = m.serve(l) }()

	scrape := func() string {
		t.Helper()
		resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	end := func(req engine.Request, rep engine.Report) {
		j, _, _ := js.start(context.Background(), req)
		m.done(req, rep)
		_ = js.end(j, rep)
	}

	running, _, _ := js.start(context.Background(), engine.Request{Mode: "cold"})
	pulling, _, _ := js.start(context.Background(), engine.Request{Mode: "postcopy"})
	js.progress(pulling, engine.Progress{Phase: "lazy-pages", LazyPagesPending: 4096})
	if out := scrape(); !strings.Contains(out, "ferry_migrations_in_flight 2") || !strings.Contains(out, "ferry_lazy_pages_pending 4096") {
		t.Errorf("two migrations under way, one with 4096 pages to deliver; the gauges say otherwise:\n%s", out)
	}
	_ = js.end(running, engine.Report{})
	_ = js.end(pulling, engine.Report{})
	end(engine.Request{Mode: "precopy"}, engine.Report{Mode: "precopy", Runtime: "runc", OK: true, DowntimeMs: 250, TotalMs: 3000, BytesSent: 1000})
	end(engine.Request{Mode: "cold"}, engine.Report{Runtime: "podman", BytesSent: 10})
	end(engine.Request{Mode: "postcopy"}, engine.Report{Mode: "postcopy", Runtime: "runc", InDoubtID: "0123456789ab"})
	end(engine.Request{Mode: "hybrid"}, engine.Report{Mode: "hybrid", Runtime: "runc", SourceState: "lost"})

	out := scrape()
	for _, want := range []string{
		`ferry_migrations_total{mode="precopy",outcome="ok",runtime="runc"} 1`,
		`ferry_migrations_total{mode="cold",outcome="failed",runtime="podman"} 1`,
		`ferry_migrations_total{mode="postcopy",outcome="in_doubt",runtime="runc"} 1`,
		`ferry_migrations_total{mode="hybrid",outcome="lost",runtime="runc"} 1`,
		`ferry_migration_downtime_seconds_bucket{mode="precopy",le="0.3"} 1`,
		`ferry_migration_downtime_seconds_bucket{mode="precopy",le="0.2"} 0`,
		`ferry_migration_total_seconds_sum{mode="precopy"} 3`,
		`ferry_migration_bytes_sent_total{mode="precopy"} 1000`,
		`ferry_migrations_in_flight 0`,
		`ferry_lazy_pages_pending 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s in:\n%s", want, out)
		}
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-migrate/ferry/internal/experiment"
	"github.com/ferry-migrate/ferry/internal/report"
	"github.com/ferry-migrate/ferry/internal/report/reporttest"
)

// TestExperimentSmoke runs the shipped smallest experiment: Redis from
// Debian's packages under load, moved cold and with pre-copy. Both
// migrations work, the client's connection survives (no reconnects, no
// errors) and every write it was acknowledged is there afterwards; the
// results, the CSV and the report come out, and every figure of the
// report renders in a browser.
func TestExperimentSmoke(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	data, err := os.ReadFile("../../experiments/smoke.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := experiment.ParseSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	res, err := experiment.Execute(context.Background(), experiment.Options{Spec: spec, FerryBin: bin, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(spec.Grid()) * spec.Repeats; len(res.Runs) != want {
		t.Fatalf("%d runs, want %d", len(res.Runs), want)
	}
	for _, r := range res.Runs {
		c := r.Client
		switch {
		case !r.OK || !r.StateOK:
			t.Errorf("%s: ok=%v state_ok=%v %s", r.Mode, r.OK, r.StateOK, r.Error)
		case c == nil || c.Ops == 0 || len(c.Timeline) == 0:
			t.Errorf("%s: no client load measured: %+v", r.Mode, c)
		case c.Errors > 0 || c.Reconnects > 0:
			t.Errorf("%s: the client's connection did not survive: %d errors, %d reconnects", r.Mode, c.Errors, c.Reconnects)
		case r.ClientDowntimeMs <= 0 || r.ClientDowntimeMs > r.DowntimeMs+1000:
			t.Errorf("%s: client stall %.0f ms against a downtime of %.0f ms", r.Mode, r.ClientDowntimeMs, r.DowntimeMs)
		case len(r.Phases) == 0:
			t.Errorf("%s: no phases", r.Mode)
		}
		t.Logf("%s: downtime %.0f ms, client stall %.0f ms, total %.0f ms, %d ops; %s", r.Mode, r.DowntimeMs, r.ClientDowntimeMs, r.TotalMs, c.Ops, c.State)
	}

	dir := t.TempDir()
	var js, cs, html bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	back, err := experiment.ReadResults(&js)
	if err != nil || len(back.Runs) != len(res.Runs) {
		t.Fatalf("results do not read back: %v (%d runs)", err, len(back.Runs))
	}
	if err := res.WriteCSV(&cs); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&cs).ReadAll()
	if err != nil || len(rows) != len(res.Runs)+1 {
		t.Fatalf("CSV: %v, %d rows", err, len(rows))
	}
	if err := report.Write(&html, res); err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, html.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// Phases, downtime against state, bytes per round, client latency
	// and throughput: four at least for one workload without a profile.
	if n := reporttest.CheckInBrowser(t, page, filepath.Join(dir, "report.png")); n < 4 {
		t.Errorf("%d figures rendered, want at least 4", n)
	}
}

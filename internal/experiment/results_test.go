package experiment

import (
	"bytes"
	"encoding/csv"
	"math"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/model"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.xs); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

// A client's timeline is split at the migration's start and end, on the
// client's own clock.
func TestWindows(t *testing.T) {
	c := &labtool.LoadResult{StartUnixMs: 10_000, BucketMs: 100}
	for i := 0; i < 30; i++ {
		b := labtool.Bucket{TMs: float64(i * 100), Ops: 10, P99Ms: 1}
		if i >= 10 && i < 20 {
			b.Ops, b.P99Ms = 5, 300 // during: slower
		}
		c.Timeline = append(c.Timeline, b)
	}
	// The migration ran from 1.0 s to 2.0 s of the client's timeline.
	r := Run{StartUnixMs: 11_000, TotalMs: 1000, Client: c}
	w := r.Windows()
	if w[0].OpsPerSec != 100 || w[1].OpsPerSec != 50 || w[2].OpsPerSec != 100 {
		t.Errorf("ops per second before, during, after: %v, %v, %v", w[0].OpsPerSec, w[1].OpsPerSec, w[2].OpsPerSec)
	}
	if w[0].P99Ms != 1 || w[1].P99Ms != 300 || w[2].P99Ms != 1 {
		t.Errorf("p99 before, during, after: %v, %v, %v", w[0].P99Ms, w[1].P99Ms, w[2].P99Ms)
	}
	if (Run{}).Windows() != [3]Window{} {
		t.Error("a run without a client has windows")
	}
}

func TestCSV(t *testing.T) {
	res := Results{Runs: []Run{
		{Point: Point{Workload: "redis", Mode: "cold", StateBytes: 1 << 20, Load: 100}, OK: true, StateOK: true, DowntimeMs: 500,
			Client: &labtool.LoadResult{Ops: 7, BucketMs: 100}, Predicted: &Prediction{TotalMs: 900, DowntimeMs: 450}},
		{Point: Point{Workload: "memhog", Mode: "precopy"}, Error: "it failed, badly"},
	}}
	var b bytes.Buffer
	if err := res.WriteCSV(&b); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows", len(rows))
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, h := range rows[1:] {
		if len(h) != len(rows[0]) {
			t.Fatalf("row of %d fields under %d headers", len(h), len(rows[0]))
		}
	}
	if rows[1][col["client_ops"]] != "7" || rows[1][col["predicted_downtime_ms"]] != "450" || rows[1][col["downtime_ms"]] != "500" {
		t.Errorf("row 1: %v", rows[1])
	}
	if rows[2][col["client_ops"]] != "" || rows[2][col["error"]] != "it failed, badly" {
		t.Errorf("row 2: %v", rows[2])
	}
	var back bytes.Buffer
	if err := res.WriteJSON(&back); err != nil {
		t.Fatal(err)
	}
	got, err := ReadResults(strings.NewReader(back.String()))
	if err != nil || len(got.Runs) != 2 || got.Runs[0].Client.Ops != 7 {
		t.Errorf("JSON does not read back: %v %+v", err, got)
	}
}

// Each run is predicted in its own mode; a service's dirty rate is what
// its point's pre-copy rounds measured, shared by every mode of the point;
// a failed run gets none.
func TestPredict(t *testing.T) {
	p := model.DefaultProfile()
	svc := Point{Workload: "redis", Runtime: "runc", StateBytes: 64 << 20, Load: 200, BandwidthBps: 1e9}
	rounds := []engine.Round{{Index: 0, DirtyRate: 0}, {Index: 1, DirtyRate: 400}, {Index: 2, DirtyRate: 600}}
	at := func(mode string) Point { q := svc; q.Mode = mode; return q }
	res := Results{Runs: []Run{
		{Point: at("precopy"), OK: true, MemoryBytes: 100 << 20, Rounds: rounds},
		{Point: at("cold"), OK: true, MemoryBytes: 100 << 20},
		{Point: at("hybrid"), MemoryBytes: 100 << 20, Error: "failed"},
		{Point: Point{Workload: "memhog", Mode: "postcopy", StateBytes: 64 << 20, DirtyRate: 100, BandwidthBps: 1e9}, OK: true, MemoryBytes: 70 << 20},
	}}
	for i := range res.Runs {
		res.Runs[i] = res.Runs[i].settle()
	}
	if res.Runs[0].DirtyRateMeasured != 500 {
		t.Fatalf("measured dirty rate %v, want 500 (the median of the later rounds)", res.Runs[0].DirtyRateMeasured)
	}
	Predict(&res, p)
	in := model.Inputs{MemoryBytes: 100 << 20, DirtyRatePagesPerSec: 500, BandwidthBps: 1e9 / 8}
	preds, _, _, _ := model.Best(p, in, 0)
	for _, pr := range preds {
		if pr.Mode == "cold" {
			got := res.Runs[1].Predicted
			if got == nil || math.Abs(got.TotalMs-pr.TotalMs) > 1e-9 || got.ClientDowntimeMs != pr.DowntimeMs {
				t.Errorf("cold: predicted %+v, want the model's %+v at the measured rate", got, pr)
			}
		}
	}
	if res.Runs[0].Predicted == nil || res.Runs[3].Predicted == nil {
		t.Error("a run went without a prediction")
	}
	if res.Runs[2].Predicted != nil {
		t.Error("a failed run was predicted")
	}
}

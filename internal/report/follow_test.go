package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/follow"
	"github.com/ferry-migrate/ferry/internal/followlab"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/report/reporttest"
)

// followResults is a scenario of 30 s: the client near h1, then near h2,
// which the service reaches at 16 s.
func followResults() followlab.Results {
	start := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	r := followlab.Results{Spec: followlab.Spec{Name: "drive", Start: "h1", Hosts: 3, Follow: followlab.FollowSettings{Dwell: 3 * time.Second}},
		StartUnixMs: start.UnixMilli(), DurationMs: 30000,
		RTTs: []followlab.RTTPoint{{TMs: 0, RTT: map[string]float64{"h1": 5, "h2": 40, "h3": 80}}, {TMs: 10000, RTT: map[string]float64{"h1": 60, "h2": 5, "h3": 40}}},
		Events: []follow.Event{
			{Time: at(14000), Kind: "decision", Host: "h1", Verdict: &follow.Verdict{Fire: true, FarFor: 3 * time.Second}},
			{Time: at(14500), Kind: "migrate", Host: "h1", To: "h2", ID: "0123456789ab", Predicted: &follow.PredictedRun{Mode: "precopy", DowntimeMs: 100, TotalMs: 900}},
			{Time: at(16000), Kind: "moved", Host: "h2", To: "h2", ID: "0123456789ab", Report: &api.Report{OK: true, DowntimeMs: 90, TotalMs: 1500}},
		}}
	r.Client = labtool.LoadResult{StartUnixMs: start.UnixMilli(), BucketMs: 1000}
	for i := range 30 {
		p50 := 6.0
		if i >= 10 && i < 16 {
			p50 = 61
		}
		r.Client.Timeline = append(r.Client.Timeline, labtool.Bucket{TMs: float64(i * 1000), Ops: 50, P50Ms: p50})
	}
	r.Analyze()
	return r
}

func TestFollowReport(t *testing.T) {
	var page bytes.Buffer
	if err := WriteFollow(&page, followResults()); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	for _, want := range []string{`<figure id="follow"`, "<svg", "0123456789ab", "never moving", "h1", "h2"} {
		if !strings.Contains(html, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if testing.Short() {
		return
	}
	path := filepath.Join(t.TempDir(), "follow.html")
	if err := os.WriteFile(path, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(t.TempDir(), "follow.png")
	if p := os.Getenv("FERRY_FOLLOW_SHOT"); p != "" {
		shot = p
	}
	if n := reporttest.CheckInBrowser(t, path, shot); n != 1 {
		t.Errorf("the browser checked %d figures, want 1", n)
	}
}

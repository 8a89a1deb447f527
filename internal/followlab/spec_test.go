package followlab

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/follow"
	"github.com/ferry-migrate/ferry/internal/labtool"
)

func TestShippedScenarios(t *testing.T) {
	for _, f := range []string{"../../experiments/follow.yaml", "../../experiments/follow-boundary.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !IsFollow(b) {
			t.Errorf("%s: not recognised as a follow scenario", f)
		}
		if _, err := ParseSpec(b); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	grid, _ := os.ReadFile("../../experiments/smoke.yaml")
	if IsFollow(grid) {
		t.Error("a grid experiment taken for a follow scenario")
	}
}

func TestSpecErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"name: x\nkind: follow\nhosts: 1\nduration: 1s\nschedule: [{at: 0s, rtt: {h1: 1ms}}]\nfollow: {threshold: 30ms}", "hosts: 1"},
		{"name: x\nkind: follow\nhosts: 2\nduration: 1s\nschedule: [{at: 0s, rtt: {h1: 1ms}}]\nfollow: {threshold: 30ms}", "no round trip for h2"},
		{"name: x\nkind: follow\nhosts: 2\nduration: 1s\nschedule: [{at: 0s, rtt: {h1: 1ms, h2: 1ms, h7: 1ms}}]\nfollow: {threshold: 30ms}", "no host h7"},
		{"name: x\nkind: follow\nhosts: 2\nduration: 1s\nschedule: [{at: 0s, rtt: {h1: 1ms, h2: 1ms}}]\nfollow: {threshold: 0s}", "above zero"},
		{"name: x\nkind: follow\nhosts: 2\nduration: 1s\nschedule: [{at: 1s, rtt: {h1: 1ms, h2: 1ms}}]\nfollow: {threshold: 30ms}", "first step must be at 0s"},
		{"name: x\nkind: follow\nhosts: 2\nduration: 1s\nbogus: 1\nschedule: [{at: 0s, rtt: {h1: 1ms, h2: 1ms}}]\nfollow: {threshold: 30ms}", "bogus"},
	} {
		if _, err := ParseSpec([]byte(c.yaml)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
}

// A scenario's scores from its events: the client near h1 for 10 s, then
// near h2, which the service reaches at 13 s.
func TestAnalyze(t *testing.T) {
	start := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	r := Results{Spec: Spec{Start: "h1", Hosts: 2, Follow: FollowSettings{Dwell: 2 * time.Second}}, StartUnixMs: start.UnixMilli(), DurationMs: 20000,
		RTTs: []RTTPoint{{TMs: 0, RTT: map[string]float64{"h1": 5, "h2": 50}}, {TMs: 10000, RTT: map[string]float64{"h1": 50, "h2": 5}}},
		Events: []follow.Event{
			{Time: at(12000), Kind: "decision", Host: "h1", Verdict: &follow.Verdict{Fire: true, FarFor: 2 * time.Second}},
			{Time: at(12100), Kind: "migrate", Host: "h1", To: "h2", ID: "a", Predicted: &follow.PredictedRun{Mode: "precopy", DowntimeMs: 100, TotalMs: 800}},
			{Time: at(13000), Kind: "moved", Host: "h2", To: "h2", ID: "a", Report: &api.Report{OK: true, DowntimeMs: 80, TotalMs: 900}},
		},
		Client: labtool.LoadResult{BucketMs: 1000, Timeline: []labtool.Bucket{{Ops: 10, P50Ms: 6}, {Ops: 10, P50Ms: 8}}}}
	r.Analyze()
	if len(r.Served) != 2 || r.Served[0].Host != "h1" || r.Served[1].Host != "h2" || r.Served[1].FromMs != 13000 {
		t.Fatalf("served %+v", r.Served)
	}
	s := r.Scores
	// Following: 5 ms for 10 s, 50 ms for 3 s, 5 ms for 7 s: 11.75 ms.
	if d := s.MeanLatencyMs - 11.75; d > 0.01 || d < -0.01 {
		t.Errorf("mean %v, want 11.75", s.MeanLatencyMs)
	}
	if s.OracleMeanLatencyMs != 5 || s.StaticMeanLatencyMs != 27.5 {
		t.Errorf("oracle %v (want 5), static %v (want 27.5)", s.OracleMeanLatencyMs, s.StaticMeanLatencyMs)
	}
	m := r.Moves[0]
	if m.TriggerMs != 10000 || m.TriggerToRunningMs != 3000 || m.BoundMs != 2000+1.2*800 || m.DowntimeError != 0.25 {
		t.Errorf("move %+v", m)
	}
	if s.Moves != 1 || s.MovesOverBound != 1 || s.ClientP50Ms != 7 {
		t.Errorf("scores %+v", s)
	}
}

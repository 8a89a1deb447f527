package follow

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
)

// The thesis' worked example (Tables 7.2 and 7.3) as a service and an
// edge: the placement's cost for it must be the thesis' 1.64 €.
func thesisService() Service {
	return Service{Container: "svc", Host: "s", Latency: 60 * time.Millisecond,
		Workload: model.Inputs{MemoryBytes: 1e8, DirtyRatePagesPerSec: 10},
		Cores:    0.1, StateBytes: 1e7, Compression: 0.7}
}

func thesisEdge(name string) Candidate {
	return Candidate{Host: name, Latency: 10 * time.Millisecond, Cores: 12, BusyCores: 0.2 * 12,
		FreeMemory: 1.3e10, FreeStorage: 1e12, ThroughputBps: 3.2e8 * 8,
		Costs:    api.Costs{CPUEurPerCore: 40, CPUOffset: 0.1, MemEurPerByte: 4.3e-9, StorageEurPerByte: 9.39e-11, NetEurPerByte: 2.16e-12},
		SpeedBps: 1.13e11}
}

func thesisPlacer() Placer {
	return Placer{Trigger: cfg(), Profile: model.DefaultProfile(), SourceLoad: 0.2, SourceSpeedBps: 1.13e11}
}

func TestPlacementThesisExample(t *testing.T) {
	p := thesisPlacer().Place(thesisService(), []Candidate{thesisEdge("e1")})
	e, ok := p.Pick()
	if !ok || e.Host != "e1" {
		t.Fatalf("placement %+v: want e1", p)
	}
	if got := fmt.Sprintf("%.2f", e.Cost.Euro); got != "1.64" {
		t.Errorf("cost %v €, the thesis says 1.64 €", e.Cost.Euro)
	}
	if e.Prediction == nil || e.Mode == "" || !(e.Prediction.DowntimeMs > 0) {
		t.Errorf("no prediction of the move: %+v", e)
	}
}

func TestPlacementCheapestFeasible(t *testing.T) {
	cheap := thesisEdge("cheap-small")
	cheap.Costs.CPUEurPerCore = 10
	cheap.FreeMemory = 5e7 // 7.4: less than the service's 1e8
	dear := thesisEdge("dear")
	dear.Costs.CPUEurPerCore = 80
	mid := thesisEdge("mid")
	far := thesisEdge("far")
	far.Costs.CPUEurPerCore = 1
	far.Latency = 55 * time.Millisecond // not clearly better than 60 ms
	down := thesisEdge("down")
	down.Err = "dial tcp 10.77.0.9:7070: connection refused"
	p := thesisPlacer().Place(thesisService(), []Candidate{dear, cheap, far, mid, down})
	if p.Chosen != "mid" {
		t.Fatalf("chose %q (%s), want mid", p.Chosen, p.Reason)
	}
	if !strings.Contains(p.Reason, "next dear") {
		t.Errorf("reason %q does not name the runner-up", p.Reason)
	}
	want := map[string]string{"cheap-small": "7.4: needs", "far": "not clearly better", "down": "not reachable: dial tcp"}
	for _, e := range p.Candidates {
		if w, ok := want[e.Host]; ok {
			if e.Feasible() || !strings.Contains(strings.Join(e.Refused, "; "), w) {
				t.Errorf("%s: refused %q, want %q", e.Host, e.Refused, w)
			}
		} else if !e.Feasible() {
			t.Errorf("%s refused: %v", e.Host, e.Refused)
		}
	}
	// Order: feasible cheapest first, then the refused by name.
	var order []string
	for _, e := range p.Candidates {
		order = append(order, e.Host)
	}
	if got := strings.Join(order, ","); got != "mid,dear,cheap-small,down,far" {
		t.Errorf("order %s", got)
	}
}

func TestPlacementDowntimeBudget(t *testing.T) {
	svc := thesisService()
	svc.Workload.MemoryBytes = 256 << 20
	svc.Workload.DirtyRatePagesPerSec = 1000
	svc.MaxDowntime = time.Millisecond // nothing stops for less
	slow := thesisEdge("slow")
	slow.ThroughputBps = 100e6
	p := thesisPlacer().Place(svc, []Candidate{slow})
	if p.Chosen != "" || !strings.Contains(p.Reason, "no technique fits") {
		t.Fatalf("a 1 ms budget: chose %q (%s)", p.Chosen, p.Reason)
	}
	// A real budget: the pick's predicted downtime fits it.
	svc.MaxDowntime = 300 * time.Millisecond
	p = thesisPlacer().Place(svc, []Candidate{slow})
	e, ok := p.Pick()
	if !ok {
		t.Fatalf("a 300 ms budget: %s", p.Reason)
	}
	if e.Prediction.DowntimeMs > 300 {
		t.Errorf("%s predicted %.0f ms, over the 300 ms budget", e.Mode, e.Prediction.DowntimeMs)
	}
}

func TestPlacementTies(t *testing.T) {
	a, b := thesisEdge("a"), thesisEdge("b")
	b.Latency = 5 * time.Millisecond
	p := thesisPlacer().Place(thesisService(), []Candidate{a, b})
	if p.Chosen != "b" || !strings.Contains(p.Reason, "as cheap as a, chosen for its lower latency") {
		t.Errorf("chose %q: %s", p.Chosen, p.Reason)
	}
	// Equal in every respect: by name, and said so.
	p = thesisPlacer().Place(thesisService(), []Candidate{thesisEdge("z"), thesisEdge("y")})
	if p.Chosen != "y" || !strings.Contains(p.Reason, "its name") {
		t.Errorf("chose %q: %s", p.Chosen, p.Reason)
	}
}

func TestPlacementNoCandidates(t *testing.T) {
	if p := thesisPlacer().Place(thesisService(), nil); p.Chosen != "" || p.Reason == "" {
		t.Errorf("%+v", p)
	}
	c := thesisEdge("e")
	c.ThroughputBps = 0
	if p := thesisPlacer().Place(thesisService(), []Candidate{c}); p.Chosen != "" || !strings.Contains(p.Reason, "no throughput") {
		t.Errorf("%+v", p)
	}
}

// A client between two hosts that each answer at 30 ms ± 20 % for five
// minutes: the trigger fires now and then (half the samples are above the
// threshold), but neither host is ever clearly nearer than the other, so
// the service never moves.
func TestNoFlapOnBoundary(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { noFlap(t, seed) })
	}
}

func noFlap(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 2))
	noisy := func() time.Duration {
		return time.Duration(float64(30*time.Millisecond) * (0.8 + 0.4*r.Float64()))
	}
	pl := thesisPlacer()
	tr := NewTrigger(pl.Trigger, time.Time{})
	at, other := "h1", "h2"
	var fired, moves int
	for ms := 0; ms <= 300_000; ms += 200 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		v := tr.Observe(now, noisy())
		if !v.Fire {
			continue
		}
		fired++
		// The candidate measures its latency as the follow loop does: the
		// median of ProbeSamples probes.
		c := thesisEdge(other)
		var probes []time.Duration
		for range ProbeSamples {
			probes = append(probes, noisy())
		}
		c.Latency = Median(probes)
		svc := thesisService()
		svc.Host, svc.Latency = at, v.Latency
		if p := pl.Place(svc, []Candidate{c}); p.Chosen != "" {
			moves++
			at, other = other, at
			tr.Moved(now)
		} else {
			tr.Held(now)
		}
	}
	if fired == 0 {
		t.Fatal("the trigger never fired: the scenario does not test placement")
	}
	if moves != 0 {
		t.Errorf("%d moves in 5 minutes on a boundary (the trigger fired %d times)", moves, fired)
	}
}

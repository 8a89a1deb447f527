package follow

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
)

// fakeAgents plays three hosts' agents: where the container runs, each
// host's latency to its clients, their room, and the migrations asked
// for (by ID: asked again, the same one is followed).
type fakeAgents struct {
	mu       sync.Mutex
	at       string
	latency  map[string]float64 // ms, by host
	noRoom   map[string]bool
	started  map[string]int // migrations by ID: how many times each began
	reserved map[string]string
	// block, when set, holds a migration until ctx ends (the follower
	// killed meanwhile); the migration itself completes.
	block bool
	fail  bool
	// spread is the last ProbeSeconds a decision's assessment asked for.
	spread float64
}

func newFake() *fakeAgents {
	return &fakeAgents{at: "h1", latency: map[string]float64{"h1": 50, "h2": 10, "h3": 12},
		noRoom: map[string]bool{}, started: map[string]int{}, reserved: map[string]string{}}
}

func (f *fakeAgents) Assess(_ context.Context, h Host, q api.AssessQuery) (api.Assessment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.Name != f.at {
		return api.Assessment{}, fmt.Errorf("no container %q on %s", q.Container, h.Name)
	}
	if q.Workload {
		f.spread = q.ProbeSeconds
	}
	a := api.Assessment{Host: h.Name, Container: q.Container, Runtime: "runc", LatencyMs: f.latency[h.Name],
		MemoryBytes: 64 << 20, DirtyRate: 100, Cores: 0.1, Load: api.HostLoad{Cores: 2, BusyCores: 0.5}}
	for _, peer := range q.Candidates {
		name := strings.TrimSuffix(peer, ":7070")
		a.Candidates = append(a.Candidates, api.CandidateView{Addr: peer, Host: name, LatencyMs: f.latency[name],
			Load:  api.HostLoad{Cores: 2, BusyCores: 0.2, FreeMemory: 8 << 30, FreeStorage: 100 << 30},
			Costs: api.Costs{CPUEurPerCore: 40, MemEurPerByte: 4.3e-9}, ThroughputBps: 1e9})
	}
	return a, nil
}

func (f *fakeAgents) Reserve(_ context.Context, h Host, r api.Reservation) (api.ReserveReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Release {
		delete(f.reserved, r.ID)
		return api.ReserveReply{OK: true}, nil
	}
	if f.noRoom[h.Name] {
		return api.ReserveReply{Reason: "needs 67108864 bytes of memory, 0 free"}, nil
	}
	f.reserved[r.ID] = h.Name
	return api.ReserveReply{OK: true}, nil
}

func (f *fakeAgents) Migrate(ctx context.Context, h Host, req api.Request) (api.Report, error) {
	f.mu.Lock()
	to := strings.TrimSuffix(req.To, ":7070")
	f.started[req.ID]++
	first := f.started[req.ID] == 1
	if first && !f.fail {
		f.at = to // the migration itself runs to its end
	}
	block := f.block && first
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return api.Report{}, errors.Join(ctx.Err(), errors.New("the agent carries on with the migration"))
	}
	if f.fail {
		return api.Report{ID: req.ID, Container: req.Container, Mode: req.Mode, FailedAt: "restore", Error: "restore failed; resumed at the source"}, nil
	}
	return api.Report{ID: req.ID, Container: req.Container, Mode: req.Mode, From: h.Name, To: to, OK: true, DowntimeMs: 90, TotalMs: 900}, nil
}

func hosts() []Host {
	return []Host{{"h1", "h1:7070"}, {"h2", "h2:7070"}, {"h3", "h3:7070"}}
}

// clock is a test's time, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func loopConfig(t *testing.T, f *fakeAgents, c *clock, events *[]Event) Config {
	return Config{Container: "redis", Hosts: hosts(), At: "h1", Trigger: cfg(), Interval: time.Second,
		Profile: model.DefaultProfile(), MaxDowntime: 500 * time.Millisecond,
		Store: FileStore(filepath.Join(t.TempDir(), "follow.json")), Agents: f, Now: c.now,
		Events: func(e Event) { *events = append(*events, e) }}
}

func kinds(es []Event) string {
	var ks []string
	for _, e := range es {
		if e.Kind != "sample" {
			ks = append(ks, e.Kind)
		}
	}
	return strings.Join(ks, ",")
}

// run takes a sample a second for n seconds.
func run(t *testing.T, l *Loop, c *clock, n int) {
	t.Helper()
	for range n {
		if err := l.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		c.t = c.t.Add(time.Second)
	}
}

func TestLoopMovesToTheCheapestNearHost(t *testing.T) {
	f, c, events := newFake(), &clock{t0}, []Event{}
	l, err := New(loopConfig(t, f, c, &events))
	if err != nil {
		t.Fatal(err)
	}
	run(t, l, c, 12)
	if got := kinds(events); got != "decision,reserve,migrate,moved" {
		t.Fatalf("events %s", got)
	}
	// The candidates' probes spread over half the 10 s dwell.
	if f.spread != 5 {
		t.Errorf("candidates probed over %v s, want 5", f.spread)
	}
	st := l.State()
	if st.Host != "h2" || st.Moves != 1 || st.Pending != nil || f.at != "h2" {
		t.Errorf("state %+v, container at %s: want h2 (10 ms, as cheap as h3 at 12 ms)", st, f.at)
	}
	// Near now: no more moves, however long.
	run(t, l, c, 300)
	if l.State().Moves != 1 {
		t.Errorf("%d moves", l.State().Moves)
	}
}

func TestLoopRefusedTakesTheNext(t *testing.T) {
	f, c, events := newFake(), &clock{t0}, []Event{}
	f.noRoom["h2"] = true
	l, err := New(loopConfig(t, f, c, &events))
	if err != nil {
		t.Fatal(err)
	}
	run(t, l, c, 12)
	if l.State().Host != "h3" {
		t.Fatalf("at %s, want h3 (h2 has no room): %s", l.State().Host, kinds(events))
	}
	var refused bool
	for _, e := range events {
		if e.Kind == "reserve" && e.To == "h2" && strings.Contains(e.Message, "refused") {
			refused = true
		}
	}
	if !refused {
		t.Error("h2's refusal not reported")
	}
}

func TestLoopFailedMoveStays(t *testing.T) {
	f, c, events := newFake(), &clock{t0}, []Event{}
	f.fail = true
	l, err := New(loopConfig(t, f, c, &events))
	if err != nil {
		t.Fatal(err)
	}
	run(t, l, c, 12)
	if st := l.State(); st.Host != "h1" || st.Pending != nil || len(f.reserved) != 0 {
		t.Errorf("state %+v, reservations %v: a failed move stays on h1 and gives its room back", st, f.reserved)
	}
	if !strings.Contains(kinds(events), "failed") {
		t.Errorf("events %s", kinds(events))
	}
}

// The follower killed while its migration runs: the migration ends on
// its own, and a follower started again on the same state follows that
// migration by its ID (never a second one) and knows where the service is.
func TestLoopRestartMidMigration(t *testing.T) {
	f, c, events := newFake(), &clock{t0}, []Event{}
	f.block = true
	cfg := loopConfig(t, f, c, &events)
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, kill := context.WithCancel(context.Background())
	for range 10 {
		if err := l.Step(ctx); err != nil {
			t.Fatal(err)
		}
		c.t = c.t.Add(time.Second)
	}
	go func() { time.Sleep(50 * time.Millisecond); kill() }()
	if err := l.Step(ctx); err == nil {
		t.Fatal("the killed move reported no error")
	}
	if p := l.State().Pending; p == nil || p.To != "h2" {
		t.Fatalf("pending %+v", p)
	}

	again, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Run(canceled()); err != nil {
		t.Fatal(err)
	}
	st := again.State()
	if st.Host != "h2" || st.Pending != nil || st.Moves != 1 {
		t.Errorf("after the restart: %+v", st)
	}
	for id, n := range f.started {
		if n != 2 {
			t.Errorf("migration %s asked %d times, want 2 (the first, and the restart following it)", id, n)
		}
	}
	if len(f.started) != 1 {
		t.Errorf("%d migrations started, want 1", len(f.started))
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func TestLoopBadInput(t *testing.T) {
	f, c, events := newFake(), &clock{t0}, []Event{}
	good := loopConfig(t, f, c, &events)
	for name, change := range map[string]func(*Config){
		"no container":    func(c *Config) { c.Container = "" },
		"zero threshold":  func(c *Config) { c.Trigger.Threshold = 0 },
		"one host":        func(c *Config) { c.Hosts = c.Hosts[:1] },
		"unknown host":    func(c *Config) { c.At = "h9" },
		"twice":           func(c *Config) { c.Hosts = append(c.Hosts, Host{"h1", "x:1"}) },
		"no address":      func(c *Config) { c.Hosts[1].Peer = "" },
		"no interval":     func(c *Config) { c.Interval = 0 },
		"no state file":   func(c *Config) { c.Store = nil },
		"negative budget": func(c *Config) { c.MaxDowntime = -1 },
		"where is it":     func(c *Config) { c.At = "" },
	} {
		cfg := good
		cfg.Hosts = append([]Host(nil), good.Hosts...)
		change(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if len(f.started)+len(f.reserved) != 0 {
		t.Error("bad input reached an agent")
	}
}

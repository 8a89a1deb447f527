package follow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/google/renameio/v2"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Host is one agent the service may run on.
type Host struct {
	Name string `json:"name"`
	// Peer is its agent's peer address (HOST:PORT): what a migration to it
	// names, and what the service's host asks it on.
	Peer string `json:"peer"`
}

// Agents is what the loop asks of agents: api/client in ferry follow,
// fakes in tests.
type Agents interface {
	Assess(ctx context.Context, h Host, q api.AssessQuery) (api.Assessment, error)
	Reserve(ctx context.Context, h Host, r api.Reservation) (api.ReserveReply, error)
	// Migrate asks h for the migration req (under req.ID) and follows it
	// to its report; asked again with the same ID it follows the same
	// migration.
	Migrate(ctx context.Context, h Host, req api.Request) (api.Report, error)
}

// Config is one service followed after its clients.
type Config struct {
	Container string
	Runtime   string
	// Hosts are every host it may run on, At the one it runs on when the
	// loop first starts (its state file says where afterwards).
	Hosts []Host
	At    string
	// Ports are its listening ports whose connections are its clients;
	// Probe an address measured instead (see api.AssessQuery).
	Ports []int
	Probe string

	Trigger     TriggerConfig
	MaxDowntime time.Duration
	// Interval is the time between latency samples.
	Interval time.Duration
	// Profile predicts each move (the hosts' calibrated profile).
	Profile model.Profile
	// Store keeps where the service runs and a move under way, so a
	// restarted loop picks up (never a second migration of it): a
	// FileStore for ferry follow, a FollowPolicy's status in a cluster.
	Store  Store
	Agents Agents
	// Events hears every sample, decision and move (nil: none).
	Events func(Event)
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Faults are injected into each migration (tests; agents with
	// --allow-faults only).
	Faults []string
}

// Event is one thing the loop did or saw, for the CLI and its JSON.
type Event struct {
	Time time.Time `json:"time"`
	// Kind: sample, decision, reserve, migrate, moved, failed, resumed,
	// error.
	Kind      string   `json:"kind"`
	Host      string   `json:"host"`
	LatencyMs float64  `json:"latency_ms,omitempty"`
	Verdict   *Verdict `json:"verdict,omitempty"`
	// FarSince, on a decision, is when the latency went too far.
	FarSince  time.Time     `json:"far_since,omitzero"`
	Placement *Placement    `json:"placement,omitempty"`
	To        string        `json:"to,omitempty"`
	ID        string        `json:"id,omitempty"`
	Report    *api.Report   `json:"report,omitempty"`
	Predicted *PredictedRun `json:"predicted,omitempty"`
	Message   string        `json:"message,omitempty"`
}

// PredictedRun is the chosen move's prediction, next to which a moved
// event's report is measured.
type PredictedRun struct {
	Mode       string  `json:"mode"`
	DowntimeMs float64 `json:"downtime_ms"`
	TotalMs    float64 `json:"total_ms"`
}

// State is what the loop keeps on disk.
type State struct {
	Container string    `json:"container"`
	Host      string    `json:"host"`
	LastMove  time.Time `json:"last_move,omitzero"`
	Moves     int       `json:"moves"`
	// Pending is a migration asked for whose end the loop has not seen.
	Pending *Pending `json:"pending,omitempty"`
}

// Pending is a move under way.
type Pending struct {
	ID   string    `json:"id"`
	From string    `json:"from"`
	To   string    `json:"to"`
	Mode string    `json:"mode"`
	At   time.Time `json:"at"`
}

// Store keeps a loop's State across its restarts.
type Store interface {
	// Load is the state saved last; ok is false when none was.
	Load() (st State, ok bool, err error)
	Save(State) error
	// String names where, for messages.
	String() string
}

// FileStore keeps the state in a file, replaced whole on each save.
type FileStore string

// Load reads the file; a missing one is no state.
func (f FileStore) Load() (State, bool, error) {
	var st State
	b, err := os.ReadFile(string(f))
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, false, fmt.Errorf("state %s: %w", string(f), err)
	}
	return st, true, nil
}

func (f FileStore) String() string { return "state file " + string(f) }

// Save writes st atomically.
func (f FileStore) Save(st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return renameio.WriteFile(string(f), append(b, '\n'), 0o644)
}

// Check refuses a configuration before anything is asked of an agent.
func (c Config) Check() error {
	if c.Container == "" {
		return errors.New("no container named")
	}
	if err := c.Trigger.Check(); err != nil {
		return err
	}
	if len(c.Hosts) < 2 {
		return fmt.Errorf("%d hosts: following needs the service's host and at least one candidate", len(c.Hosts))
	}
	seen := map[string]bool{}
	for _, h := range c.Hosts {
		if h.Name == "" || h.Peer == "" {
			return fmt.Errorf("host %+v: a name and its agent's address are needed", h)
		}
		if seen[h.Name] {
			return fmt.Errorf("host %s named twice", h.Name)
		}
		seen[h.Name] = true
	}
	if c.At != "" && !seen[c.At] {
		return fmt.Errorf("the service's host %q is not among the hosts", c.At)
	}
	if c.Interval <= 0 {
		return fmt.Errorf("sample interval %v must be above zero", c.Interval)
	}
	if c.MaxDowntime < 0 {
		return fmt.Errorf("downtime budget %v must not be negative", c.MaxDowntime)
	}
	if c.Store == nil || c.Store == FileStore("") {
		return errors.New("no state file: a restarted follower would not know where the service is")
	}
	return nil
}

// Loop follows one service. Run it once; it is not safe for concurrent
// use.
type Loop struct {
	cfg   Config
	st    State
	trig  *Trigger
	place Placer
	// ahead is the candidates being weighed while the latency is too far
	// (nil: it is not).
	ahead *ahead
}

// New checks cfg and reads the state file (a service seen before) or
// starts one at cfg.At.
func New(cfg Config) (*Loop, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	l := &Loop{cfg: cfg, place: Placer{Trigger: cfg.Trigger, Profile: cfg.Profile}}
	st, ok, err := cfg.Store.Load()
	switch {
	case err != nil:
		return nil, err
	case ok:
		l.st = st
		if l.st.Container != cfg.Container {
			return nil, fmt.Errorf("%s follows %q, not %q: give each service its own state file", cfg.Store, l.st.Container, cfg.Container)
		}
		if _, ok := l.host(l.st.Host); !ok {
			return nil, fmt.Errorf("%s says %q runs on %s, which is not among the hosts", cfg.Store, cfg.Container, l.st.Host)
		}
	default:
		if cfg.At == "" {
			return nil, fmt.Errorf("where does %q run now? name its host (no state in %s yet)", cfg.Container, cfg.Store)
		}
		l.st = State{Container: cfg.Container, Host: cfg.At}
		if err := l.save(); err != nil {
			return nil, err
		}
	}
	l.trig = NewTrigger(cfg.Trigger, l.st.LastMove)
	return l, nil
}

// State is where the loop stands.
func (l *Loop) State() State { return l.st }

func (l *Loop) now() time.Time {
	if l.cfg.Now != nil {
		return l.cfg.Now()
	}
	return time.Now()
}

func (l *Loop) emit(e Event) {
	if l.cfg.Events == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	if e.Host == "" {
		e.Host = l.st.Host
	}
	l.cfg.Events(e)
}

func (l *Loop) host(name string) (Host, bool) {
	i := slices.IndexFunc(l.cfg.Hosts, func(h Host) bool { return h.Name == name })
	if i < 0 {
		return Host{}, false
	}
	return l.cfg.Hosts[i], true
}

func (l *Loop) save() error { return l.cfg.Store.Save(l.st) }

// Run samples until ctx ends: a move left pending by an earlier run is
// followed to its end first.
func (l *Loop) Run(ctx context.Context) error {
	if err := l.settle(ctx); err != nil {
		return err
	}
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		if err := l.Step(ctx); err != nil && ctx.Err() == nil {
			l.emit(Event{Kind: "error", Message: err.Error()})
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// settle follows a move an earlier run asked for: asked again under its
// ID, the source agent follows the same migration (running or ended)
// and never starts a second one, so the loop learns where the service
// is.
func (l *Loop) settle(ctx context.Context) error {
	p := l.st.Pending
	if p == nil {
		return nil
	}
	from, ok1 := l.host(p.From)
	to, ok2 := l.host(p.To)
	if !ok1 || !ok2 {
		return fmt.Errorf("a move of %q from %s to %s is pending, but those hosts are not all given", l.cfg.Container, p.From, p.To)
	}
	l.emit(Event{Kind: "resumed", ID: p.ID, To: p.To, Message: "following the move an earlier run asked for"})
	rep, err := l.cfg.Agents.Migrate(ctx, from, l.request(p.ID, to, p.Mode))
	if err != nil {
		return fmt.Errorf("the move %s of %q to %s is pending and its source cannot say what became of it: %w", p.ID, l.cfg.Container, p.To, err)
	}
	l.ended(p, rep, nil)
	return l.save()
}

// request is the migration a move asks for.
func (l *Loop) request(id string, to Host, mode string) api.Request {
	r := api.Request{ID: id, Container: l.cfg.Container, Runtime: l.cfg.Runtime, To: to.Peer, Mode: mode, Faults: l.cfg.Faults}
	r.Precopy.MaxDowntime = l.cfg.MaxDowntime
	return r
}

// Step takes one latency sample and, when the trigger fires, decides and
// moves.
func (l *Loop) Step(ctx context.Context) error {
	if l.st.Pending != nil {
		// A move whose end was not heard (its source was lost): nothing
		// else is decided until it is known where the service runs.
		if err := l.settle(ctx); err != nil {
			return err
		}
	}
	at, _ := l.host(l.st.Host)
	q := api.AssessQuery{Container: l.cfg.Container, Runtime: l.cfg.Runtime, Ports: l.cfg.Ports, Probe: l.cfg.Probe}
	a, err := l.cfg.Agents.Assess(ctx, at, q)
	if err != nil {
		return fmt.Errorf("asking %s about %q: %w", at.Name, l.cfg.Container, err)
	}
	now := l.now()
	lat := time.Duration(a.LatencyMs * float64(time.Millisecond))
	v := l.trig.Observe(now, lat)
	l.emit(Event{Time: now, Kind: "sample", LatencyMs: a.LatencyMs, Verdict: &v})
	if v.FarFor == 0 && !v.Fire {
		l.ahead = nil // near again: what was weighed is stale
		return nil
	}
	// Too far: weigh the candidates while the dwell runs, so that a
	// firing decides at once (measuring the service and the links to
	// every candidate takes seconds over far links).
	if l.ahead == nil || l.ahead.stale(now) {
		l.ahead = l.assessAhead(ctx, at)
	}
	if !v.Fire {
		return nil
	}
	return l.decide(ctx, at, v, now.Add(-v.FarFor))
}

// aheadFresh is how long ago an assessment may have ended when a
// decision uses it.
const aheadFresh = 5 * time.Second

// ahead is the candidates weighed ahead of a decision.
type ahead struct {
	started time.Time
	hosts   []Host // the candidates, in the order asked
	done    chan struct{}
	ended   time.Time // when the loop first saw it done
	a       api.Assessment
	err     error
}

// stale says the assessment ended too long ago to decide on.
func (a *ahead) stale(now time.Time) bool {
	select {
	case <-a.done:
		if a.ended.IsZero() {
			a.ended = now // first seen ended (by the loop's clock)
		}
		return now.Sub(a.ended) > aheadFresh
	default:
		return false
	}
}

// probeSpread is how long candidates spread their probes: half a dwell,
// so that a candidate's latency is a median over a stretch like the
// service's (one noisy moment must not make a host look nearer), and the
// links to the candidates are measured within the dwell's other half.
func (l *Loop) probeSpread() time.Duration {
	return min(max(l.cfg.Trigger.Dwell/2, 200*time.Millisecond), 20*time.Second)
}

// assessAhead asks the service's host to assess it and every candidate,
// in the background.
func (l *Loop) assessAhead(ctx context.Context, at Host) *ahead {
	q := api.AssessQuery{Container: l.cfg.Container, Runtime: l.cfg.Runtime, Ports: l.cfg.Ports, Probe: l.cfg.Probe, Workload: true,
		ProbeSeconds: l.probeSpread().Seconds()}
	ah := &ahead{started: l.now(), done: make(chan struct{})}
	for _, h := range l.cfg.Hosts {
		if h.Name != at.Name {
			ah.hosts = append(ah.hosts, h)
			q.Candidates = append(q.Candidates, h.Peer)
		}
	}
	go func() {
		defer close(ah.done)
		ah.a, ah.err = l.cfg.Agents.Assess(ctx, at, q)
	}()
	return ah
}

// decide weighs the candidates (as assessed ahead, or now) and moves to
// the first feasible one that reserves room for the service. farSince is
// when the latency went too far, for the record.
func (l *Loop) decide(ctx context.Context, at Host, v Verdict, farSince time.Time) error {
	ah := l.ahead
	l.ahead = nil
	if ah == nil || ah.stale(l.now()) {
		ah = l.assessAhead(ctx, at)
	}
	select {
	case <-ah.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	a, err, cands := ah.a, ah.err, ah.hosts
	if err != nil {
		l.trig.Held(l.now())
		return fmt.Errorf("asking %s about %q and its candidates: %w", at.Name, l.cfg.Container, err)
	}
	names := make([]string, len(cands))
	for i, h := range cands {
		names[i] = h.Name
	}
	svc, cs := FromAssessment(a, names, l.cfg.MaxDowntime)
	svc.Latency = v.Latency
	if a.ProbedLatencyMs > 0 {
		// Weighed against the candidates as they were measured: probes,
		// at the same time.
		svc.Latency = time.Duration(a.ProbedLatencyMs * float64(time.Millisecond))
	}
	l.place.SourceLoad = SourceLoad(a)
	p := l.place.Place(svc, cs)
	l.emit(Event{Kind: "decision", LatencyMs: units.Millis(v.Latency), Verdict: &v, FarSince: farSince, Placement: &p, Message: p.Reason})
	for _, e := range p.Candidates {
		if !e.Feasible() {
			break
		}
		to, _ := l.host(e.Host)
		id, err := newID()
		if err != nil {
			return err
		}
		r := api.Reservation{ID: id, Container: l.cfg.Container, MemoryBytes: a.MemoryBytes, Cores: a.Cores}
		reply, err := l.cfg.Agents.Reserve(ctx, to, r)
		if err == nil && !reply.OK {
			err = errors.New(reply.Reason)
		}
		if err != nil {
			l.emit(Event{Kind: "reserve", To: to.Name, ID: id, Message: fmt.Sprintf("%s refused: %v; trying the next candidate", to.Name, err)})
			continue
		}
		l.emit(Event{Kind: "reserve", To: to.Name, ID: id, Message: fmt.Sprintf("%s holds room for it", to.Name)})
		return l.move(ctx, at, to, id, e)
	}
	l.trig.Held(l.now())
	return nil
}

// move migrates the service to to under id, the move recorded as pending
// before it is asked for.
func (l *Loop) move(ctx context.Context, at, to Host, id string, e Evaluation) error {
	p := &Pending{ID: id, From: at.Name, To: to.Name, Mode: e.Mode, At: l.now()}
	l.st.Pending = p
	if err := l.save(); err != nil {
		_, _ = l.cfg.Agents.Reserve(ctx, to, api.Reservation{ID: id, Container: l.cfg.Container, Release: true})
		return err
	}
	pred := &PredictedRun{Mode: e.Mode, DowntimeMs: e.Prediction.DowntimeMs, TotalMs: e.Prediction.TotalMs}
	l.emit(Event{Kind: "migrate", To: to.Name, ID: id, Predicted: pred, Message: fmt.Sprintf("moving %q from %s to %s (%s)", l.cfg.Container, at.Name, to.Name, e.Mode)})
	rep, err := l.cfg.Agents.Migrate(ctx, at, l.request(id, to, e.Mode))
	if err != nil {
		// Lost the source meanwhile: the move stays pending, and the next
		// run (or ctx's end) settles it through the same ID.
		return fmt.Errorf("moving %q to %s (%s): %w", l.cfg.Container, to.Name, id, err)
	}
	l.ended(p, rep, pred)
	if !rep.OK {
		_, _ = l.cfg.Agents.Reserve(ctx, to, api.Reservation{ID: id, Container: l.cfg.Container, Release: true})
	}
	return l.save()
}

// ended records what became of the pending move p.
func (l *Loop) ended(p *Pending, rep api.Report, pred *PredictedRun) {
	l.st.Pending, l.ahead = nil, nil
	now := l.now()
	if rep.OK {
		l.st.Host, l.st.LastMove = p.To, now
		l.st.Moves++
		l.trig.Moved(now)
		l.emit(Event{Kind: "moved", To: p.To, ID: p.ID, Report: &rep, Predicted: pred,
			Message: fmt.Sprintf("%q runs on %s: down %.0f ms, %.0f ms in all", l.cfg.Container, p.To, rep.DowntimeMs, rep.TotalMs)})
		return
	}
	l.trig.Held(now)
	where := p.From
	if rep.InDoubtID != "" {
		where = "in doubt (its source settles it)"
	}
	l.emit(Event{Kind: "failed", To: p.To, ID: p.ID, Report: &rep, Predicted: pred,
		Message: fmt.Sprintf("the move to %s failed at %s: %s; %q stays on %s", p.To, rep.FailedAt, rep.Error, l.cfg.Container, where)})
}

// FromAssessment is the service and its candidates for placement, from
// its host's assessment: hosts names the candidates in the order their
// agents were asked (api.AssessQuery.Candidates).
func FromAssessment(a api.Assessment, hosts []string, maxDowntime time.Duration) (Service, []Candidate) {
	svc := Service{Container: a.Container, Host: a.Host, Latency: time.Duration(a.LatencyMs * float64(time.Millisecond)), Cores: a.Cores,
		StateBytes: float64(a.StateBytes), MaxDowntime: maxDowntime,
		Workload: model.Inputs{MemoryBytes: float64(a.MemoryBytes), DirtyRatePagesPerSec: a.DirtyRate,
			SharedBytes: float64(a.SharedBytes), NoLazyRestore: a.NoLazyRestore, CopiesImages: a.CopiesImages,
			RootfsBytes: float64(a.StateBytes), KeepsAddress: a.KeepsAddress}}
	cs := make([]Candidate, 0, len(hosts))
	for i, h := range hosts {
		c := Candidate{Host: h}
		if i >= len(a.Candidates) {
			c.Err = "no answer"
			cs = append(cs, c)
			continue
		}
		cv := a.Candidates[i]
		c.Err, c.Latency = cv.Error, time.Duration(cv.LatencyMs*float64(time.Millisecond))
		c.Cores, c.BusyCores = cv.Load.Cores, cv.Load.BusyCores+cv.Load.ReservedCores
		c.FreeMemory, c.FreeStorage = float64(cv.Load.FreeMemory), float64(cv.Load.FreeStorage)
		c.Costs, c.ThroughputBps, c.RTT = cv.Costs, cv.ThroughputBps, time.Duration(cv.RTTMs*float64(time.Millisecond))
		if cv.Host != "" && cv.Host != h {
			c.Err = fmt.Sprintf("the agent at %s is %s, not %s", cv.Addr, cv.Host, h)
		}
		cs = append(cs, c)
	}
	return svc, cs
}

// SourceLoad is the share of the service's host's CPUs in use.
func SourceLoad(a api.Assessment) float64 {
	if a.Load.Cores <= 0 {
		return 0
	}
	return min(1, a.Load.BusyCores/a.Load.Cores)
}

// newID is a migration ID of the caller's (12 lowercase hex digits).
func newID() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

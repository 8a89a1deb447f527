package drain

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/engine"
)

// fakeHost lists containers (of sizes in MiB) and migrates them slowly,
// counting how many run at once.
type fakeHost struct {
	list []engine.ContainerStatus
	fail map[string]bool
	// phases are told as progress, 20 ms apart, before each migration ends.
	phases              []string
	mu                  sync.Mutex
	started             []string
	lines               map[engine.LineSpec]int // requests in each
	running, mostAtOnce atomic.Int32
	// setting up counts those in a setup phase; mostSettingUp at once.
	settingUp, mostSettingUp atomic.Int32
}

func most(m *atomic.Int32, n int32) {
	for {
		old := m.Load()
		if n <= old || m.CompareAndSwap(old, n) {
			return
		}
	}
}

func (h *fakeHost) options(o Options) Options {
	o.status = func(context.Context, client.Endpoint) (engine.Status, error) {
		return engine.Status{Host: "h1", Containers: h.list}, nil
	}
	o.migrate = func(ctx context.Context, _ client.Endpoint, req engine.Request, progress func(engine.Progress)) (engine.Report, error) {
		most(&h.mostAtOnce, h.running.Add(1))
		defer h.running.Add(-1)
		h.mu.Lock()
		h.started = append(h.started, req.Container)
		if req.Line != nil {
			if h.lines == nil {
				h.lines = map[engine.LineSpec]int{}
			}
			h.lines[*req.Line]++
		}
		h.mu.Unlock()
		inSetup := false
		for _, p := range h.phases {
			if setup := slices.Contains(setupPhases, p); setup != inSetup {
				inSetup = setup
				if setup {
					most(&h.mostSettingUp, h.settingUp.Add(1))
				} else {
					h.settingUp.Add(-1)
				}
			}
			progress(engine.Progress{Phase: p})
			time.Sleep(20 * time.Millisecond)
		}
		if inSetup {
			h.settingUp.Add(-1)
		}
		time.Sleep(20 * time.Millisecond)
		if h.fail[req.Container] {
			return engine.Report{Container: req.Container, Error: "restore failed"}, nil
		}
		return engine.Report{Container: req.Container, OK: true, To: req.To, Mode: req.Mode}, nil
	}
	return o
}

func hostOf(sizes map[string]int) *fakeHost {
	h := &fakeHost{fail: map[string]bool{}}
	for n, mib := range sizes {
		h.list = append(h.list, engine.ContainerStatus{Name: n, Status: "running", Pid: 100 + len(h.list), ResidentBytes: int64(mib) << 20})
	}
	h.list = append(h.list, engine.ContainerStatus{Name: "stopped-one", Status: "stopped", Pid: 1})
	return h
}

// Every running container moves, smallest first, never more at once than
// asked and one waiting in the drain's line (at the source agent, not
// here); a stopped one stays.
func TestDrainAllSmallestFirst(t *testing.T) {
	h := hostOf(map[string]int{"big": 900, "small": 10, "mid": 300, "tiny": 1, "huge": 4000})
	h.phases = []string{"prepare", "rootfs-sync", "queued", "round-0", "round-1", "round-2"}
	res, err := Run(context.Background(), h.options(Options{To: "h2", Concurrency: 2, Request: engine.Request{Mode: engine.ModePrecopy}}))
	if err != nil || !res.OK {
		t.Fatalf("drain: %v %+v", err, res)
	}
	want := []string{"tiny", "small", "mid", "big", "huge"}
	var got []string
	for _, r := range res.Reports {
		got = append(got, r.Container)
		if r.To != "h2" || r.Mode != engine.ModePrecopy {
			t.Errorf("%s moved with %+v", r.Container, r)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reports in order %v, want %v", got, want)
	}
	// The first three start together: in any order.
	if first := map[string]bool{h.started[0]: true, h.started[1]: true, h.started[2]: true}; !first["tiny"] || !first["small"] || !first["mid"] {
		t.Errorf("started %v: the three smallest first", h.started)
	}
	if m := h.mostAtOnce.Load(); m != 3 {
		t.Errorf("%d migrations at once, want 3 (two crossing, one in line)", m)
	}
	if m := h.mostSettingUp.Load(); m != 1 {
		t.Errorf("%d migrations set up at once, want one after the other", m)
	}
	if len(h.lines) != 1 {
		t.Fatalf("the migrations' lines: %v, want one", h.lines)
	}
	for l, n := range h.lines {
		if l.Width != 2 || l.Name == "" || n != 5 {
			t.Errorf("line %+v for %d migrations, want one of width 2 for all 5", l, n)
		}
	}
}

// A failure leaves the others going; the result says not ok. Named
// containers only, the unlisted one (another runtime's) last.
func TestDrainNamedAndAFailure(t *testing.T) {
	h := hostOf(map[string]int{"a": 5, "b": 50, "c": 500})
	h.fail["b"] = true
	res, err := Run(context.Background(), h.options(Options{To: "h2", Containers: []string{"podman-web", "c", "b"}, Concurrency: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if res.OK {
		t.Error("a failed migration, yet the drain says ok")
	}
	var order []string
	for _, r := range res.Reports {
		order = append(order, r.Container)
	}
	if !reflect.DeepEqual(order, []string{"b", "c", "podman-web"}) || len(res.StartMs) != 3 || !(res.StartMs[0] <= res.StartMs[2]) {
		t.Errorf("reports %v, started at %v ms", order, res.StartMs)
	}
}

// A handoff it does not know stops the drain before anything moves; the
// one it knows reaches every migration's line.
func TestDrainHandoff(t *testing.T) {
	h := hostOf(map[string]int{"a": 1, "b": 2})
	if _, err := Run(context.Background(), h.options(Options{To: "h2", Handoff: "restore"})); err == nil || len(h.started) != 0 {
		t.Fatalf("handoff restore: %v, started %v", err, h.started)
	}
	if _, err := Run(context.Background(), h.options(Options{To: "h2", Handoff: engine.HandoffFreeze})); err != nil {
		t.Fatal(err)
	}
	for l := range h.lines {
		if l.Handoff != engine.HandoffFreeze {
			t.Errorf("line %+v", l)
		}
	}
	h = hostOf(map[string]int{"a": 1})
	if _, err := Run(context.Background(), h.options(Options{To: "h2"})); err != nil {
		t.Fatal(err)
	}
	for l := range h.lines {
		if l.Handoff != engine.HandoffCommit {
			t.Errorf("default line %+v, want a handoff at the commit", l)
		}
	}
}

// Nothing running: nothing to do, and no error.
func TestDrainNothing(t *testing.T) {
	h := hostOf(nil)
	res, err := Run(context.Background(), h.options(Options{To: "h2"}))
	if err != nil || !res.OK || len(res.Reports) != 0 {
		t.Fatalf("%+v %v", res, err)
	}
}

// A source agent that cannot list its containers stops the drain before
// anything moves.
func TestDrainCannotList(t *testing.T) {
	o := Options{To: "h2"}
	o.status = func(context.Context, client.Endpoint) (engine.Status, error) {
		return engine.Status{}, errors.New("connection refused")
	}
	o.migrate = func(context.Context, client.Endpoint, engine.Request, func(engine.Progress)) (engine.Report, error) {
		t.Fatal("migrated without a list")
		return engine.Report{}, nil
	}
	if _, err := Run(context.Background(), o); err == nil {
		t.Fatal("no error")
	}
}

// A migration makes way for the next once it commits (besides the one
// waiting in line); post-copy, whose memory crosses after its commit, and
// a mode auto has yet to choose do not until they end. The progress may
// skip a short phase.
func TestDrainMakesWayOnceCommitted(t *testing.T) {
	for _, c := range []struct {
		mode     string
		phases   []string
		makesWay bool
	}{
		{engine.ModePrecopy, []string{"prepare", "rootfs-sync", "round-0", "round-1", "dump", "images", "restore", "commit", "cleanup"}, true},
		{engine.ModeHybrid, []string{"prepare", "round-0", "freeze", "dump", "restore", "lazy-pages", "cleanup"}, true},
		{engine.ModeCold, []string{"prepare", "rootfs-sync", "freeze", "dump", "images", "restore", "commit", "cleanup"}, true},
		{engine.ModePrecopy, []string{"prepare", "rootfs-sync", "round-0", "freeze", "dump", "restore"}, false}, // never committed
		{engine.ModePostcopy, []string{"prepare", "rootfs-sync", "freeze", "dump", "restore", "commit", "lazy-pages", "cleanup"}, false},
		{engine.ModeAuto, []string{"measure", "prepare", "freeze", "dump", "restore", "commit", "lazy-pages", "cleanup"}, false},
	} {
		h := hostOf(map[string]int{"a": 1, "b": 2, "c": 3})
		h.phases = c.phases
		res, err := Run(context.Background(), h.options(Options{To: "h2", Concurrency: 1, Request: engine.Request{Mode: c.mode}}))
		if err != nil || !res.OK {
			t.Fatalf("%s: %v %+v", c.mode, err, res)
		}
		if m := h.mostAtOnce.Load(); (m > 2) != c.makesWay {
			t.Errorf("%s, phases %v: %d at once with a concurrency of 1", c.mode, c.phases, m)
		}
	}
}

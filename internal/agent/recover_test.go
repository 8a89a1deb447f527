package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/procs/procstest"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// fakeRuntime keeps container states in a map; recovery's logic only.
type fakeRuntime struct {
	state     map[string]string
	pid       map[string]int // a container's init, where a test gives one
	removed   []string
	stopped   bool // restores stopped until Start (as runc does here)
	continued []string
}

func (f *fakeRuntime) Continue(_ context.Context, c *runtime.Container) error {
	f.continued = append(f.continued, c.Name)
	return nil
}

func (f *fakeRuntime) List(context.Context) ([]runtime.Container, error) { return nil, nil }
func (f *fakeRuntime) Kind() string                                      { return "fake" }
func (f *fakeRuntime) Caps() runtime.Caps {
	return runtime.Caps{Freeze: true, RestoreStopped: f.stopped}
}
func (f *fakeRuntime) Inspect(_ context.Context, name string) (*runtime.Container, error) {
	st, ok := f.state[name]
	if !ok {
		return nil, runtime.ErrNotFound
	}
	return &runtime.Container{Name: name, ID: name, Status: st, PID: f.pid[name]}, nil
}
func (f *fakeRuntime) Freeze(_ context.Context, c *runtime.Container) error {
	f.state[c.Name] = "paused"
	return nil
}
func (f *fakeRuntime) Thaw(_ context.Context, c *runtime.Container) error {
	if f.state[c.Name] == "stopped" {
		return errors.New("container not paused") // its processes are gone
	}
	f.state[c.Name] = "running"
	return nil
}
func (f *fakeRuntime) Checkpoint(context.Context, *runtime.Container, runtime.CheckpointOptions) (runtime.Dump, error) {
	panic("not in recovery")
}
func (f *fakeRuntime) Remove(_ context.Context, c *runtime.Container) error {
	delete(f.state, c.Name)
	f.removed = append(f.removed, c.Name)
	return nil
}
func (f *fakeRuntime) Prepare(context.Context, *runtime.Container, runtime.PrepareOptions) (runtime.Target, error) {
	panic("not in recovery")
}

func testAgent(t *testing.T) (*Agent, *fakeRuntime) {
	t.Helper()
	j, err := journal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{state: map[string]string{}}
	a := &Agent{journal: j, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		runtimeSet: func(runtime.RequestOptions) (runtime.Set, error) { return runtime.Set{"fake": rt}, nil }}
	a.jobs = newJobs(t.TempDir())
	a.metrics = newMetrics(a.jobs)
	return a, rt
}

// What settles later reaches the migration's report (ferry ps --all, ferry
// wait) and the metrics, also for a migration whose agent died under it
// and so kept no report.
func TestSettledOutcomeReachesTheJob(t *testing.T) {
	a, _ := testAgent(t)
	rep := engine.Report{Container: "web", Mode: "cold", FailedAt: "restore on h2", SourceState: "frozen", InDoubtID: "abc123abc123"}
	if err := a.jobs.keep(engine.Job{ID: "abc123abc123", Container: "web", Report: &rep}); err != nil {
		t.Fatal(err)
	}
	a.recordSettled(journal.Entry{ID: "abc123abc123", Container: "web", Runtime: "fake"}, journal.Removed, nil)
	a.recordSettled(journal.Entry{ID: "def456def456", Container: "db", Runtime: "fake", Peer: "h2:7070"}, journal.Lost, nil)
	js, err := a.jobs.list(true)
	if err != nil || len(js) != 2 {
		t.Fatalf("jobs %+v %v", js, err)
	}
	for _, j := range js {
		r := j.Report
		switch j.ID {
		case "abc123abc123":
			if !r.OK || r.SourceState != journal.Removed || r.Settled == "" || r.Mode != "cold" {
				t.Errorf("settled report %+v", r)
			}
		case "def456def456":
			if r.OK || r.SourceState != journal.Lost || r.Settled == "" || j.To != "h2:7070" {
				t.Errorf("report made at settling %+v", j)
			}
		}
	}
	if n := testutil.ToFloat64(a.metrics.settles.WithLabelValues("fake", journal.Lost)); n != 1 {
		t.Errorf("settled lost counted %v times", n)
	}
}

func TestRecoverDestinationSettlesUncommittedCopies(t *testing.T) {
	a, rt := testAgent(t)
	// a: restored, then died; k: restored and ran on; b: committed.
	rt.state["a"], rt.state["k"], rt.state["b"] = "stopped", "running", "running"
	for _, e := range []journal.Entry{
		{ID: "a1", Role: journal.Destination, Container: "a", Runtime: "fake", State: journal.Restoring},
		{ID: "a2", Role: journal.Destination, Container: "k", Runtime: "fake", State: journal.Restoring},
		{ID: "b1", Role: journal.Destination, Container: "b", Runtime: "fake", State: journal.Committed},
		{ID: "c1", Role: journal.Source, Container: "c", Runtime: "fake", State: journal.Frozen},
	} {
		if err := a.journal.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	a.recoverDestination(context.Background())
	if len(rt.removed) != 1 || rt.removed[0] != "a" || rt.state["b"] != "running" || rt.state["k"] != "running" {
		t.Errorf("removed %v, states %v: only the copy that no longer runs goes", rt.removed, rt.state)
	}
	if e, _, _ := a.journal.Get("a1"); e.State != journal.Dropped {
		t.Errorf("a1 is %s", e.State)
	}
	if e, _, _ := a.journal.Get("a2"); e.State != journal.Committed {
		t.Errorf("a copy that ran on is %s, want committed (its source removes its own)", e.State)
	}
	if e, _, _ := a.journal.Get("c1"); e.State != journal.Frozen {
		t.Errorf("a source entry was touched: %s", e.State)
	}
}

func TestSettleFollowsTheDestination(t *testing.T) {
	for _, c := range []struct {
		answer, wantState, wantJournal string
		done                           bool
		died                           bool // the source copy's processes are gone
		dying                          bool // its runtime says running, its init is a zombie
		thawed                         bool // someone resumed the frozen copy by hand
		removed                        bool // someone removed it by hand
	}{
		{answer: journal.Committed, wantState: "absent", wantJournal: journal.Removed, done: true},
		{answer: journal.Dropped, wantState: "running", wantJournal: journal.Resumed, done: true},
		{answer: "unknown", wantState: "running", wantJournal: journal.Resumed, done: true},
		{answer: journal.Restoring, wantState: "paused", wantJournal: journal.InDoubt}, // still deciding: ask again
		// Nothing to resume, and no copy elsewhere: lost, not retried.
		{answer: journal.Dropped, wantState: "stopped", wantJournal: journal.Lost, done: true, died: true},
		{answer: journal.Dropped, wantState: "running", wantJournal: journal.Lost, done: true, dying: true},
		{answer: journal.Dropped, wantState: "absent", wantJournal: journal.Lost, done: true, removed: true},
		// Resumed by hand while the destination committed: it ran twice,
		// and the copy with the writes it took since is not deleted.
		{answer: journal.Committed, wantState: "running", wantJournal: journal.Diverged, done: true, thawed: true},
		// Already gone: removed, not retried forever.
		{answer: journal.Committed, wantState: "absent", wantJournal: journal.Removed, done: true, removed: true},
	} {
		name := c.answer + map[bool]string{true: "-died"}[c.died] + map[bool]string{true: "-dying"}[c.dying] +
			map[bool]string{true: "-thawed"}[c.thawed] + map[bool]string{true: "-removed"}[c.removed]
		t.Run(name, func(t *testing.T) {
			a, rt := testAgent(t)
			rt.state["web"] = "paused"
			if c.died {
				rt.state["web"] = "stopped"
			}
			if c.thawed {
				rt.state["web"] = "running"
			}
			if c.removed {
				delete(rt.state, "web")
			}
			if c.dying {
				rt.pid = map[string]int{"web": procstest.Zombie(t)}
			}
			e := journal.Entry{ID: "abc123abc123", Role: journal.Source, Container: "web", Runtime: "fake", State: journal.InDoubt}
			if err := a.journal.Record(e); err != nil {
				t.Fatal(err)
			}
			final, err := a.settle(context.Background(), e, c.answer)
			if err != nil || (final != "") != c.done {
				t.Fatalf("settle: final=%q err=%v", final, err)
			}
			st, ok := rt.state["web"]
			if !ok {
				st = "absent"
			}
			if st != c.wantState {
				t.Errorf("container %s, want %s", st, c.wantState)
			}
			if got, _, _ := a.journal.Get("abc123abc123"); got.State != c.wantJournal {
				t.Errorf("journal %s, want %s", got.State, c.wantJournal)
			}
		})
	}
}

// With a runtime that restores stopped, an uncommitted copy never ran:
// it goes even though its runtime lists it as running; a committed one
// is started (the agent may have died before it could).
func TestRecoverDestinationWithStoppedRestores(t *testing.T) {
	a, rt := testAgent(t)
	rt.stopped = true
	rt.state["u"], rt.state["c"] = "running", "running"
	for _, e := range []journal.Entry{
		{ID: "a1", Role: journal.Destination, Container: "u", Runtime: "fake", State: journal.Restoring},
		{ID: "a2", Role: journal.Destination, Container: "c", Runtime: "fake", State: journal.Committed},
		{ID: "a3", Role: journal.Destination, Container: "s", Runtime: "fake", State: journal.Started},
	} {
		if err := a.journal.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	a.recoverDestination(context.Background())
	if len(rt.removed) != 1 || rt.removed[0] != "u" {
		t.Errorf("removed %v, want the uncommitted copy only", rt.removed)
	}
	if len(rt.continued) != 1 || rt.continued[0] != "c" {
		t.Errorf("continued %v, want the committed copy only", rt.continued)
	}
	for id, want := range map[string]string{"a1": journal.Dropped, "a2": journal.Started, "a3": journal.Started} {
		if e, _, _ := a.journal.Get(id); e.State != want {
			t.Errorf("%s is %s, want %s", id, e.State, want)
		}
	}
}

// A restarted agent removes the scratch its killed predecessor left, and
// nothing else there; its CRIU rescue directory is its own (made again if
// gone).
func TestClearScratch(t *testing.T) {
	a, _ := testAgent(t)
	a.Host.ScratchDir = t.TempDir()
	for _, d := range []string{"0123456789ab", "mine", "0123456789AB"} {
		if err := os.MkdirAll(filepath.Join(a.Host.ScratchDir, d, "images"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(a.Host.ScratchDir, "abcdefabcdef"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a.clearScratch()
	var left []string
	ents, _ := os.ReadDir(a.Host.ScratchDir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{"0123456789AB", "abcdefabcdef", "criu-rescue", "mine"}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
}

// A post-copy copy whose memory was still arriving when the agent died
// cannot go on (its pages came through the dead agent): it goes, running
// or not, and its source, asking, hears "dropped" and resumes its own. A
// source asking meanwhile hears "pulling" and waits.
func TestRecoverDestinationDropsAnUnfinishedPull(t *testing.T) {
	a, rt := testAgent(t)
	a.dst = &engine.Destination{}
	rt.state["p"] = "running"
	rt.state["q"] = "running"
	// a3's lazy-pages daemon is gone (no process has pid -1): its directory,
	// which clearScratch spares for a pull, goes with it.
	dir := filepath.Join(t.TempDir(), "a3")
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, e := range []journal.Entry{
		{ID: "a1", Role: journal.Destination, Container: "p", Runtime: "fake", State: journal.Pulling},
		{ID: "a2", Role: journal.Destination, Container: "gone", Runtime: "fake", State: journal.Pulling},
		{ID: "a3", Role: journal.Destination, Container: "q", Runtime: "fake", State: journal.Pulling, Pull: &journal.Pull{Daemon: -1, Dir: dir}},
	} {
		if err := a.journal.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	a.recoverDestination(context.Background())
	if _, ok := rt.state["p"]; ok {
		t.Errorf("the unfinished copy still runs: %v", rt.state)
	}
	if _, ok := rt.state["q"]; ok {
		t.Errorf("the copy whose daemon is gone still runs: %v", rt.state)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the dropped pull's directory stays: %v", err)
	}
	for _, id := range []string{"a1", "a2", "a3"} {
		if e, _, _ := a.journal.Get(id); e.State != journal.Dropped {
			t.Errorf("%s is %s, want dropped", id, e.State)
		}
	}
	// While it pulls, a source must not take "pulling" for an answer.
	rt.state["web"] = "paused"
	e := journal.Entry{ID: "abc123abc123", Role: journal.Source, Container: "web", Runtime: "fake", State: journal.InDoubt}
	if err := a.journal.Record(e); err != nil {
		t.Fatal(err)
	}
	if final, err := a.settle(context.Background(), e, journal.Pulling); final != "" || err != nil || rt.state["web"] != "paused" {
		t.Errorf("settle(pulling): final=%q err=%v state %s", final, err, rt.state["web"])
	}
}

// A container prepared for a migration that never reached its restore (the
// agent died during the transfer) goes when the agent starts again; one
// that a dropped migration already removed stays gone.
func TestRecoverDestinationRemovesPreparedContainers(t *testing.T) {
	a, rt := testAgent(t)
	rt.state["p"] = "stopped" // made by the runtime, never run
	for _, e := range []journal.Entry{
		{ID: "aaaaaaaaaaa1", Role: journal.Destination, Container: "p", Runtime: "fake", State: journal.Prepared},
		{ID: "aaaaaaaaaaa2", Role: journal.Destination, Container: "gone", Runtime: "fake", State: journal.Prepared},
		{ID: "aaaaaaaaaaa3", Role: journal.Destination, Container: "d", Runtime: "fake", State: journal.Dropped},
	} {
		if err := a.journal.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	a.recoverDestination(context.Background())
	if _, ok := rt.state["p"]; ok || !slices.Contains(rt.removed, "p") || slices.Contains(rt.removed, "d") {
		t.Errorf("removed %v, states %v: the prepared containers go, nothing else", rt.removed, rt.state)
	}
	for _, id := range []string{"aaaaaaaaaaa1", "aaaaaaaaaaa2"} {
		if e, _, _ := a.journal.Get(id); e.State != journal.Dropped {
			t.Errorf("%s is %s, want dropped", id, e.State)
		}
	}
	if pend, _ := a.journal.Pending(); len(pend) != 0 {
		t.Errorf("entries left pending: %+v", pend)
	}
}

// A pull that ended whole as the agent died (its relay recorded the
// daemon's close answered) leaves a complete, committed copy: it runs, the
// journal says started (its source, in doubt, then removes its own), and
// its scratch directory goes.
func TestRecoverDestinationKeepsAPullThatEnded(t *testing.T) {
	a, rt := testAgent(t)
	a.dst = &engine.Destination{}
	rt.stopped = true
	rt.state["w"] = "paused"
	dir := filepath.Join(t.TempDir(), "abc1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lazy-relay.done"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e := journal.Entry{ID: "abc1", Role: journal.Destination, Container: "w", Runtime: "fake", State: journal.Pulling, Pull: &journal.Pull{Daemon: -1, Dir: dir}}
	if err := a.journal.Record(e); err != nil {
		t.Fatal(err)
	}
	a.recoverDestination(context.Background())
	if !slices.Equal(rt.continued, []string{"w"}) || len(rt.removed) > 0 {
		t.Errorf("continued %v, removed %v: want the copy continued, nothing removed", rt.continued, rt.removed)
	}
	if got, _, _ := a.journal.Get("abc1"); got.State != journal.Started {
		t.Errorf("journal says %s, want started", got.State)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the ended pull's directory stays: %v", err)
	}
}

// A pre-copy whose agent died during its rounds never froze the
// container: it is recorded resumed at once, never asked about.
func TestResolveSourcesEndsCopying(t *testing.T) {
	a, rt := testAgent(t)
	rt.state["web"] = "running"
	if err := a.journal.Record(journal.Entry{ID: "abc123abc123", Role: journal.Source, Container: "web", Runtime: "fake", State: journal.Copying}); err != nil {
		t.Fatal(err)
	}
	a.resolveSources(context.Background())
	if e, _, _ := a.journal.Get("abc123abc123"); e.State != journal.Resumed {
		t.Errorf("journal says %s, want resumed", e.State)
	}
	if rt.state["web"] != "running" || len(rt.removed) > 0 {
		t.Errorf("the container was touched: %v removed %v", rt.state, rt.removed)
	}
}

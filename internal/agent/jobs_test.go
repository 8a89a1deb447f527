package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/engine"
)

// A job runs, shows its progress, ends, and is found on disk afterwards,
// by list and wait, across a new registry (an agent restart).
func TestJobsLifecycle(t *testing.T) {
	dir := t.TempDir()
	js := newJobs(dir)
	j, ctx, _ := js.start(context.Background(), engine.Request{Container: "web", To: "h2", Mode: engine.ModePrecopy})
	if !engine.ValidID(j.info.ID) {
		t.Fatalf("job ID %q", j.info.ID)
	}
	js.progress(j, engine.Progress{Phase: "round-0", Bytes: 1 << 20})
	running, err := js.list(false)
	if err != nil || len(running) != 1 || running[0].Progress.Phase != "round-0" || !running[0].Ended.IsZero() {
		t.Fatalf("running: %+v %v", running, err)
	}
	got := make(chan engine.Report, 1)
	var seen []string
	go func() {
		r, err := js.wait(context.Background(), j.info.ID, func(p engine.Progress) { seen = append(seen, p.Phase) })
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	time.Sleep(20 * time.Millisecond)
	js.progress(j, engine.Progress{Phase: "freeze"})
	if err := js.end(j, engine.Report{Container: "web", OK: true, DowntimeMs: 12}); err != nil {
		t.Fatal(err)
	}
	if r := <-got; !r.OK || r.DowntimeMs != 12 {
		t.Fatalf("wait: %+v", r)
	}
	if len(seen) != 1 || seen[0] != "freeze" {
		t.Errorf("the watcher saw %v", seen)
	}
	if ctx.Err() == nil {
		t.Error("the ended job's context is still live")
	}
	again := newJobs(dir)
	if running, _ := again.list(false); len(running) != 0 {
		t.Errorf("running after the end: %+v", running)
	}
	all, err := again.list(true)
	if err != nil || len(all) != 1 || all[0].Report == nil || all[0].Report.DowntimeMs != 12 {
		t.Fatalf("kept: %+v %v", all, err)
	}
	if r, err := again.wait(context.Background(), j.info.ID, nil); err != nil || !r.OK {
		t.Errorf("wait on an ended job: %+v %v", r, err)
	}
}

// Cancel aborts a job before its commit, refuses after it, and says
// what it can of an ended or unknown one.
func TestJobsCancel(t *testing.T) {
	js := newJobs(t.TempDir())
	j, ctx, _ := js.start(context.Background(), engine.Request{Container: "a"})
	js.progress(j, engine.Progress{Phase: "dump"})
	if r, err := js.cancelJob(j.info.ID); err != nil || !r.Cancelled || ctx.Err() == nil {
		t.Fatalf("cancel during the dump: %+v %v, context %v", r, err, ctx.Err())
	}
	k, kctx, _ := js.start(context.Background(), engine.Request{Container: "b"})
	js.progress(k, engine.Progress{Phase: "lazy-pages"})
	if r, err := js.cancelJob(k.info.ID); err != nil || r.Cancelled || !strings.Contains(r.Reason, "lazy-pages") || kctx.Err() != nil {
		t.Fatalf("cancel while pulling: %+v %v", r, err)
	}
	_ = js.end(j, engine.Report{})
	if r, err := js.cancelJob(j.info.ID); err != nil || r.Cancelled || !strings.Contains(r.Reason, "already ended") {
		t.Fatalf("cancel of an ended job: %+v %v", r, err)
	}
	if _, err := js.cancelJob("0123456789ab"); err == nil {
		t.Fatal("cancel of an unknown job: no error")
	}
	if _, err := js.wait(context.Background(), "0123456789ab", nil); err == nil {
		t.Fatal("wait on an unknown job: no error")
	}
}

// Only the last keptJobs ended jobs stay on disk.
func TestJobsKeepsTheLast(t *testing.T) {
	js := newJobs(t.TempDir())
	for i := 0; i < keptJobs+5; i++ {
		j, _, _ := js.start(context.Background(), engine.Request{Container: "c"})
		j.info.Started = time.Unix(int64(i), 0)
		if err := js.end(j, engine.Report{}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := js.list(true)
	if err != nil || len(all) != keptJobs {
		t.Fatalf("%d kept, want %d (%v)", len(all), keptJobs, err)
	}
	if !all[0].Started.Equal(time.Unix(5, 0)) {
		t.Errorf("the oldest kept started at %v, want the 6th", all[0].Started)
	}
}

// A caller's ID names one migration: a second start under it returns the
// job it names, running or ended (on disk, across a restart), and starts
// nothing.
func TestJobsCallerID(t *testing.T) {
	dir := t.TempDir()
	js := newJobs(dir)
	req := engine.Request{ID: "0123456789ab", Container: "web", To: "h2", Mode: engine.ModeCold}
	j, _, existing := js.start(context.Background(), req)
	if j == nil || existing != nil || j.info.ID != req.ID {
		t.Fatalf("first start: %+v %+v", j, existing)
	}
	if again, _, existing := js.start(context.Background(), req); again != nil || existing == nil || existing.ID != req.ID {
		t.Fatalf("second start while it runs: %+v %+v", again, existing)
	}
	if js.running() != 1 {
		t.Errorf("%d jobs run", js.running())
	}
	if err := js.end(j, engine.Report{Container: "web", OK: true}); err != nil {
		t.Fatal(err)
	}
	restarted := newJobs(dir)
	if again, _, existing := restarted.start(context.Background(), req); again != nil || existing == nil || existing.Report == nil || !existing.Report.OK {
		t.Fatalf("start after it ended: %+v %+v", again, existing)
	}
	if !restarted.known(req.ID) || restarted.known("ba9876543210") {
		t.Error("known")
	}
}

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/engine"
)

// TestJobsListCancelWait: a pre-copy on a slow link is listed by ferry ps
// while it runs, cancelled during its rounds (the source resumes the
// container, which never stopped answering), and afterwards its report is
// kept for ps --all and wait; a cancel now says it has ended.
func TestJobsListCancelWait(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upShapedLab(t, bin, 100_000_000) // 64 MiB take ~5 s a round
	const name = "hog-job"
	p := startMemhog(t, l, bin, name)
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	control := l.Hosts[0].ControlSock
	ids := make(chan string, 1)
	done := make(chan engine.Report, 1)
	go func() {
		rep, err := agent.MigrateJob(context.Background(), control,
			engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModePrecopy}, func(id string) { ids <- id }, nil)
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	var id string
	select {
	case id = <-ids:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never gave the migration an ID")
	}
	time.Sleep(time.Second) // into round 0
	js, err := agent.Jobs(context.Background(), control, false)
	if err != nil || len(js) != 1 || js[0].ID != id || js[0].Container != name || !js[0].Ended.IsZero() {
		t.Fatalf("ps: %+v %v", js, err)
	}
	r, err := agent.Cancel(context.Background(), control, id)
	if err != nil || !r.Cancelled {
		t.Fatalf("cancel during the rounds: %+v %v", r, err)
	}
	var rep engine.Report
	select {
	case rep = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the cancelled migration did not end")
	}
	if rep.OK || rep.SourceState == "removed" {
		t.Errorf("cancelled migration's report: ok=%v source %q: %s", rep.OK, rep.SourceState, rep.Error)
	}
	if s := status(t, &l.Hosts[0], name); s != "running" {
		t.Errorf("after the cancel the container is %s at the source", s)
	}
	if d := status(t, &l.Hosts[1], name); d != "absent" {
		t.Errorf("after the cancel the destination holds a container (%s)", d)
	}
	all, err := agent.Jobs(context.Background(), control, true)
	if err != nil || len(all) == 0 || all[len(all)-1].ID != id || all[len(all)-1].Report == nil {
		t.Fatalf("ps --all: %+v %v", all, err)
	}
	if w, err := agent.Wait(context.Background(), control, id, nil); err != nil || w.OK || w.Error != rep.Error {
		t.Errorf("wait on the ended migration: %+v %v", w, err)
	}
	if r, err := agent.Cancel(context.Background(), control, id); err != nil || r.Cancelled || !strings.Contains(r.Reason, "ended") {
		t.Errorf("cancel after the end: %+v %v", r, err)
	}
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK || pr.ClientDowntimeMs > 2000 {
		t.Errorf("the workload through the cancel: %+v %v", pr, perr)
	}
}

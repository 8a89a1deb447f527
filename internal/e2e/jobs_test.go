package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

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
	control := client.Socket(l.Hosts[0].ControlSock)
	ids := make(chan string, 1)
	done := make(chan engine.Report, 1)
	go func() {
		rep, err := client.MigrateJob(context.Background(), control,
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
	js, err := client.Jobs(context.Background(), control, false)
	if err != nil || len(js) != 1 || js[0].ID != id || js[0].Container != name || !js[0].Ended.IsZero() {
		t.Fatalf("ps: %+v %v", js, err)
	}
	r, err := client.Cancel(context.Background(), control, id)
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
	all, err := client.Jobs(context.Background(), control, true)
	if err != nil || len(all) == 0 || all[len(all)-1].ID != id || all[len(all)-1].Report == nil {
		t.Fatalf("ps --all: %+v %v", all, err)
	}
	if w, err := client.Wait(context.Background(), control, id, nil); err != nil || w.OK || w.Error != rep.Error {
		t.Errorf("wait on the ended migration: %+v %v", w, err)
	}
	if r, err := client.Cancel(context.Background(), control, id); err != nil || r.Cancelled || !strings.Contains(r.Reason, "ended") {
		t.Errorf("cancel after the end: %+v %v", r, err)
	}
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK || pr.ClientDowntimeMs > 2000 {
		t.Errorf("the workload through the cancel: %+v %v", pr, perr)
	}
}

// TestMigrateEvents: ferry migrate --events prints the job's ID, progress
// lines and the report, one JSON object per line, and exits 0: pre-copy's
// lines tell its rounds, dirty rate and predicted downtime; post-copy's,
// on the way back, the pages the destination still lacks, falling. The
// link is slowed to 200 Mbit/s so that the push lasts a few progress
// lines.
func TestMigrateEvents(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upShapedLab(t, bin, 200_000_000)
	const name = "hog-events"
	p := startMemhog(t, l, bin, name)
	defer p.Stop()
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	events := func(from, to, mode string) []engine.Progress {
		t.Helper()
		out, err := exec.Command(bin, "migrate", name, "--from", from, "--to", to, "--mode", mode, "--events").Output()
		if err != nil {
			t.Fatalf("ferry migrate --mode %s --events: %v\n%s", mode, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		evs := make([]engine.Event, len(lines))
		for i, l := range lines {
			if err := json.Unmarshal([]byte(l), &evs[i]); err != nil {
				t.Fatalf("line %d is not an event: %q: %v", i+1, l, err)
			}
		}
		if len(evs) < 3 || evs[0].Job == nil || evs[0].Job.ID == "" {
			t.Fatalf("want the job first, then progress, then the report; got %s", out)
		}
		last := evs[len(evs)-1].Report
		if last == nil || !last.OK || last.ID != evs[0].Job.ID || last.SchemaVersion != engine.ReportSchemaVersion {
			t.Fatalf("last line is not the migration's ok report: %s", lines[len(lines)-1])
		}
		var ps []engine.Progress
		for _, e := range evs[1 : len(evs)-1] {
			if e.Progress == nil || e.Progress.Phase == "" {
				t.Fatalf("not a progress line between the job and the report: %+v", e)
			}
			ps = append(ps, *e.Progress)
		}
		return ps
	}

	var rounds, predicted bool
	for _, p := range events("h1", "h2", engine.ModePrecopy) {
		rounds = rounds || (p.Rounds > 0 && p.MemoryBytes > 0)
		predicted = predicted || p.PredictedDowntimeMs > 0
	}
	if !rounds || !predicted {
		t.Errorf("no pre-copy progress line told the rounds done and memory (%v) or a predicted downtime (%v)", rounds, predicted)
	}

	var pending []int64
	for _, p := range events("h2", "h1", engine.ModePostcopy) {
		if p.LazyPagesPending > 0 {
			pending = append(pending, p.LazyPagesPending)
		}
	}
	if len(pending) < 2 || pending[len(pending)-1] >= pending[0] || pending[0] < 64<<20/4096*9/10 {
		t.Errorf("post-copy's lines told pending pages %v; want a few, from about 64 MiB's worth, falling", pending)
	}
}

// TestCallerChosenID: a migration run under an ID its caller chose is
// followed, not repeated, when the same request comes again: while it
// runs (a second caller hears the same report) and after it ended (the
// report again, the container left where it went). The same ID for
// another container is refused.
func TestCallerChosenID(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upShapedLab(t, bin, 200_000_000) // 64 MiB take ~3 s: time for a second request
	const name = "hog-id"
	p := startMemhog(t, l, bin, name)
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	control := client.Socket(l.Hosts[0].ControlSock)
	req := engine.Request{ID: "feed0123beef", Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold}
	type result struct {
		rep engine.Report
		err error
	}
	results := make(chan result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			rep, err := client.Migrate(context.Background(), control, req, nil)
			results <- result{rep, err}
		}()
		time.Sleep(500 * time.Millisecond)
	}
	first, second := <-results, <-results
	for _, r := range []result{first, second} {
		if r.err != nil || !r.rep.OK {
			t.Fatalf("a request under the ID: %+v %v", r.rep, r.err)
		}
	}
	if first.rep.DowntimeMs != second.rep.DowntimeMs || first.rep.TotalMs != second.rep.TotalMs {
		t.Errorf("two reports for one ID: %+v and %+v", first.rep, second.rep)
	}
	// Ended: the report again, nothing moved twice.
	again, err := client.Migrate(context.Background(), control, req, nil)
	if err != nil || !again.OK || again.TotalMs != first.rep.TotalMs {
		t.Errorf("the request once the migration ended: %+v %v", again, err)
	}
	if s, d := status(t, &l.Hosts[0], name), status(t, &l.Hosts[1], name); s != "absent" || d != "running" {
		t.Errorf("the container is %s at the source, %s at the destination", s, d)
	}
	js, err := client.Jobs(context.Background(), control, true)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, j := range js {
		if j.Container == name {
			n++
			if j.ID != req.ID {
				t.Errorf("a job under another ID: %s", j.ID)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d jobs for the container, want 1", n)
	}
	other := req
	other.Container = "someone-else"
	if _, err := client.Migrate(context.Background(), control, other, nil); err == nil || !strings.Contains(err.Error(), "names the migration of") {
		t.Errorf("the ID for another container: %v", err)
	}
	if pr, perr := p.Stop(); perr != nil || !pr.StateOK {
		t.Errorf("workload: %+v %v", pr, perr)
	}
}

package e2e

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/journal"
)

// The outcomes a code reading found that the fault matrix did not inject
// (issue 46's (a), (b) and (d)), each reproduced with the lab's own
// commands and fault points.

// TestNameTakenAtTheDestinationIsLeftAlone: h2 runs a container named as
// the one moving, with an address of its own. The offer is refused before
// the destination touches anything: h2's container keeps its network
// (it used to lose its eth0 to the rebuilt namespace's clean-up), and the
// source's runs on, never frozen.
func TestNameTakenAtTheDestinationIsLeftAlone(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	for host, ip := range map[string]string{"h1": "10.79.0.10", "h2": "10.79.0.11"} {
		if err := l.RunOnSegment(ctx, host, "web", ip, nil, []string{"/bin/memhog", "--memory", "8M", "--port", memhogPort}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := client.Migrate(ctx, client.Socket(l.Hosts[0].ControlSock), engine.Request{Container: "web", To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !strings.Contains(rep.Error, `already has a container named "web"`) {
		t.Fatalf("report: ok=%v: %s", rep.OK, rep.Error)
	}
	for _, p := range rep.Phases {
		if p.Name == "freeze" {
			t.Errorf("the source froze for an offer refused at prepare: %+v", rep.Phases)
		}
	}
	if s, d := status(t, &l.Hosts[0], "web"), status(t, &l.Hosts[1], "web"); s != "running" || d != "running" {
		t.Errorf("web is %s on h1 and %s on h2, want both running", s, d)
	}
	spec, err := cnet.Describe(cnet.Path(cnet.Name("h2", "web")))
	if err != nil {
		t.Fatalf("h2's web has no network namespace any more: %v", err)
	}
	if len(spec.Ifaces) != 1 || len(spec.Ifaces[0].Addrs) != 1 || spec.Ifaces[0].Addrs[0] != "10.79.0.11/24" {
		t.Errorf("h2's web lost its network: %+v", spec)
	}
	if pids, _ := cnet.Users(cnet.Name("h2", "web")); len(pids) == 0 {
		t.Error("no process lives in h2's web's namespace")
	}
}

// TestAddressComesBackAfterRecovery: the destination agent dies in the
// restore, after it took the container's address at the freeze, so the
// source is left in doubt. Once the destination's agent is back (it drops
// its copy, and with it the namespace holding the address), ferry resolve
// settles the migration: the source copy resumes with its network back on,
// the client's TCP connection carries on, the report says how it ended.
func TestAddressComesBackAfterRecovery(t *testing.T) {
	l, finish := echoOnSegment(t)
	ctx := context.Background()
	src := client.Socket(l.Hosts[0].ControlSock)
	rep, err := client.Migrate(ctx, src, engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold,
		Faults: []string{"kill-destination@restore"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.SourceState != "frozen" || rep.InDoubtID == "" {
		t.Fatalf("report: ok=%v source %q in doubt %q: %s", rep.OK, rep.SourceState, rep.InDoubtID, rep.Error)
	}
	checkNoThawAdvice(t, rep)
	if err := l.RestartAgent(ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	r := resolveUntilSettled(t, src, rep.InDoubtID)
	if r.State != journal.Resumed {
		t.Fatalf("settled as %+v, want resumed", r)
	}
	if _, err := os.Stat(cnet.Path(cnet.Name("h2", "hog"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("h2 kept the namespace it rebuilt for its dropped copy: %v", err)
	}
	checkSettledJob(t, src, rep.InDoubtID, journal.Resumed)
	time.Sleep(time.Second) // lines answered by the resumed source
	res, pr := finish()
	t.Logf("settled: %s; %d lines echoed in order, longest wait %.0f ms; probe gap %.0f ms", r.Note, res.Received, res.MaxGapMs, pr.ClientDowntimeMs)
}

// TestInDoubtCopyResumedByHand: the destination agent dies at the commit,
// its copy committed and running. The source's report, in doubt, must not
// tell anyone to thaw the frozen copy; if a person does all the same, and
// the destination says committed once its agent is back, the source copy
// (which took writes since) is not deleted: the migration is settled as
// diverged, and the report says both ran.
func TestInDoubtCopyResumedByHand(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	const name = "hog-by-hand"
	startMemhog(t, l, bin, name)
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	ctx := context.Background()
	src := client.Socket(l.Hosts[0].ControlSock)
	rep, err := client.Migrate(ctx, src, engine.Request{Container: name, To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold,
		Faults: []string{"kill-destination@commit"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.SourceState != "frozen" || rep.InDoubtID == "" {
		t.Fatalf("report: ok=%v source %q in doubt %q: %s", rep.OK, rep.SourceState, rep.InDoubtID, rep.Error)
	}
	checkNoThawAdvice(t, rep)
	// Asked now, with the destination's agent down, resolve changes nothing.
	r, err := client.Resolve(ctx, src, rep.InDoubtID)
	if err != nil || r.Settled || status(t, &l.Hosts[0], name) != "paused" {
		t.Fatalf("resolve with the destination down: %+v %v; source %s", r, err, status(t, &l.Hosts[0], name))
	}
	// What the old advice said to do.
	if err := l.Hosts[0].Runc().Resume(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := l.RestartAgent(ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	r = resolveUntilSettled(t, src, rep.InDoubtID)
	if r.State != journal.Diverged {
		t.Fatalf("settled as %+v, want diverged", r)
	}
	if s := status(t, &l.Hosts[0], name); s != "running" {
		t.Errorf("the source copy resumed by hand is %s: its writes must not be deleted", s)
	}
	checkSettledJob(t, src, rep.InDoubtID, journal.Diverged)
}

// checkNoThawAdvice fails t if an in-doubt report tells a person to resume
// the frozen copy, rather than to ask the agent.
func checkNoThawAdvice(t *testing.T, rep engine.Report) {
	t.Helper()
	if strings.Contains(rep.Error, "thaw") || !strings.Contains(rep.Error, "ferry resolve "+rep.InDoubtID) {
		t.Errorf("an in-doubt report must point to ferry resolve, never to a thaw: %s", rep.Error)
	}
}

// resolveUntilSettled runs ferry resolve's request until the migration is
// settled (the destination's agent may take a moment to answer).
func resolveUntilSettled(t *testing.T, src client.Endpoint, id string) engine.Resolution {
	t.Helper()
	var r engine.Resolution
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if r, err = client.Resolve(context.Background(), src, id); err == nil && r.Settled {
			return r
		}
	}
	t.Fatalf("not settled in 30 s: %+v %v", r, err)
	return r
}

// checkSettledJob fails t unless ferry ps --all shows how the migration
// was settled.
func checkSettledJob(t *testing.T, src client.Endpoint, id, state string) {
	t.Helper()
	// The agent records the settled job just after it acted on the
	// container, which the caller may have seen first.
	var last *engine.Report
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		js, err := client.Jobs(context.Background(), src, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range js {
			if j.ID == id {
				last = j.Report
				if last != nil && last.Settled != "" && last.SourceState == state {
					return
				}
			}
		}
	}
	if last == nil {
		t.Errorf("ferry ps --all does not list %s", id)
		return
	}
	t.Errorf("ferry ps --all: %+v", last)
}

// TestAddressFollowsACommittedCopyAcrossARestart: the destination agent
// dies at the commit, its copy committed, holding the container's packets
// (the address taken at the freeze). Restarted, it keeps and starts the
// copy, and must also let go of the hold its dead predecessor left (a
// queue nobody reads drops every packet: the copy ran, unreachable). The
// source, settled, removes its own; the client's TCP connection carries on
// with the destination's copy.
func TestAddressFollowsACommittedCopyAcrossARestart(t *testing.T) {
	l, finish := echoOnSegment(t)
	ctx := context.Background()
	src := client.Socket(l.Hosts[0].ControlSock)
	rep, err := client.Migrate(ctx, src, engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold,
		Faults: []string{"kill-destination@commit"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.InDoubtID == "" {
		t.Fatalf("report: ok=%v source %q in doubt %q: %s", rep.OK, rep.SourceState, rep.InDoubtID, rep.Error)
	}
	if err := l.RestartAgent(ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	r := resolveUntilSettled(t, src, rep.InDoubtID)
	if r.State != journal.Removed {
		t.Fatalf("settled as %+v, want removed", r)
	}
	checkSettledJob(t, src, rep.InDoubtID, journal.Removed)
	time.Sleep(2 * time.Second) // the client's retransmissions reach the copy
	res, pr := finish()
	t.Logf("settled: %s; %d lines echoed in order, longest wait %.0f ms; probe gap %.0f ms", r.Note, res.Received, res.MaxGapMs, pr.ClientDowntimeMs)
}

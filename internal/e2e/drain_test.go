package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/drain"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// TestDrain moves every running container off h1 with one drain, one at
// a time, and back with another whose turns go at the freeze: each
// arrives running, with its state, none is left behind, and no
// migration's memory started crossing before the one before it in the
// line gave its turn away.
func TestDrain(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	names := []string{"drain-a", "drain-b", "drain-c"}
	var probes []*bench.ProbeProc
	for i, name := range names {
		port := fmt.Sprint(7100 + i)
		t.Cleanup(func() {
			for _, h := range l.Hosts[:2] {
				_ = h.Runc().Delete(context.Background(), name)
			}
		})
		if err := l.Run(ctx, "h1", name, []string{"/bin/memhog", "--memory", fmt.Sprint(16 << 20 * (i + 1)), "--dirty-rate", "100", "--port", port}); err != nil {
			t.Fatal(err)
		}
		p, _, err := bench.StartProbe(ctx, &l.Hosts[2], bin, []string{l.Hosts[0].Addr + ":" + port, l.Hosts[1].Addr + ":" + port}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		probes = append(probes, p)
	}
	for _, c := range []struct {
		from, to *lab.Host
		handoff  string
	}{
		{&l.Hosts[0], &l.Hosts[1], engine.HandoffCommit},
		{&l.Hosts[1], &l.Hosts[0], engine.HandoffFreeze},
	} {
		res, err := drain.Run(ctx, drain.Options{From: client.Socket(c.from.ControlSock), To: c.to.AgentAddr,
			Containers: names, Handoff: c.handoff, Request: engine.Request{Mode: engine.ModePrecopy}})
		if err != nil || !res.OK {
			t.Fatalf("drain %s -> %s: %v %+v", c.from.Name, c.to.Name, err, res)
		}
		if len(res.Reports) != len(names) {
			t.Fatalf("%d reports for %d containers", len(res.Reports), len(names))
		}
		// Smallest first: drain-a holds 16 MiB, drain-c 48 MiB.
		if res.Reports[0].Container != "drain-a" || res.Reports[2].Container != "drain-c" {
			t.Errorf("order: %s, %s, %s", res.Reports[0].Container, res.Reports[1].Container, res.Reports[2].Container)
		}
		for i := 1; i < len(res.Reports); i++ {
			gave := phaseAt(t, res, i-1, c.handoff)
			if crossed := phaseAt(t, res, i, "round-0"); crossed.Before(gave) {
				t.Errorf("%s's first round began at %s, before %s's %s at %s", res.Reports[i].Container, crossed.Format(time.StampMicro), res.Reports[i-1].Container, c.handoff, gave.Format(time.StampMicro))
			}
		}
		for _, name := range names {
			if s, d := status(t, c.from, name), status(t, c.to, name); s != "absent" || d != "running" {
				t.Errorf("%s: %s at %s, %s at %s", name, s, c.from.Name, d, c.to.Name)
			}
		}
		t.Logf("drained %d containers %s -> %s (handoff at the %s) in %.0f ms", len(res.Reports), c.from.Name, c.to.Name, c.handoff, res.TotalMs)
	}
	time.Sleep(300 * time.Millisecond)
	for i, name := range names {
		pr, err := probes[i].Stop()
		if err != nil || !pr.StateOK {
			t.Errorf("%s: state %+v %v", name, pr, err)
		}
	}
}

// phaseAt is when the i-th migration of a drain began phase name, by the
// source agent's clock (its reports' phases count from their start).
func phaseAt(t *testing.T, res drain.Result, i int, name string) time.Time {
	t.Helper()
	r := res.Reports[i]
	for _, p := range r.Phases {
		if p.Name == name {
			return r.StartedAt.Add(time.Duration(p.StartMs * float64(time.Millisecond)))
		}
	}
	t.Fatalf("%s has no %s phase: %+v", r.Container, name, r.Phases)
	return time.Time{}
}

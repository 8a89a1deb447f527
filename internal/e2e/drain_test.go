package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/drain"
	"github.com/ferry-migrate/ferry/internal/engine"
)

// TestDrain moves every running container off h1 with one drain, two at a
// time: each arrives at h2 running, with its state, and none is left at
// h1.
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
	res, err := drain.Run(ctx, drain.Options{From: agent.Socket(l.Hosts[0].ControlSock), To: l.Hosts[1].AgentAddr,
		Concurrency: 2, Request: engine.Request{Mode: engine.ModePrecopy}})
	if err != nil || !res.OK {
		t.Fatalf("drain: %v %+v", err, res)
	}
	if len(res.Reports) != len(names) {
		t.Fatalf("%d reports for %d containers", len(res.Reports), len(names))
	}
	// Smallest first: drain-a holds 16 MiB, drain-c 48 MiB.
	if res.Reports[0].Container != "drain-a" || res.Reports[2].Container != "drain-c" {
		t.Errorf("order: %s, %s, %s", res.Reports[0].Container, res.Reports[1].Container, res.Reports[2].Container)
	}
	time.Sleep(300 * time.Millisecond)
	for i, name := range names {
		pr, err := probes[i].Stop()
		if err != nil || !pr.StateOK {
			t.Errorf("%s: state %+v %v", name, pr, err)
		}
		if s, d := status(t, &l.Hosts[0], name), status(t, &l.Hosts[1], name); s != "absent" || d != "running" {
			t.Errorf("%s: %s at h1, %s at h2", name, s, d)
		}
	}
	t.Logf("drained %d containers in %.0f ms", len(res.Reports), res.TotalMs)
}

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
)

// outageRun migrates 64 MiB over a 200 Mbit/s link and takes every path of
// the source down for outage once 30 % of the memory has moved.
func outageRun(t *testing.T, mode string, outage, timeout time.Duration) bench.Run {
	return outageRunStreams(t, mode, outage, timeout, 0)
}

// outageRunStreams is outageRun with the agents striping sessions over
// streams TCP connections (0: MPTCP).
func outageRunStreams(t *testing.T, mode string, outage, timeout time.Duration, streams int) bench.Run {
	t.Helper()
	res := benchMigrate(t, bench.MigrateOptions{
		Mode: mode, MemoryBytes: 64 << 20, DirtyRate: 100, BandwidthBps: 200_000_000,
		Outage: outage, OutageAt: 0.3, OutageTimeout: timeout, Streams: streams, Repeat: 1,
	})
	r := res.Runs[0]
	if r.OutageAtBytes == 0 {
		t.Fatal("the outage never happened")
	}
	t.Logf("%s, %v outage at %d bytes (timeout %v): ok=%v state_ok=%v source=%s downtime %.0f ms error=%q",
		mode, outage, r.OutageAtBytes, timeout, r.OK, r.StateOK, r.SourceState, r.DowntimeMs, r.Error)
	return r
}

// Within the outage timeout the transfer waits and carries on where it
// stopped.
// Striped sessions lose their connections (a path silent for 2 s is
// dropped) and re-dial them once the network is back.
func TestOutageWithinTimeoutResumes(t *testing.T) {
	for _, c := range []struct {
		mode    string
		streams int
	}{{engine.ModeCold, 0}, {engine.ModePostcopy, 0}, {engine.ModeCold, 2}} {
		name := c.mode
		if c.streams > 0 {
			name += "/striped"
		}
		t.Run(name, func(t *testing.T) {
			r := outageRunStreams(t, c.mode, 5*time.Second, 30*time.Second, c.streams)
			if !r.OK || !r.StateOK || r.SourceState != "removed" {
				t.Fatalf("migration did not survive a 5 s outage: %+v", r)
			}
		})
	}
}

// Past the timeout a migration that had not committed aborts and the
// container goes on at the source, state intact.
func TestOutagePastTimeoutAbortsCleanly(t *testing.T) {
	r := outageRun(t, engine.ModeCold, 15*time.Second, 4*time.Second)
	if r.OK {
		t.Fatal("a 15 s outage with a 4 s timeout did not abort")
	}
	if r.SourceState != "resumed" || !r.StateOK {
		t.Fatalf("source not resumed with its state: %+v", r)
	}
	if !strings.Contains(r.Error, "connection") {
		t.Errorf("the error does not say the connection was lost: %s", r.Error)
	}
}

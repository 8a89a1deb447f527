package e2e

import (
	"testing"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
)

// TestMultipathSurvivesPathCut migrates over two shaped paths and takes
// the source's first path down after 30 % of the memory has moved: the
// migration must finish on the other path with the workload intact. Once
// over MPTCP, once striped over TCP connections (the fallback without
// MPTCP), whose lost connection is re-dialed when the path returns.
func TestMultipathSurvivesPathCut(t *testing.T) {
	for _, c := range []struct {
		name    string
		streams int
	}{{"mptcp", 0}, {"striped", 2}} {
		t.Run(c.name, func(t *testing.T) {
			res := benchMigrate(t, bench.MigrateOptions{
				Mode: engine.ModeCold, MemoryBytes: 64 << 20, DirtyRate: 100, BandwidthBps: 200_000_000,
				Paths: 2, Streams: c.streams, CutPathAt: 0.3, Repeat: 1, Baselines: []string{"paths"},
			})
			r := res.Runs[0]
			if !r.OK || !r.StateOK {
				t.Fatalf("migration with a cut path: ok=%v state_ok=%v %s %s", r.OK, r.StateOK, r.Error, r.ProbeReason)
			}
			if r.PathCutAtBytes == 0 {
				t.Fatal("the path was never cut")
			}
			if want := map[int]string{0: "mptcp", 2: "striped tcp x2"}[c.streams]; r.Transport != want {
				t.Errorf("the session ran over %q, want %q", r.Transport, want)
			}
			p := res.Baselines.Paths
			t.Logf("cut at %d bytes; downtime %.0f ms; one path %.0f Mbit/s, MPTCP over two %.0f Mbit/s (x%.2f), striped %.0f Mbit/s (x%.2f)",
				r.PathCutAtBytes, r.DowntimeMs, p.SinglePathBps/1e6, p.MultipathBps/1e6, p.Ratio, p.StripedBps/1e6, p.StripedRatio)
		})
	}
}

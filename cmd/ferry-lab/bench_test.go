package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/bench"
)

// TestPrintBenchShowsTheLinkRatio: with the link measured, each run and
// the median say how many times the link floor they took; without, no
// ratio is made up.
func TestPrintBenchShowsTheLinkRatio(t *testing.T) {
	res := bench.MigrateResult{Mode: "postcopy", MemoryBytes: 256 << 20, DirtyRate: 1000,
		Runs:              []bench.Run{{OK: true, StateOK: true, TotalMs: 2600, TotalVsLink: 1.16}},
		MedianTotalMs:     2600,
		MedianTotalVsLink: 1.16,
		LinkFloorMs:       2244,
		Baselines:         bench.Baselines{Link: &bench.LinkBaseline{ThroughputBps: 957e6}},
	}
	var out bytes.Buffer
	printBench(&out, res)
	for _, want := range []string{"total 2600 ms (1.16 x the link floor)", "need 2244 ms at that rate (the link floor)"} {
		if strings.Count(out.String(), want) < 1 {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "x the link floor"); n != 2 {
		t.Errorf("%d ratios printed, want the run's and the median's:\n%s", n, out.String())
	}

	res.Baselines.Link, res.LinkFloorMs, res.MedianTotalVsLink, res.Runs[0].TotalVsLink = nil, 0, 0, 0
	out.Reset()
	printBench(&out, res)
	if strings.Contains(out.String(), "link floor") {
		t.Errorf("a ratio without a link measured:\n%s", out.String())
	}
}

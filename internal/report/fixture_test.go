package report

import (
	"fmt"
	"math/rand/v2"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/experiment"
	"github.com/ferry-migrate/ferry/internal/labtool"
)

// The synthetic experiment the tests draw: memhog (a probe, no client)
// and redis (a client timeline) under four modes at three state sizes,
// with predictions, six repeats at 256 MiB and three elsewhere, and a few
// failures, one with no phases at all.

const (
	clientLead = 2000 // ms the client runs before the migration starts
	bucketMs   = 100
)

var fixtureModes = []string{"cold", "precopy", "postcopy", "hybrid"}

func synthetic() experiment.Results {
	rng := rand.New(rand.NewPCG(1, 2))
	res := experiment.Results{Name: "synthetic <grid>", Machine: "test machine, 8 CPUs", Started: "2025-01-02T03:04:05Z"}
	start := int64(1_700_000_000_000)
	for _, wl := range []string{"memhog", "redis"} {
		for _, mode := range fixtureModes {
			for _, state := range []int64{64 << 20, 256 << 20, 1 << 30} {
				repeats := 3
				if state == 256<<20 {
					repeats = 6
				}
				p := experiment.Point{Workload: wl, Runtime: "runc", Mode: mode, StateBytes: state, BandwidthBps: 1_000_000_000}
				if wl == "memhog" {
					p.DirtyRate = 500
				} else {
					p.Load = 1000
				}
				for rep := range repeats {
					start += 60_000
					res.Runs = append(res.Runs, syntheticRun(rng, p, rep, start))
				}
			}
		}
	}
	// A failure at dump (cold, 64 MiB).
	res.Runs[1].OK, res.Runs[1].Error = false, "dump: criu exited 1"
	// A failure before anything began: no phases, rounds or client.
	bare := experiment.Run{Point: res.Runs[0].Point, Repeat: 9, Error: "prepare: container not found"}
	res.Runs = append(res.Runs, bare)
	return res
}

// syntheticRun is one migration whose times grow with the state.
func syntheticRun(rng *rand.Rand, p experiment.Point, rep int, start int64) experiment.Run {
	mb := float64(p.StateBytes) / (1 << 20)
	jitter := func() float64 { return 0.9 + 0.2*rng.Float64() }
	r := experiment.Run{Point: p, Repeat: rep, OK: true, StateOK: true, StartUnixMs: start, MemoryBytes: p.StateBytes}
	at := 0.0
	phase := func(name string, ms float64) {
		r.Phases = append(r.Phases, engine.PhaseSpan{Name: name, StartMs: at, EndMs: at + ms})
		at += ms
	}
	phase("prepare", 40*jitter())
	phase("rootfs-sync", 60*jitter())
	copyMs := 8 * mb * jitter() // ~1 Gbit/s
	switch p.Mode {
	case "precopy", "hybrid":
		left := p.StateBytes
		for i := 0; i < 3; i++ {
			phase(fmt.Sprintf("round-%d", i), copyMs/float64(int(1)<<(2*i)))
			r.Rounds = append(r.Rounds, engine.Round{Index: i, Bytes: left})
			left /= 4
		}
		if p.Mode == "hybrid" {
			r.Rounds = append(r.Rounds, engine.Round{Index: 3, Bytes: left, Final: true})
		}
	}
	freeze := at
	phase("freeze", 5*jitter())
	switch p.Mode {
	case "cold":
		phase("dump", copyMs)
	case "postcopy":
		phase("dump", 30*jitter())
	default:
		phase("dump", copyMs/16)
	}
	phase("images", 20*jitter())
	phase("restore", 80*jitter())
	phase("commit", 3*jitter())
	r.DowntimeMs = at - freeze
	if p.Mode == "postcopy" || p.Mode == "hybrid" {
		phase("lazy-pages", copyMs*jitter())
	}
	r.TotalMs = at
	r.FrozenMs = r.DowntimeMs
	r.ClientDowntimeMs = r.DowntimeMs + 15*jitter()
	r.BytesSent = int64(float64(p.StateBytes) * (1 + 0.05*rng.Float64()))
	r.Predicted = &experiment.Prediction{TotalMs: r.TotalMs * 1.1, DowntimeMs: r.DowntimeMs * 0.9, ClientDowntimeMs: r.DowntimeMs}
	if p.Workload == "redis" {
		r.Client = syntheticClient(rng, r)
	}
	return r
}

// syntheticClient answers ~1000 requests/s at 0.2 ms except while the
// container is frozen, then one slow bucket.
func syntheticClient(rng *rand.Rand, r experiment.Run) *labtool.LoadResult {
	c := &labtool.LoadResult{Service: "redis", StartUnixMs: r.StartUnixMs - clientLead, BucketMs: bucketMs, StateOK: true, State: "1000 keys"}
	freeze, _ := freezeStart(r)
	frozenFrom, frozenTo := clientLead+freeze, clientLead+freeze+r.DowntimeMs
	for t := 0.0; t < clientLead+r.TotalMs+2000; t += bucketMs {
		b := labtool.Bucket{TMs: t, Ops: 100, P50Ms: 0.2 + 0.05*rng.Float64(), P99Ms: 0.8 + 0.4*rng.Float64()}
		switch {
		case t+bucketMs > frozenFrom && t < frozenTo:
			b = labtool.Bucket{TMs: t}
		case t >= frozenTo && t < frozenTo+bucketMs:
			b.P50Ms, b.P99Ms, b.Errors = 5, r.DowntimeMs, 2
		}
		c.Ops += b.Ops
		c.Errors += b.Errors
		c.Timeline = append(c.Timeline, b)
	}
	c.LongestStallMs = r.ClientDowntimeMs
	return c
}

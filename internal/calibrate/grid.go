package calibrate

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/fit"
	"github.com/ferry-migrate/ferry/internal/model"
)

// Runner measures one grid point; bench.Migrate in real use, a fake in
// tests.
type Runner func(context.Context, bench.MigrateOptions) (bench.MigrateResult, error)

// Progress tells a watcher where a grid run is.
type Progress struct {
	Done, Total int
	Point       string // the point being measured ("" once done)
	Step        string // the bench's latest step
	Elapsed     time.Duration
}

// sweep measures each point in turn with one bench run (a lab of its own:
// bench brings one up per call, and only one lab can exist at a time).
// A bench error (no lab, a cancelled context) stops the sweep; failed
// migrations are recorded and the sweep goes on.
func sweep(ctx context.Context, points []Point, c sweepConfig) ([]Measured, error) {
	repeat, ferryBin, run, progress, log := c.Repeat, c.FerryBin, c.Run, c.Progress, c.Log
	if run == nil {
		run = bench.Migrate
	}
	start := time.Now()
	var out []Measured
	for i, pt := range points {
		var mu sync.Mutex
		cur := Progress{Done: i, Total: len(points), Point: pt.String()}
		emit := func(step string) {
			if progress == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if step != "" {
				cur.Step = step
			}
			cur.Elapsed = time.Since(start)
			progress(cur)
		}
		emit("")
		w := &lineWriter{fn: func(line string) {
			emit(strings.TrimPrefix(line, "bench: "))
			if log != nil {
				fmt.Fprintln(log, line)
			}
		}}
		t0 := time.Now()
		res, err := run(ctx, bench.MigrateOptions{Mode: pt.Mode, MemoryBytes: pt.MemoryBytes, DirtyRate: pt.DirtyRate,
			BandwidthBps: pt.BandwidthBps, Repeat: repeat, Baselines: pt.Baselines, FerryBin: ferryBin, Log: w, TCPClient: c.TCPClient,
			// Rounds that read all of memory measure read_hash_bps; the
			// model adds write tracking's savings where the host has it.
			Precopy: engine.PrecopyOptions{WriteTracking: engine.TrackingOff}})
		m := Measured{Point: pt, WallS: time.Since(t0).Seconds()}
		if err != nil {
			m.Error = err.Error()
			out = append(out, m)
			return out, fmt.Errorf("%s: %w", pt, err)
		}
		m.Result = &res
		if len(fit.OKRuns(res)) == 0 {
			m.Error = "no run succeeded"
			for _, r := range res.Runs {
				if r.Error != "" {
					m.Error += ": " + r.Error
					break
				}
			}
		}
		out = append(out, m)
	}
	if progress != nil {
		progress(Progress{Done: len(points), Total: len(points), Elapsed: time.Since(start)})
	}
	return out, nil
}

// lineWriter calls fn with each complete line written to it.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		w.fn(line)
	}
}

// Options configure Run.
type Options struct {
	// Quick measures a smaller grid (64M and 256M at 100 pages/s).
	Quick bool
	// Memories and DirtyRates override the grid (bytes, pages/s).
	Memories   []int64
	DirtyRates []int
	// Repeat is the migrations per point; 0 means 2.
	Repeat int
	// ShapedBps is the link rate of the link-efficiency point, bits/s; 0
	// means 300 Mbit/s (not a validation rate).
	ShapedBps int64
	// FaultRates are extra post-copy dirty rates, so that the pull's fault
	// term (fault_s) sees more than one rate; default 3000 pages/s, none
	// with Quick.
	FaultRates []int
	// TCPClient runs memhog as a service is deployed: an address of its
	// own (a network namespace ferry rebuilds) and a client on one TCP
	// connection, whose costs then sit in the profile's fixed terms.
	TCPClient bool
	// FerryBin is the ferry binary the lab runs (memhog next to it).
	FerryBin string
	// Progress, if set, hears of every point and bench step.
	Progress func(Progress)
	// Log receives the bench's step lines.
	Log io.Writer
	// Run measures a point; nil means bench.Migrate.
	Run Runner
	// Features says what the kernel supports; nil means criu.ProbeFeatures.
	Features func(context.Context) criu.Features
	// WriteTracking says whether the kernel tracks writes for pre-copy's
	// rounds (nil error); nil means dirty.Available.
	WriteTracking func() error
}

// sweepConfig is how a sweep measures its points (Options and
// ValidateOptions share it).
type sweepConfig struct {
	Repeat    int
	FerryBin  string
	TCPClient bool
	Run       Runner
	Progress  func(Progress)
	Log       io.Writer
}

func (o Options) sweep() sweepConfig {
	return sweepConfig{Repeat: o.Repeat, FerryBin: o.FerryBin, TCPClient: o.TCPClient, Run: o.Run, Progress: o.Progress, Log: o.Log}
}

func (o ValidateOptions) sweep() sweepConfig {
	return sweepConfig{Repeat: o.Repeat, FerryBin: o.FerryBin, TCPClient: o.TCPClient, Run: o.Run, Progress: o.Progress, Log: o.Log}
}

// Defaults of the grid.
var (
	DefaultMemories   = []int64{64 << 20, 128 << 20, 256 << 20, 512 << 20}
	DefaultDirtyRates = []int{0, 2000}
	QuickMemories     = []int64{64 << 20, 256 << 20}
	QuickDirtyRates   = []int{100}
	DefaultFaultRates = []int{3000}
)

// shapedFaultRate is a post-copy dirty rate on the shaped link between
// quiet and FaultRates (the validation grid's are 500 and 4000 pages/s).
const shapedFaultRate = 1000

// DefaultShapedBps is the calibration's shaped link: 300 Mbit/s.
const DefaultShapedBps = 300_000_000

// Calibrated modes: the ones whose phases identify a profile parameter.
// Hybrid adds no parameter of its own.
var calibratedModes = model.EngineModes

func (o Options) withDefaults() Options {
	if len(o.Memories) == 0 {
		o.Memories = DefaultMemories
		if o.Quick {
			o.Memories = QuickMemories
		}
	}
	if len(o.DirtyRates) == 0 {
		o.DirtyRates = DefaultDirtyRates
		if o.Quick {
			o.DirtyRates = QuickDirtyRates
		}
	}
	if o.Repeat <= 0 {
		o.Repeat = 2 // one run per point is too noisy on a 2-core host
	}
	if o.ShapedBps <= 0 {
		o.ShapedBps = DefaultShapedBps
	}
	if o.FaultRates == nil && !o.Quick {
		o.FaultRates = DefaultFaultRates
	}
	return o
}

// Grid lists the points Run measures: every calibrated mode at every
// memory and dirty rate on unshaped links, then one pre-copy over a shaped
// link (the largest memory up to 128 MiB, the lowest dirty rate) with the
// link baseline.
func Grid(o Options) []Point {
	o = o.withDefaults()
	var pts []Point
	for _, m := range o.Memories {
		for _, r := range o.DirtyRates {
			for _, mode := range calibratedModes {
				pts = append(pts, Point{Mode: mode, MemoryBytes: m, DirtyRate: r})
			}
		}
	}
	for _, m := range o.Memories {
		for _, r := range o.FaultRates {
			pts = append(pts, Point{Mode: model.ModePostcopy, MemoryBytes: m, DirtyRate: r})
		}
	}
	shapedMem := o.Memories[0]
	for _, m := range o.Memories {
		if m <= 128<<20 && m > shapedMem {
			shapedMem = m
		}
	}
	lowRate := o.DirtyRates[0]
	for _, r := range o.DirtyRates {
		lowRate = min(lowRate, r)
	}
	pts = append(pts, Point{Mode: model.ModePrecopy, MemoryBytes: shapedMem, DirtyRate: lowRate,
		BandwidthBps: o.ShapedBps, Baselines: []string{"link"}})
	// Post-copy over the same link: how far its requests' time on the link
	// and on the hosts overlap (lazy_serial_share), and how round trips and
	// faults share the cost of small requests, quiet to faulting.
	rates := append([]int{lowRate}, o.FaultRates...)
	if !o.Quick {
		rates = append(rates, shapedFaultRate)
	}
	for _, r := range slices.Compact(slices.Sorted(slices.Values(rates))) {
		pts = append(pts, Point{Mode: model.ModePostcopy, MemoryBytes: shapedMem, DirtyRate: r, BandwidthBps: o.ShapedBps})
	}
	return pts
}

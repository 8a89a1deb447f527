// Package drain moves the running containers off a host: several
// migrations at once, the smallest first, each one an ordinary migration
// with its own report.
package drain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/engine"
)

// Options say what to drain and how.
type Options struct {
	// From is the source agent; To the destination's address.
	From client.Endpoint
	To   string
	// Request is every migration's request: mode, pre-copy options,
	// runtime (Container and To are set per container).
	Request engine.Request
	// Containers to move; empty: every container running in the source
	// agent's runc root (other runtimes' containers are named).
	Containers []string
	// Concurrency is how many migrations' memory crosses at once (default
	// 1: see docs/BENCHMARKS.md, "Draining a host": on a two-core host
	// four at once took as long in all and doubled each one's downtime).
	// One more migration runs its setup meanwhile and waits in the
	// drain's line at the source (engine.LineSpec) until one of those
	// freezes; a committed migration makes way for the next while it ends
	// (see madeWay).
	Concurrency int
	// Handoff is when a pre-copy or hybrid migration lets the next one's
	// memory start crossing: engine.HandoffCommit (default) or
	// engine.HandoffFreeze.
	Handoff string
	// Started and Finished, when set, hear of each migration.
	Started  func(name string)
	Finished func(name string, r engine.Report, err error)

	// The agent, replaced in tests.
	status  func(ctx context.Context, ep client.Endpoint) (engine.Status, error)
	migrate func(ctx context.Context, ep client.Endpoint, req engine.Request, progress func(engine.Progress)) (engine.Report, error)
}

func (o *Options) defaults() {
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.Handoff == "" {
		o.Handoff = engine.HandoffCommit
	}
	if o.status == nil {
		o.status = client.Status
	}
	if o.migrate == nil {
		o.migrate = client.Migrate
	}
}

// Result is a drain's outcome: every migration's report, in the order they
// started, and the wall time of the whole.
type Result struct {
	Reports []engine.Report `json:"reports"`
	// StartMs is when each started, from the drain's start.
	StartMs []float64 `json:"start_ms"`
	TotalMs float64   `json:"total_ms"`
	OK      bool      `json:"ok"`
}

// Run drains: it starts the smallest containers first (each one done
// frees the link and the CPU for the others sooner, which lowers the mean
// time to move one) and keeps Concurrency migrations' memory crossing, and
// the next one's setup going, until all are done. One starts once the one
// before has set up: two setups at once only slow the first.
// A failed migration does not stop the others; its container stays where
// its report says.
func Run(ctx context.Context, o Options) (Result, error) {
	o.defaults()
	if o.Handoff != engine.HandoffCommit && o.Handoff != engine.HandoffFreeze {
		return Result{}, fmt.Errorf("unknown handoff %q (commit, freeze)", o.Handoff)
	}
	names, err := pick(ctx, o)
	if err != nil {
		return Result{}, err
	}
	if len(names) == 0 {
		return Result{OK: true, Reports: []engine.Report{}, StartMs: []float64{}}, nil
	}
	res := Result{Reports: make([]engine.Report, len(names)), StartMs: make([]float64, len(names)), OK: true}
	errs := make([]error, len(names))
	start := time.Now()
	line := &engine.LineSpec{Name: "drain-" + engine.NewID(), Width: o.Concurrency, Handoff: o.Handoff}
	slots := make(chan struct{}, o.Concurrency+1)
	var wg sync.WaitGroup
	setUp := make(chan struct{})
	close(setUp)
	for i, name := range names {
		select {
		case <-setUp:
		case <-ctx.Done():
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			errs[i] = ctx.Err()
			continue
		}
		wg.Add(1)
		thisSetUp := make(chan struct{})
		setUp = thisSetUp
		go func() {
			defer wg.Done()
			free := sync.OnceFunc(func() { <-slots })
			defer free()
			ready := sync.OnceFunc(func() { close(thisSetUp) })
			defer ready()
			if o.Started != nil {
				o.Started(name)
			}
			res.StartMs[i] = float64(time.Since(start)) / float64(time.Millisecond)
			req := o.Request
			req.Container, req.To, req.Line = name, o.To, line
			done := madeWay(req.Mode)
			r, err := o.migrate(ctx, o.From, req, func(p engine.Progress) {
				if !slices.Contains(setupPhases, p.Phase) {
					ready()
				}
				if done(p.Phase) {
					free()
				}
			})
			if r.Container == "" {
				r.Container = name
			}
			res.Reports[i], errs[i] = r, err
			if o.Finished != nil {
				o.Finished(name, r, err)
			}
		}()
	}
	wg.Wait()
	res.TotalMs = float64(time.Since(start)) / float64(time.Millisecond)
	for i := range names {
		if errs[i] != nil || !res.Reports[i].OK {
			res.OK = false
		}
	}
	return res, errors.Join(errs...)
}

// setupPhases come before a migration's memory starts crossing.
var setupPhases = []string{"", "measure", "prepare", "rootfs-sync", "queued"}

// madeWay returns a test of a migration's phases (as progress tells them)
// that says when it makes way for the next: once it commits. Its downtime
// is then over and its memory has crossed; what is left (hybrid's pull
// from the destination's own copy, removing the source) needs little of
// the link or the CPU. Post-copy's memory crosses after its commit, so it
// keeps its place to the end, as does a mode auto has yet to choose.
// Making way sooner, at the freeze, shortened a drain further but raised
// each container's downtime (docs/BENCHMARKS.md, "Draining a host, third
// time").
func madeWay(mode string) func(phase string) bool {
	return func(phase string) bool {
		switch mode {
		case engine.ModeCold, engine.ModePrecopy, engine.ModeHybrid:
			return slices.Contains([]string{"commit", "lazy-pages", "cleanup"}, phase)
		}
		return false
	}
}

// pick lists the containers to move, smallest resident memory first.
func pick(ctx context.Context, o Options) ([]string, error) {
	st, err := o.status(ctx, o.From)
	if err != nil {
		return nil, fmt.Errorf("list the source's containers: %w", err)
	}
	sizes := map[string]int64{}
	for _, c := range st.Containers {
		// runc's only, as agents listed before they listed every
		// runtime's: a drain moving other runtimes' containers (a
		// Kubernetes pod's needs its controller) is a choice to make apart.
		if c.Status == "running" && (c.Runtime == "" || c.Runtime == "runc") {
			sizes[c.Name] = c.ResidentBytes
		}
	}
	names := o.Containers
	if len(names) == 0 {
		for n := range sizes {
			names = append(names, n)
		}
	}
	// A named container the list lacks may run under another runtime
	// (the list is runc's): its migration finds it, or says
	// it is not there. It goes last, its size unknown.
	rss := map[string]int64{}
	for _, n := range names {
		rss[n] = 1 << 62
		if size, ok := sizes[n]; ok {
			rss[n] = size
		}
	}
	sort.SliceStable(names, func(i, j int) bool {
		if rss[names[i]] != rss[names[j]] {
			return rss[names[i]] < rss[names[j]]
		}
		return names[i] < names[j]
	})
	return names, nil
}

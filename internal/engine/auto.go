package engine

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/api"

	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// ModeAuto measures the live inputs, plans with the host profile, and runs
// the technique the planner recommends, or refuses before anything is
// frozen when none fits the downtime budget.
const ModeAuto = api.ModeAuto

// ChanProbe carries a short bulk transfer that measures the link.
const ChanProbe = "probe"

// probeBytes is how much the link probe sends: enough to leave TCP's slow
// start, small next to a migration.
const probeBytes = 16 << 20

// AutoChoice records what mode auto measured and decided.
type AutoChoice = api.AutoChoice

// measure measures the container and the link, the planner's inputs
// (kept for the report's plan), under the request's bound on the source's
// frozen time.
func (m *migration) measure() (model.Inputs, Workload, float64, error) {
	m.begin(phaseMeasure)
	w, err := MeasureWorkload(m.ctr.PID, time.Second)
	if err != nil {
		return model.Inputs{}, w, 0, fmt.Errorf("measuring the container: %w", err)
	}
	bps, err := ProbeLink(m.sess)
	if err != nil {
		return model.Inputs{}, w, 0, fmt.Errorf("measuring the link: %w", err)
	}
	in := PlanFor(w.Inputs(), m.rt.Caps())
	in.BandwidthBps = bps / 8
	in.MaxFrozenMs = float64(m.req.MaxFrozen.Microseconds()) / 1000
	m.autoInputs = &in
	return in, w, bps, nil
}

// chooseMode measures and plans; it returns the mode to run.
func (m *migration) chooseMode(ctx context.Context) (string, error) {
	in, w, bps, err := m.measure()
	if err != nil {
		return "", err
	}
	preds, _, rec, reason := model.Best(m.profile, in, float64(m.req.Precopy.MaxDowntime.Microseconds())/1000)
	c := &AutoChoice{MemoryBytes: w.MemoryBytes, SharedBytes: w.SharedBytes, DirtyRate: w.DirtyRate, ThroughputBps: bps, Predictions: preds, Chosen: rec, Reason: reason}
	m.report.Auto = c
	if rec == "" {
		return "", fmt.Errorf("no technique fits: %s", reason)
	}
	if rec == model.ModeNativePrecopy {
		rec = ModePrecopy
		m.req.Precopy.Engine = PrecopyNative
	}
	for _, p := range preds {
		if p.Mode == c.Chosen && p.Rounds > 0 {
			c.Rounds = p.Rounds
			if m.req.Precopy.MaxRounds == 0 || m.req.Precopy.MaxRounds > p.Rounds {
				m.req.Precopy.MaxRounds = p.Rounds
			}
		}
	}
	return rec, nil
}

// checkFrozenBound refuses, before anything is frozen, a named mode
// predicted to hold the source frozen longer than the request allows
// (Request.MaxFrozen), naming the modes that would not.
func (m *migration) checkFrozenBound() error {
	in, _, _, err := m.measure()
	if err != nil {
		return err
	}
	preds, feasible, _, _ := model.Best(m.profile, in, 0)
	mode := m.req.Mode
	if mode == ModePrecopy && m.req.Precopy.Engine == PrecopyNative {
		mode = model.ModeNativePrecopy
	}
	for _, q := range preds {
		if q.Mode != mode || slices.Contains(feasible, mode) {
			continue
		}
		others := "none does"
		if len(feasible) > 0 {
			others = strings.Join(feasible, ", ") + " would not"
		}
		return fmt.Errorf("%s would hold the container frozen up to %.0f ms (downtime up to %.0f ms%s), longer than the %v it may stay frozen (a liveness probe restarts it then); %s",
			m.req.Mode, model.HeldHighMs(q), q.DowntimeHighMs, pullNote(q), m.req.MaxFrozen, others)
	}
	return nil
}

// pullNote names a lazy mode's pull, which holds the source frozen too.
func pullNote(q model.Prediction) string {
	if q.DegradedMs <= 0 {
		return ""
	}
	return fmt.Sprintf(", then about %.0f ms while its pages are pulled from it", q.DegradedMs)
}

// PlanFor adds to a plan's inputs what a runtime with caps can do: no
// post-copy or hybrid without a lazy dump and restore, and the copy of the
// images a runtime's restore makes first.
func PlanFor(in model.Inputs, c runtime.Caps) model.Inputs {
	in.NoLazyRestore = !c.LazyDump || !c.LazyRestore
	in.CopiesImages = c.CopiesImages
	return in
}

// Workload is a running container as the planner sees it.
type Workload struct {
	MemoryBytes int64
	DirtyRate   float64 // pages written a second
	SharedBytes int64   // shared memory, dumped whole while frozen
	Cores       float64 // CPU its processes used, in cores
}

// Inputs are the model's inputs for it (the link left out).
func (w Workload) Inputs() model.Inputs {
	return model.Inputs{MemoryBytes: float64(w.MemoryBytes), DirtyRatePagesPerSec: w.DirtyRate, SharedBytes: float64(w.SharedBytes)}
}

// MeasureWorkload measures the container whose init is pid over window:
// its memory and the pages it writes a second, its shared memory, and the
// CPU time its processes took.
func MeasureWorkload(pid int, window time.Duration) (Workload, error) {
	pids, err := pages.ContainerPIDs(pid)
	if err != nil {
		return Workload{}, err
	}
	cpu0, start := procs.CPUTime(pids), time.Now()
	mem, rate, err := measureMemory(pid, window)
	if err != nil {
		return Workload{}, err
	}
	w := Workload{MemoryBytes: mem, DirtyRate: rate, SharedBytes: procs.SharedMemory(pids)}
	w.Cores = (procs.CPUTime(pids) - cpu0).Seconds() / time.Since(start).Seconds()
	return w, nil
}

// measureMemory reads the container's memory twice, window apart, and
// returns its size and how many pages per second changed in between.
func measureMemory(initPID int, window time.Duration) (int64, float64, error) {
	scan := func() (map[pages.Key]uint64, error) {
		pids, err := pages.ContainerPIDs(initPID)
		if err != nil {
			return nil, err
		}
		r, err := pages.NewReader(pids)
		if err != nil {
			return nil, err
		}
		seen := map[pages.Key]uint64{}
		_, err = r.Scan(func(p pages.Page) error { seen[p.Key] = p.Hash.Lo ^ p.Hash.Hi; return nil })
		return seen, err
	}
	start := time.Now()
	a, err := scan()
	if err != nil {
		return 0, 0, err
	}
	time.Sleep(window)
	b, err := scan()
	if err != nil {
		return 0, 0, err
	}
	changed := 0
	for k, h := range b {
		if old, ok := a[k]; !ok || old != h {
			changed++
		}
	}
	return int64(len(b)) * pageSize, float64(changed) / time.Since(start).Seconds(), nil
}

// ProbeLink sends probeBytes to the agent at the session's other end and
// times the round trip of the whole transfer: the link's throughput, in
// bits a second.
func ProbeLink(sess *transport.Session) (float64, error) {
	ch, err := sess.Open(ChanProbe)
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	buf := make([]byte, 256<<10)
	start := time.Now()
	for sent := 0; sent < probeBytes; sent += len(buf) {
		if _, err := ch.Write(buf); err != nil {
			return 0, err
		}
	}
	if err := ch.CloseWrite(); err != nil {
		return 0, err
	}
	var n int64
	if err := ch.Recv(&n); err != nil {
		return 0, err
	}
	return float64(n) * 8 / time.Since(start).Seconds(), nil
}

// ServeProbe drains a link probe and says how much arrived.
func ServeProbe(ch *transport.Channel) {
	defer ch.Close()
	n, err := io.Copy(io.Discard, ch)
	if err != nil {
		_ = ch.Fail(err)
		return
	}
	_ = ch.Send(n)
}

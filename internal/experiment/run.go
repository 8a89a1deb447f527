package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	agentclient "github.com/ferry-migrate/ferry/api/client"

	"github.com/schollz/progressbar/v3"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Options say how to run a spec.
type Options struct {
	Spec Spec
	// FerryBin is the ferry binary the lab's agents run; its tools run
	// from the ferry-lab beside it (lab.ToolBin).
	FerryBin string
	// Checkpoint, when set, is called with the results so far after each
	// run, so that an interrupted experiment keeps what it measured.
	Checkpoint func(Results) error
	// Log receives one line per step; Progress, a progress bar. Nil for
	// neither.
	Log      io.Writer
	Progress io.Writer
}

// serviceIP is the address a service container gets on the lab's
// segment: one container at a time, so one address serves.
const serviceIP = lab.SegmentSubnet + "20"

// fillWait bounds how long a server may take to listen.
const fillWait = 60 * time.Second

// Execute brings up a lab per bandwidth and migrates every point of the grid
// Spec.Repeats times, from h1 to h2, with the service's client on h3.
// A run that fails is recorded with its error and the grid goes on; Run
// itself fails only when the lab cannot come up or the context ends.
func Execute(ctx context.Context, o Options) (res Results, err error) {
	s := o.Spec
	res = Results{Name: s.Name, Machine: machine(), Started: time.Now().UTC().Format(time.RFC3339), Runs: []Run{},
		BudgetMs: float64(s.Budget) / float64(time.Millisecond)}
	var profile *model.Profile
	if s.Profile != "" {
		p, err := ReadProfile(s.Profile)
		if err != nil {
			return res, err
		}
		profile = &p
	}
	grid := s.Grid()
	var bar *progressbar.ProgressBar
	if o.Progress != nil {
		bar = progressbar.NewOptions(len(grid)*s.Repeats, progressbar.OptionSetWriter(o.Progress),
			progressbar.OptionSetDescription(s.Name), progressbar.OptionShowCount(), progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetPredictTime(true), progressbar.OptionOnCompletion(func() { fmt.Fprintln(o.Progress) }))
	}
	n := 0
	for start := 0; start < len(grid); {
		end := start
		for end < len(grid) && grid[end].BandwidthBps == grid[start].BandwidthBps {
			end++
		}
		o.logf("bringing up a 3-host lab at %s", units.FormatRate(grid[start].BandwidthBps))
		l, err := lab.Up(ctx, lab.Options{Hosts: 3, BandwidthBps: grid[start].BandwidthBps, FerryBin: o.FerryBin})
		if err != nil {
			return res, err
		}
		for _, p := range grid[start:end] {
			for rep := 1; rep <= s.Repeats && ctx.Err() == nil; rep++ {
				n++
				o.logf("run %d/%d: %s", n, len(grid)*s.Repeats, p)
				r := o.runPoint(ctx, l, p, rep, n)
				if ctx.Err() != nil {
					break // cut short by the interruption: not a measurement
				}
				o.logf("run %d/%d: ok=%v downtime %.0f ms, client %.0f ms, total %.0f ms, state_ok=%v %s",
					n, len(grid)*s.Repeats, r.OK, r.DowntimeMs, r.ClientDowntimeMs, r.TotalMs, r.StateOK, r.Error)
				res.Runs = append(res.Runs, r)
				if profile != nil {
					Predict(&res, *profile)
				}
				if o.Checkpoint != nil {
					if err := o.Checkpoint(res); err != nil {
						o.logf("saving the results so far: %v", err)
					}
				}
				if bar != nil {
					_ = bar.Add(1)
				}
			}
		}
		if derr := lab.Down(context.WithoutCancel(ctx)); derr != nil {
			return res, fmt.Errorf("the lab did not go down: %w", derr)
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		start = end
	}
	return res, nil
}

func (o Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "experiment: "+format+"\n", args...)
	}
}

func (p Point) String() string {
	load := fmt.Sprintf("%d pages/s", p.DirtyRate)
	if workloads[p.Workload].service != nil {
		load = fmt.Sprintf("%d requests/s", p.Load)
	}
	return fmt.Sprintf("%s on %s, %s, %s of state, %s, %s", p.Workload, p.Runtime, p.Mode,
		units.Bytes(p.StateBytes), load, units.FormatRate(p.BandwidthBps))
}

// runPoint measures one migration of p; n names its container.
func (o Options) runPoint(ctx context.Context, l *lab.Lab, p Point, rep, n int) Run {
	src, dst, client := &l.Hosts[0], &l.Hosts[1], &l.Hosts[2]
	svc := workloads[p.Workload].service
	mode, rounds, _ := SplitMode(p.Mode)
	precopy := engine.PrecopyOptions{MaxRounds: rounds}
	if p.Mode == ModeNormal {
		return o.runNormal(ctx, p, rep, src, dst, client)
	}
	if svc == nil {
		mo := bench.MigrateOptions{Runtime: p.Runtime, Mode: mode, Precopy: precopy, MemoryBytes: p.StateBytes, DirtyRate: p.DirtyRate,
			BandwidthBps: p.BandwidthBps, FerryBin: o.FerryBin, Log: o.Log}
		start := time.Now()
		br := mo.RunOnce(ctx, l, src, dst, client, fmt.Sprintf("memhog-%d", n))
		r := Run{Point: p, Repeat: rep, StartUnixMs: start.UnixMilli(), OK: br.OK && br.Error == "", Error: br.Error,
			DowntimeMs: br.DowntimeMs, ClientDowntimeMs: br.ClientDowntimeMs, TotalMs: br.TotalMs, FrozenMs: br.FrozenMs,
			BytesSent: br.BytesSent, MemoryBytes: br.MemoryBytes, StateOK: br.StateOK, Rounds: br.Rounds, Phases: br.Phases,
			RootfsBytes: br.RootfsBytes, RootfsEntries: br.RootfsEntries, FrozenRootfsBytes: br.FrozenRootfsBytes}
		return r.settle()
	}
	r := Run{Point: p, Repeat: rep}
	name := fmt.Sprintf("%s-%d", p.Workload, n)
	defer func() {
		cctx := context.WithoutCancel(ctx)
		for _, h := range []*lab.Host{src, dst} {
			_ = l.RemoveFrom(cctx, p.Runtime, h.Name, name)
			_ = cnet.Delete(cnet.Name(h.Name, name))
		}
	}()
	if err := l.RunWith(ctx, src.Name, name, lab.RunOptions{IP: serviceIP, Rootfs: lab.RootfsDebian, Packages: svc.packages},
		svc.command(p.StateBytes)); err != nil {
		r.Error = err.Error()
		return r
	}
	addr := fmt.Sprintf("%s:%d", serviceIP, svc.port)
	if err := o.fill(ctx, client, svc, addr, p.StateBytes); err != nil {
		r.Error = err.Error()
		return r
	}
	args := []string{"--service", svc.client, "--addr", addr, "--rate", strconv.Itoa(p.Load), "--conns", strconv.Itoa(o.Spec.Connections)}
	if o.Spec.Tools && svc.tool {
		args = append(args, "--tool")
	}
	load, err := bench.StartLoad(ctx, client, o.FerryBin, args...)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.WorkingSetBytes, r.SharedBytes = measureService(ctx, src, name, o.Spec.Before)
	start := time.Now()
	rep2, merr := agentclient.Migrate(ctx, agentclient.Socket(src.ControlSock), engine.Request{Container: name, To: dst.AgentAddr, Mode: mode, Runtime: p.Runtime, Precopy: precopy}, nil)
	sleep(ctx, o.Spec.After)
	lr, lerr := load.Stop()
	r.StartUnixMs = start.UnixMilli()
	r.Client = &lr
	if merr != nil {
		r.Error = merr.Error()
		return r
	}
	r.OK, r.Error = rep2.OK, rep2.Error
	r.DowntimeMs, r.TotalMs, r.FrozenMs = rep2.DowntimeMs, rep2.TotalMs, rep2.FrozenMs
	r.BytesSent, r.MemoryBytes = rep2.BytesSent, rep2.MemoryBytes
	r.Rounds, r.Phases = rep2.Rounds, rep2.Phases
	r.RootfsBytes, r.RootfsEntries, r.FrozenRootfsBytes = rep2.RootfsBytes, rep2.RootfsEntries, rep2.FrozenRootfsBytes
	r.ClientDowntimeMs, r.StateOK = lr.LongestStallMs, lr.StateOK
	if lerr != nil {
		r.OK, r.Error = false, strings.TrimPrefix(errors.Join(errors.New(r.Error), lerr).Error(), "\n")
	} else if lr.Error != "" {
		r.OK, r.Error = false, strings.TrimSpace(r.Error+" client: "+lr.Error)
	}
	return r.settle()
}

// measureService lets the container run for d and returns the private
// memory its processes touched in the last second of it (0 where the
// kernel does not say) and the shared memory they hold.
func measureService(ctx context.Context, h *lab.Host, name string, d time.Duration) (working, shared int64) {
	window := min(time.Second, d)
	sleep(ctx, d-window)
	st, err := h.Runc().State(ctx, name)
	if err != nil {
		sleep(ctx, window)
		return 0, 0
	}
	pids := append([]int{st.Pid}, procs.Descendants(st.Pid, "")...)
	cleared := true
	for _, pid := range pids {
		cleared = cleared && procs.ClearReferenced(pid) == nil
	}
	sleep(ctx, window)
	for _, pid := range pids {
		if n, err := procs.Referenced(pid); cleared && err == nil {
			working += n
		}
	}
	return working, procs.SharedMemory(pids)
}

// runNormal measures the checkpoint-to-disk path (ModeNormal) at p.
func (o Options) runNormal(ctx context.Context, p Point, rep int, src, dst, client *lab.Host) Run {
	mo := bench.MigrateOptions{Runtime: "podman", MemoryBytes: p.StateBytes, DirtyRate: p.DirtyRate,
		BandwidthBps: p.BandwidthBps, FerryBin: o.FerryBin, Log: o.Log}
	start := time.Now()
	pb := mo.PodmanBaselineOnce(ctx, src, dst, client)
	r := Run{Point: p, Repeat: rep, StartUnixMs: start.UnixMilli(), OK: pb.Error == "", Error: pb.Error,
		DowntimeMs: pb.DowntimeMs, ClientDowntimeMs: pb.ClientDowntimeMs, TotalMs: pb.DowntimeMs, FrozenMs: pb.DowntimeMs,
		BytesSent: pb.ArchiveBytes, StateOK: pb.StateOK}
	// The three steps, as the engine's phases are named.
	at := 0.0
	for _, ph := range []struct {
		name string
		ms   float64
	}{{"checkpoint", pb.CheckpointMs}, {"copy", pb.CopyMs}, {"restore", pb.RestoreMs}} {
		r.Phases = append(r.Phases, engine.PhaseSpan{Name: ph.name, StartMs: at, EndMs: at + ph.ms})
		at += ph.ms
	}
	return r.settle()
}

// settle fills what a run derives from its measurements.
func (r Run) settle() Run {
	if r.Rounds == nil {
		r.Rounds = []engine.Round{}
	}
	if r.Phases == nil {
		r.Phases = []engine.PhaseSpan{}
	}
	r.DirtyRateMeasured = measuredDirtyRate(r.Rounds)
	return r
}

// measuredDirtyRate is the pages per second pre-copy's live rounds found
// written (their median; the first round has none to compare with).
func measuredDirtyRate(rounds []engine.Round) float64 {
	var rates []float64
	for _, rd := range rounds {
		if rd.Index > 0 && !rd.Final {
			rates = append(rates, rd.DirtyRate)
		}
	}
	return Median(rates)
}

// fill preloads the service with state bytes from the client host,
// trying again while the server starts.
func (o Options) fill(ctx context.Context, client *lab.Host, svc *service, addr string, state int64) error {
	deadline := time.Now().Add(fillWait)
	for {
		out, err := client.Command(ctx, lab.ToolBin(o.FerryBin), "lab-tool", "fill", "--service", svc.client, "--addr", addr,
			"--bytes", strconv.FormatInt(state, 10)).CombinedOutput()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("fill %s with %s: %v: %s", addr, units.Bytes(state), err, strings.TrimSpace(string(out)))
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// machine describes this machine for the report: kernel, CPUs, memory,
// and how long it has been up (a fresh machine is markedly slower).
func machine() string {
	var b strings.Builder
	if v, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		fmt.Fprintf(&b, "Linux %s", strings.TrimSpace(string(v)))
	}
	fmt.Fprintf(&b, ", %d CPUs", runtime.NumCPU())
	if data, err := os.ReadFile("/proc/uptime"); err == nil {
		var up float64
		if _, err := fmt.Sscan(string(data), &up); err == nil {
			fmt.Fprintf(&b, ", up %s", (time.Duration(up) * time.Second).Round(time.Minute))
		}
	}
	return b.String()
}

// ReadProfile reads a calibrated profile (ferry-lab calibrate's file).
func ReadProfile(path string) (model.Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return model.Profile{}, fmt.Errorf("profile: %w", err)
	}
	p, err := model.ParseProfile(data)
	if err != nil {
		return p, fmt.Errorf("profile %s: %w", path, err)
	}
	return p, nil
}

// Predict fills each run's prediction from profile: the model's plan for
// the run's mode, from the memory the migration found, the dirty rate its
// point's pre-copy rounds measured (memhog: the rate it was set to) and
// the link. The model predicts the downtime; a client is expected to feel
// that downtime, so it is the client's prediction too. It holds --mode
// auto to the results as well (CheckAuto, res.BudgetMs).
func Predict(res *Results, profile model.Profile) {
	measured := map[Point][]float64{}
	for _, r := range res.Runs {
		if r.DirtyRateMeasured > 0 {
			q := r.Point
			q.Mode = ""
			measured[q] = append(measured[q], r.DirtyRateMeasured)
		}
	}
	for i := range res.Runs {
		r := &res.Runs[i]
		if !r.OK || r.MemoryBytes == 0 {
			r.Predicted = nil
			continue
		}
		rate := float64(r.DirtyRate)
		if workloads[r.Workload].service != nil {
			q := r.Point
			q.Mode = ""
			rate = Median(measured[q])
		}
		mode, rounds, _ := SplitMode(r.Mode)
		in := model.Inputs{MemoryBytes: float64(r.MemoryBytes), DirtyRatePagesPerSec: rate, BandwidthBps: float64(r.BandwidthBps) / 8, MaxRounds: rounds,
			SharedBytes: float64(r.SharedBytes), RootfsBytes: float64(r.RootfsBytes)}
		preds, _, _, _ := model.Best(profile, in, 0)
		for _, pr := range preds {
			if pr.Mode == mode {
				r.Predicted = &Prediction{TotalMs: pr.TotalMs, DowntimeMs: pr.DowntimeMs, ClientDowntimeMs: pr.DowntimeMs}
			}
		}
	}
	res.Auto = CheckAuto(*res, profile, res.BudgetMs)
}

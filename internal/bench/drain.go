package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ferry-migrate/ferry/internal/runresult"

	agentclient "github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/drain"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// DrainOptions is `ferry-lab bench drain`: N memhog containers on h1, all moved
// to h2 by one drain, each watched by its own probe from h3, against one
// of them moved cold alone.
type DrainOptions struct {
	Containers   int
	MemoryBytes  int64
	DirtyRate    int
	BandwidthBps int64
	Mode         string
	Precopy      engine.PrecopyOptions
	Concurrency  int
	Handoff      string // engine.HandoffCommit or HandoffFreeze
	FerryBin     string
	Log          io.Writer
}

// DrainRun is one container's migration within the drain.
type DrainRun struct {
	Container        string  `json:"container"`
	OK               bool    `json:"ok"`
	StateOK          bool    `json:"state_ok"`
	DowntimeMs       float64 `json:"downtime_ms"`
	ClientDowntimeMs float64 `json:"client_downtime_ms"`
	TotalMs          float64 `json:"total_ms"`
	// VsCold is the client downtime against the cold reference's.
	VsCold float64 `json:"vs_cold"`
	// StartMs is when the migration started, from the drain's start; with
	// its phases, how the migrations overlapped.
	StartMs float64            `json:"start_ms"`
	Phases  []engine.PhaseSpan `json:"phases,omitempty"`
	Error   string             `json:"error,omitempty"`
}

// DrainResult is what `ferry-lab bench drain --json` prints.
type DrainResult struct {
	Containers  int     `json:"containers"`
	MemoryBytes int64   `json:"memory_bytes"`
	DirtyRate   int     `json:"dirty_rate"`
	Mode        string  `json:"mode"`
	Handoff     string  `json:"handoff,omitempty"`
	LinkBps     float64 `json:"link_bps"`
	TotalMs     float64 `json:"total_ms"`
	// FloorMs is all of the memory at the link's measured throughput;
	// Ratio is TotalMs over it.
	FloorMs float64 `json:"floor_ms"`
	Ratio   float64 `json:"ratio"`
	// ColdClientDowntimeMs: one container of the same size moved cold,
	// alone, before the drain.
	ColdClientDowntimeMs float64    `json:"cold_client_downtime_ms"`
	Runs                 []DrainRun `json:"runs"`
	OK                   bool       `json:"ok"`
}

func (o DrainOptions) logf(format string, args ...any) { logTo(o.Log, format, args...) }

// memhog on its own port, so that several share a lab host's network.
func (o DrainOptions) memhogArgs(port int) []string {
	return memhogArgs(o.MemoryBytes, o.DirtyRate, port)
}

// Drain runs the drain benchmark.
func Drain(ctx context.Context, o DrainOptions) (res DrainResult, err error) {
	if o.Containers < 1 {
		return res, fmt.Errorf("--containers must be 1 or more")
	}
	res = DrainResult{Containers: o.Containers, MemoryBytes: o.MemoryBytes, DirtyRate: o.DirtyRate, Mode: o.Mode, Handoff: o.Handoff, Runs: []DrainRun{}}
	o.logf("bringing up a 3-host lab (bandwidth %d bit/s)", o.BandwidthBps)
	l, down, err := upLab(ctx, lab.Options{Hosts: 3, BandwidthBps: o.BandwidthBps, FerryBin: o.FerryBin})
	if err != nil {
		return res, err
	}
	defer down(&err)
	src, dst, client := &l.Hosts[0], &l.Hosts[1], &l.Hosts[2]
	if res.LinkBps, err = lab.MeasureLinkThroughput(ctx, l, src.Name, dst.Name, 3*time.Second); err != nil {
		return res, fmt.Errorf("link: %w", err)
	}
	ready := MigrateOptions{MemoryBytes: o.MemoryBytes * int64(o.Containers)}.readyTimeout()
	addrs := func(port int) []string {
		return []string{fmt.Sprintf("%s:%d", src.Addr, port), fmt.Sprintf("%s:%d", dst.Addr, port)}
	}
	remove := func(name string) {
		cctx := context.WithoutCancel(ctx)
		_ = l.RemoveFrom(cctx, "runc", src.Name, name)
		_ = l.RemoveFrom(cctx, "runc", dst.Name, name)
	}

	o.logf("reference: one container moved cold, alone")
	const ref = "memhog-cold"
	defer remove(ref)
	if err := l.Run(ctx, src.Name, ref, o.memhogArgs(workloadPort)); err != nil {
		return res, err
	}
	p, _, err := StartProbe(ctx, client, o.FerryBin, addrs(workloadPort), ready)
	if err != nil {
		return res, err
	}
	time.Sleep(300 * time.Millisecond)
	rep, merr := agentclient.Migrate(ctx, agentclient.Socket(src.ControlSock), engine.Request{Container: ref, To: dst.AgentAddr, Mode: engine.ModeCold}, nil)
	time.Sleep(300 * time.Millisecond)
	pr, perr := p.Stop()
	if merr != nil || !rep.OK || perr != nil {
		return res, fmt.Errorf("cold reference: %v %s %v", merr, rep.Error, perr)
	}
	res.ColdClientDowntimeMs = pr.ClientDowntimeMs
	remove(ref)

	names := make([]string, o.Containers)
	probes := make([]*ProbeProc, o.Containers)
	for i := range names {
		names[i] = fmt.Sprintf("memhog-%d", i+1)
		defer remove(names[i])
		if err := l.Run(ctx, src.Name, names[i], o.memhogArgs(workloadPort+1+i)); err != nil {
			return res, err
		}
	}
	for i := range names {
		if probes[i], _, err = StartProbe(ctx, client, o.FerryBin, addrs(workloadPort+1+i), ready); err != nil {
			return res, err
		}
	}
	time.Sleep(300 * time.Millisecond)
	o.logf("draining %d containers of %d MiB (%s, %d at once)", o.Containers, o.MemoryBytes>>20, o.Mode, o.Concurrency)
	dr, derr := drain.Run(ctx, drain.Options{From: agentclient.Socket(src.ControlSock), To: dst.AgentAddr, Containers: names, Concurrency: o.Concurrency, Handoff: o.Handoff,
		Request: engine.Request{Mode: o.Mode, Precopy: o.Precopy}})
	time.Sleep(300 * time.Millisecond)
	res.TotalMs, res.OK = dr.TotalMs, dr.OK && derr == nil
	res.FloorMs = runresult.LinkFloorMs(o.MemoryBytes*int64(o.Containers), res.LinkBps)
	if res.FloorMs > 0 {
		res.Ratio = res.TotalMs / res.FloorMs
	}
	for i, name := range names {
		r := DrainRun{Container: name}
		for j, rep := range dr.Reports {
			if rep.Container == name {
				r.OK, r.DowntimeMs, r.TotalMs, r.Error = rep.OK, rep.DowntimeMs, rep.TotalMs, rep.Error
				r.StartMs, r.Phases = dr.StartMs[j], rep.Phases
			}
		}
		pr, err := probes[i].Stop()
		if err != nil {
			r.Error += " " + err.Error()
		}
		r.StateOK, r.ClientDowntimeMs = pr.StateOK, pr.ClientDowntimeMs
		if res.ColdClientDowntimeMs > 0 {
			r.VsCold = r.ClientDowntimeMs / res.ColdClientDowntimeMs
		}
		res.OK = res.OK && r.OK && r.StateOK
		res.Runs = append(res.Runs, r)
	}
	return res, nil
}

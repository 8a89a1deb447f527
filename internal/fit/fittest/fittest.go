// Package fittest makes migrations for the fit's and the calibration's
// tests: runs that follow a profile exactly, as the lab would measure
// them if the model's form were the truth.
package fittest

import (
	"math"
	"testing"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/runresult"
)

// Truth is a host for Bench to pretend to measure.
func Truth() model.Profile {
	p := model.DefaultProfile()
	p.FreezeS = 0.004
	p.DumpFixedS = 0.12
	p.DumpBps = 500e6
	p.ReadHashBps = 3e9
	p.RestoreFixedS = 0.15
	p.RestoreBps = 2e9
	p.LazySetupS = 0.08
	p.LazyBps = 300e6
	p.LazyRequestS = 0.0004
	p.LazySerialShare = 0.3
	p.FaultS = 0.0005
	p.FaultWaitS = 0 // writes fault freely; TestFitFaultWait covers the bound
	p.LocalFillBps = 700e6
	p.ImageFillBps = 1.5e9
	p.FrozenReadBps = 4e9
	p.LazyDump = false // pre-copy switches over with a full dump unless a test says otherwise
	p.RedirtyRatio = 0.05
	p.LinkEfficiency = 0.9
	return p
}

// phases lays spans end to end.
type phases struct {
	t    float64
	list []api.PhaseSpan
}

// Span is the seconds from the start of phase from to the end of phase
// to.
func (ps *phases) Span(from, to string) float64 {
	var start, end float64
	for _, p := range ps.list {
		if p.Name == from {
			start = p.StartMs
		}
		if p.Name == to {
			end = p.EndMs
		}
	}
	return (end - start) / 1000
}

// Add puts a phase of s seconds after the last.
func (ps *phases) Add(name string, s float64) {
	ps.list = append(ps.list, api.PhaseSpan{Name: name, StartMs: ps.t * 1000, EndMs: (ps.t + s) * 1000})
	ps.t += s
}

// Bench measures a point as the lab would if the model's form were the
// truth: repeat runs whose phases follow the profile exactly. noise adds
// a deterministic wobble of that many seconds to the memory-dependent
// phases, varying from run to run across the calls.
func Bench(p model.Profile, noise float64) func(mode string, memoryBytes int64, dirtyRate int, bandwidthBps int64, repeat int) runresult.MigrateResult {
	k := 0
	return func(mode string, memoryBytes int64, dirtyRate int, bandwidthBps int64, repeat int) runresult.MigrateResult {
		o := runresult.MigrateResult{Mode: mode, MemoryBytes: memoryBytes, DirtyRate: dirtyRate, BandwidthBps: bandwidthBps}
		res := o
		m := float64(o.MemoryBytes)
		wire := 0.0 // unshaped: the link costs nothing
		if o.BandwidthBps > 0 {
			wire = m / (p.LinkEfficiency * float64(o.BandwidthBps) / 8)
			res.Baselines.Link = &runresult.LinkBaseline{ThroughputBps: 0.95 * float64(o.BandwidthBps)}
		}
		for range max(repeat, 1) {
			k++
			wob := noise * float64(k%3-1)
			var ps phases
			r := runresult.Run{OK: true, StateOK: true}
			ps.Add("prepare", 0.02)
			ps.Add("rootfs-sync", 0.03)
			switch o.Mode {
			case "cold":
				ps.Add("freeze", p.FreezeS)
				ps.Add("dump", p.DumpFixedS-0.01+m/p.DumpBps+wob)
				ps.Add("images", 0.01)
				ps.Add("restore", p.RestoreFixedS+m/p.RestoreBps-wob)
				r.RestoreMs = (p.RestoreFixedS - 0.05 + m/p.RestoreBps) * 1000
				ps.Add("commit", 0.005)
			case "precopy":
				d0 := m/p.ReadHashBps + wire + wob
				d1 := m/p.ReadHashBps - wob
				ps.Add("round-0", d0)
				ps.Add("round-1", d1)
				r.Rounds = []api.Round{{Index: 0, DurationMs: d0 * 1000, Bytes: o.MemoryBytes},
					{Index: 1, DurationMs: d1 * 1000, Bytes: 1 << 20, Pages: 256, RawBytes: 256 * 4096},
					{Index: 2, DurationMs: d1 * 1000, Bytes: 1 << 10, Pages: 100, RawBytes: int64(100 * 4096 * p.RedirtyRatio)}}
				ps.Add("freeze", p.FreezeS)
				if p.LazyDump {
					// Rebuild: a memory-less dump alongside the frozen last
					// round, the image fill, then the restore.
					r.Rounds = append(r.Rounds, api.Round{Index: 3, DurationMs: m / p.FrozenReadBps * 1000, Final: true})
					ps.Add("dump", max(p.DumpFixedS-0.01, m/p.FrozenReadBps))
					ps.Add("images", 0.01)
					r.FillMs = m / p.ImageFillBps * 1000
					ps.Add("restore", m/p.ImageFillBps+p.RestoreFixedS+m/p.RestoreBps)
				} else {
					ps.Add("dump", p.DumpFixedS-0.01+m/p.DumpBps+m/p.ReadHashBps+wob)
					ps.Add("images", 0.01)
					ps.Add("restore", p.RestoreFixedS+m/p.RestoreBps)
				}
				ps.Add("commit", 0.005)
			case "postcopy":
				ps.Add("freeze", p.FreezeS)
				ps.Add("dump", p.DumpFixedS)
				ps.Add("restore", p.RestoreFixedS+p.LazySetupS)
				ps.Add("commit", 0.005)
				link := p.LinkEfficiency * float64(o.BandwidthBps) / 8 // 0: unshaped
				pull := p.LazyPull(m, link, float64(o.DirtyRate))
				ps.Add("lazy-pages", pull-0.005+wob)
				r.PagesFaulted = uint64(p.FaultRate(float64(o.DirtyRate), 0.5) * pull)
			case "hybrid":
				d0 := m/p.ReadHashBps + wire + wob
				ps.Add("round-0", d0)
				r.Rounds = []api.Round{{Index: 0, DurationMs: d0 * 1000, Bytes: o.MemoryBytes},
					{Index: 1, DurationMs: m / p.FrozenReadBps * 1000, Final: true}}
				ps.Add("freeze", p.FreezeS)
				ps.Add("dump", p.DumpFixedS)
				ps.Add("restore", p.RestoreFixedS+p.LazySetupS)
				ps.Add("commit", 0.005)
				ps.Add("lazy-pages", m/p.LocalFillBps-0.005+wob)
			}
			r.TotalMs = ps.t * 1000
			ps.Add("cleanup", 0.05)
			r.Phases = ps.list
			r.DowntimeMs = ps.Span("freeze", "restore") * 1000
			r.ClientDowntimeMs = r.DowntimeMs + 10
			res.Runs = append(res.Runs, r)
		}
		res.MedianTotalMs = res.Runs[0].TotalMs
		res.MedianDowntimeMs = res.Runs[0].DowntimeMs
		res.MedianClientDowntimeMs = res.Runs[0].ClientDowntimeMs
		return res
	}
}

// Near fails the test unless got is within rel of want.
func Near(t *testing.T, name string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*math.Abs(want) {
		t.Errorf("%s = %.6g, want %.6g (±%.1g)", name, got, want, rel)
	}
}

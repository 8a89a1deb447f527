package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/units"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure migrations in an emulated lab",
	}
	cmd.AddCommand(newBenchMigrateCmd(), newBenchFaultsCmd(), newBenchHostileCmd(), newBenchSoakCmd(), newBenchDrainCmd(), newValidateModelCmd())
	return cmd
}

func newBenchMigrateCmd() *cobra.Command {
	var (
		o                 bench.MigrateOptions
		memory, bandwidth string
		againstMemory     string
		cutAt, maxBW      string
		outage            string
		asJSON            bool
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Migrate a memory-hungry workload between two lab hosts and measure it",
		Long: `bench migrate brings up a lab (source h1, destination h2, a probing client
h3) with links shaped to --bandwidth, starts memhog holding --memory of
pseudo-random data and dirtying --dirty-rate pages per second, waits until its
memory is filled, migrates it from h1 to h2 while the client polls it every
5 ms, and tears the lab down. It repeats that --repeat times and reports each
run and the medians.

client_downtime_ms is the longest gap the client saw without an answer
(client_gap_from_ms and client_gap_to_ms place it on the phases' clock);
state_ok says the workload's counter carried on and its memory digest checks.

Baselines, measured in the same lab: link (plain TCP throughput h1 -> h2;
with it each run's total is also given over the link floor, --memory at
that throughput, the least any technique can take: total_vs_link)
and podman (podman checkpoint --export, copy over the link, podman restore
--import, the way the research this tool grew from did it).

--against-memory runs a second workload size in the same lab, each repeat
migrating one of each in turn, so that both sizes share the machine's
drift; client_downtime_ratio is its median client downtime over --memory's
(1.0: the downtime does not grow with memory).`,
		Example: `  ferry-lab bench migrate --mode cold --memory 256M --dirty-rate 100 --bandwidth 1gbit --repeat 5 --baseline link,podman --json
  ferry-lab bench migrate --mode precopy --memory 256M --against-memory 1G --dirty-rate 1000 --repeat 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.MemoryBytes, o.BandwidthBps, err = parseLoad(memory, bandwidth); err != nil {
				return err
			}
			if againstMemory != "" {
				if o.AgainstMemoryBytes, err = units.ParseBytes(againstMemory); err != nil || o.AgainstMemoryBytes <= 0 {
					return fmt.Errorf("--against-memory: give a size, e.g. 1G")
				}
			}
			if cutAt != "" {
				v, err := strconv.ParseFloat(strings.TrimSuffix(cutAt, "%"), 64)
				if err != nil || v <= 0 || v >= 100 {
					return fmt.Errorf("--cut-path-at: give a share of the memory between 0 and 100%%, e.g. 30%%")
				}
				o.CutPathAt = v / 100
			}
			if outage != "" {
				d, share, ok := strings.Cut(outage, "@")
				v, err1 := strconv.ParseFloat(strings.TrimSuffix(share, "%"), 64)
				dur, err2 := time.ParseDuration(d)
				if !ok || err1 != nil || err2 != nil || dur <= 0 || v <= 0 || v >= 100 {
					return fmt.Errorf("--outage: give DURATION@SHARE, e.g. 10s@30%%")
				}
				o.Outage, o.OutageAt = dur, v/100
			}
			if maxBW != "" {
				if o.MaxBandwidthBps, err = units.ParseRate(maxBW); err != nil {
					return fmt.Errorf("--max-bandwidth: %w", err)
				}
			}
			if o.FerryBin, err = lab.FerryBin(); err != nil {
				return err
			}
			o.Log = os.Stderr
			if asJSON {
				o.Log = io.Discard
			}
			res, err := bench.Migrate(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				if err := cli.PrintJSON(res); err != nil {
					return err
				}
			} else {
				printBench(os.Stdout, res)
				if a := res.Against; a != nil {
					printBench(os.Stdout, *a)
					fmt.Fprintf(os.Stdout, "client downtime, %s against %s (medians): %.2f\n", cli.HumanBytes(a.MemoryBytes), cli.HumanBytes(res.MemoryBytes), res.ClientDowntimeRatio)
				}
			}
			runs := res.Runs
			if res.Against != nil {
				runs = append(slices.Clone(runs), res.Against.Runs...)
			}
			for _, r := range runs {
				if !r.OK {
					return cli.ExitError{Code: cli.ExitFailed} // a run failed: say so to scripts
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Mode, "mode", engine.ModeCold, "technique: cold, precopy, postcopy, hybrid")
	f.StringVar(&o.Runtime, "runtime", "runc", "runtime the workload runs under: "+runtime.JoinKinds(lab.RunnableKinds(), "or")+" (runc: the lab's own bundles; the others each lab host's own instance); ferry check lists the modes each supports. kubernetes: a memhog Deployment's pod moved by a Migration through ferry-controller in the lab's cluster (lab up --kubernetes; built by scripts/kube-build.sh), each run followed by the same migration under plain containerd, and Kubernetes' delete-and-recreate measured once (its state lost)")
	cli.AddPrecopyFlags(cmd, &o.Precopy)
	f.StringVar(&memory, "memory", "256M", "workload memory (64M, 1G, ...)")
	f.StringVar(&againstMemory, "against-memory", "", "also migrate a workload of this size in each repeat, alternating, and give its client downtime over --memory's")
	f.IntVar(&o.DirtyRate, "dirty-rate", 100, "pages the workload dirties per second")
	f.StringVar(&bandwidth, "bandwidth", "1gbit", "link rate between lab hosts (1gbit, 100mbit; empty = unshaped)")
	f.IntVar(&o.Repeat, "repeat", 3, "migrations to run")
	f.StringSliceVar(&o.Baselines, "baseline", nil, "baselines to measure: link, podman, paths (one path vs MPTCP vs striped TCP over --paths)")
	f.BoolVar(&asJSON, "json", false, "print JSON only")
	f.DurationVar(&o.RTT, "rtt", 0, "round trip between the source and the destination (the lab's delay lines, half on each host's link; 0: none)")
	f.IntVar(&o.Paths, "paths", 1, "independent paths between the lab hosts; 2 or more: the agents use MPTCP over all")
	f.IntVar(&o.Streams, "streams", 0, "agents without MPTCP: stripe each session over this many TCP connections, spread over the paths")
	f.StringVar(&cutAt, "cut-path-at", "", "take the source's first path down once this share of the memory was sent (e.g. 30%)")
	f.StringVar(&maxBW, "max-bandwidth", "", "cap the migration's sending rate (e.g. 500mbit)")
	f.StringVar(&outage, "outage", "", "take every path of the source down for DURATION once SHARE of the memory was sent: DURATION@SHARE, e.g. 10s@30%")
	f.DurationVar(&o.OutageTimeout, "outage-timeout", 0, "the agents' --outage-timeout (default theirs, 30s)")
	f.BoolVar(&o.TCPClient, "tcp-client", false, "give the workload its own address and hold one TCP connection to it from a third host (a line every 10 ms, echoed): report the longest wait that client saw, against the downtime (runc only)")
	f.StringVar(&o.Network, "network", "host", "the workload's network: host (its host's), bridge (the runtime's default bridge, the probe's port published; docker and podman)")
	f.Var(units.BytesVar(&o.VolumeBytes), "volume", "give the workload a named volume holding this much, written while it runs; each run says whether it checked out (volume_ok; docker and podman)")
	f.Var(units.BytesVar(&o.VolumeRateBps), "volume-rate", "bytes per second the workload writes into --volume (default 1M)")
	return cmd
}

func printBench(w io.Writer, r bench.MigrateResult) {
	fmt.Fprintf(w, "%s migration, %s memory, %d pages/s dirtied, link %s\n",
		r.Mode, cli.HumanBytes(r.MemoryBytes), r.DirtyRate, cli.HumanRate(float64(r.BandwidthBps)))
	vsLink := func(x float64) string {
		if x == 0 {
			return ""
		}
		return fmt.Sprintf(" (%.2f x the link floor)", x)
	}
	if r.Network == "bridge" || r.VolumeBytes > 0 {
		fmt.Fprintf(w, "  network %s, volume %s\n", r.Network, cli.HumanBytes(r.VolumeBytes))
	}
	for i, run := range r.Runs {
		vol := ""
		if run.VolumeOK != nil {
			vol = fmt.Sprintf(", volume_ok=%v (%s live, %s frozen)", *run.VolumeOK, cli.HumanBytes(run.VolumeBytes), cli.HumanBytes(run.FrozenVolumeBytes))
		}
		fmt.Fprintf(w, "  run %d: ok=%v downtime %.0f ms, client downtime %.0f ms, total %.0f ms%s, sent %s, state_ok=%v%s %s\n",
			i+1, run.OK, run.DowntimeMs, run.ClientDowntimeMs, run.TotalMs, vsLink(run.TotalVsLink), cli.HumanBytes(run.BytesSent), run.StateOK, vol, run.Error)
	}
	fmt.Fprintf(w, "  median: downtime %.0f ms, client downtime %.0f ms, total %.0f ms%s\n",
		r.MedianDowntimeMs, r.MedianClientDowntimeMs, r.MedianTotalMs, vsLink(r.MedianTotalVsLink))
	if r.MedianTCPStallMs > 0 {
		fmt.Fprintf(w, "  TCP client's longest wait (median): %.0f ms = %.2f x downtime\n", r.MedianTCPStallMs, r.MedianTCPStallMs/max(r.MedianDowntimeMs, 1))
	}
	if b := r.Baselines.Link; b != nil {
		fmt.Fprintf(w, "  link baseline: %s; %s of memory and volume need %.0f ms at that rate (the link floor)\n", cli.HumanRate(b.ThroughputBps), cli.HumanBytes(r.MemoryBytes+r.VolumeBytes), r.LinkFloorMs)
	}
	if b := r.Baselines.Paths; b != nil {
		fmt.Fprintf(w, "  paths baseline: one path %s, MPTCP over %d paths %s (x%.2f), striped TCP %s (x%.2f)\n",
			cli.HumanRate(b.SinglePathBps), r.Paths, cli.HumanRate(b.MultipathBps), b.Ratio, cli.HumanRate(b.StripedBps), b.StripedRatio)
	}
	if b := r.Baselines.Podman; b != nil {
		fmt.Fprintf(w, "  podman baseline: downtime %.0f ms (checkpoint %.0f, copy %.0f, restore %.0f), client downtime %.0f ms, state_ok=%v %s\n",
			b.DowntimeMs, b.CheckpointMs, b.CopyMs, b.RestoreMs, b.ClientDowntimeMs, b.StateOK, b.Error)
	}
}

// parseLoad reads a bench's --memory (a size) and --bandwidth (a rate;
// empty leaves the lab's links unshaped, 0).
func parseLoad(memory, bandwidth string) (memoryBytes, bandwidthBps int64, err error) {
	if memoryBytes, err = units.ParseBytes(memory); err != nil {
		return 0, 0, fmt.Errorf("--memory: %w", err)
	}
	if bandwidth != "" {
		if bandwidthBps, err = units.ParseRate(bandwidth); err != nil {
			return 0, 0, fmt.Errorf("--bandwidth: %w", err)
		}
	}
	return memoryBytes, bandwidthBps, nil
}

package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
)

func newBenchDrainCmd() *cobra.Command {
	var (
		o                 bench.DrainOptions
		memory, bandwidth string
	)
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Move several live workloads off a host at once and measure the whole",
		Long: `bench drain brings up a lab (h1, h2, a probing client h3), measures the link,
moves one memhog of --memory cold from h1 to h2 alone (the reference), then
starts --containers memhogs on h1, each watched by its own probe, and moves
them all with one drain (ferry drain). It prints JSON: the drain's total
against all the memory at the link's throughput (ratio), and per container
its downtime and its client's downtime against the cold reference's
(vs_cold). It exits non-zero when a migration failed or a state broke.`,
		Example: `  ferry-lab bench drain --containers 4 --memory 256M --dirty-rate 100 --bandwidth 1gbit --mode precopy`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.MemoryBytes, o.BandwidthBps, err = parseLoad(memory, bandwidth); err != nil {
				return err
			}
			if o.FerryBin, err = lab.FerryBin(); err != nil {
				return err
			}
			o.Log = os.Stderr
			res, err := bench.Drain(cmd.Context(), o)
			if jerr := cli.PrintJSON(res); jerr != nil {
				return jerr
			}
			if err != nil {
				return err
			}
			if !res.OK {
				return cli.ExitError{Code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Containers, "containers", 4, "workloads to drain")
	f.StringVar(&memory, "memory", "256M", "each workload's memory")
	f.IntVar(&o.DirtyRate, "dirty-rate", 100, "pages each workload dirties per second")
	f.StringVar(&bandwidth, "bandwidth", "1gbit", "link rate between lab hosts (empty = unshaped)")
	f.StringVar(&o.Mode, "mode", engine.ModePrecopy, "technique for every workload")
	f.IntVar(&o.Concurrency, "concurrency", 1, "migrations whose memory crosses at once (see ferry drain --help)")
	f.StringVar(&o.Handoff, "handoff", engine.HandoffCommit, "when a pre-copy or hybrid migration lets the next one's memory cross: commit or freeze (see ferry drain --help)")
	cli.AddPrecopyFlags(cmd, &o.Precopy)
	return cmd
}

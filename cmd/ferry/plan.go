package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/units"
)

// planOutput is `ferry plan --json`.
type planOutput struct {
	Predictions []model.Prediction `json:"predictions"`
	Feasible    []string           `json:"feasible"`
	Recommended string             `json:"recommended"`
	Reason      string             `json:"reason"`
	Profile     string             `json:"profile"`
	// Network says what the move does to the container's address and
	// connections (--network).
	Network string `json:"network,omitempty"`
}

func newPlanCmd() *cobra.Command {
	var (
		memory, bandwidth, profilePath string
		runtimeKind, netKind           string
		volume                         int64
		dirtyRate                      float64
		shared, rootfsDelta            int64
		maxDowntime                    time.Duration
		asJSON, learned                bool
		src                            agentFlags
	)
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Predict each technique's downtime and total time, and pick one",
		Long: `plan predicts, for a container of --memory that dirties --dirty-rate pages per
second, moved over a link of --bandwidth, the downtime, total migration time
and bytes of every technique (and the best number of rounds for pre-copy and
hybrid), says which fit --max-downtime, and recommends one with the reason.
It exits with status 1 when no technique fits the budget.

--runtime says which runtime the container runs under, for what its
restore can do: docker copies the images into containerd before it restores them
(all of memory in cold and pre-copy, none in the lazy modes), which costs
downtime; runc, podman and containerd read them in place.

Predictions come from the models in docs/MODEL.md with a host profile:
--profile FILE from 'ferry-lab calibrate', --learned for the one the host's
agent refitted from its migrations, or defaults measured on ferry's
development machine. Each comes with its interval (about 8 migrations in
10 fall inside it), and --max-downtime is judged by its upper bound.`,
		Example: `  ferry plan --memory 256M --dirty-rate 1000 --bandwidth 1gbit
  ferry plan --memory 24M --shared 100M --rootfs 224M --dirty-rate 200 --bandwidth 1gbit   # PostgreSQL
  ferry plan --memory 1G --dirty-rate 5000 --bandwidth 100mbit --max-downtime 500ms --json
  ferry plan --memory 256M --dirty-rate 100 --bandwidth 1gbit --runtime docker --max-downtime 1s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mem, err := units.ParseBytes(memory)
			if err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			bps, err := units.ParseRate(bandwidth)
			if err != nil || bps <= 0 {
				return fmt.Errorf("--bandwidth: give a rate such as 1gbit or 100mbit (%v)", err)
			}
			if dirtyRate < 0 {
				return fmt.Errorf("--dirty-rate must not be negative")
			}
			prof, from, err := cli.LoadProfile(profilePath)
			if learned {
				prof, from, err = learnedProfile(cmd.Context(), src)
			}
			if err != nil {
				return err
			}
			caps, err := planCaps(all.Registry, runtimeKind)
			if err != nil {
				return err
			}
			in := engine.PlanFor(model.Inputs{MemoryBytes: float64(mem), DirtyRatePagesPerSec: dirtyRate, BandwidthBps: float64(bps) / 8,
				SharedBytes: float64(shared), RootfsBytes: float64(rootfsDelta + volume)}, caps)
			out := plan(prof, in, maxDowntime)
			out.Profile = from
			switch netKind {
			case "", "host", "none", "segment":
			case "bridge":
				out.Network = engine.NetworkOutcome(runtime.Network{Name: "bridge", Driver: "bridge", HostLocal: true})
			default:
				return fmt.Errorf("--network: %q is not one of host, none, segment, bridge", netKind)
			}
			if asJSON {
				if err := cli.PrintJSON(out); err != nil {
					return err
				}
			} else {
				printPlan(os.Stdout, out)
			}
			if out.Recommended == "" {
				return cli.ExitError{Code: exitFailed} // nothing fits the budget
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&memory, "memory", "", "container memory (256M, 1G)")
	f.Float64Var(&dirtyRate, "dirty-rate", 0, "pages the container dirties per second")
	f.Var(units.BytesVar(&shared), "shared", "shared memory its processes hold (a database's buffers): dumped while frozen in every mode")
	f.Var(units.BytesVar(&rootfsDelta), "rootfs", "root filesystem bytes to send before the technique starts (its own layer, or its whole tree)")
	f.Var(units.BytesVar(&volume), "volume", "the data of the container's volumes: sent before the technique starts, as its root filesystem is")
	f.StringVar(&netKind, "network", "host", "how the container reaches its clients: host or none (its host's network), segment (a namespace of its own on a segment both hosts share: address and connections kept), bridge (a runtime's bridge network: a new address, connections closed)")
	f.StringVar(&bandwidth, "bandwidth", "", "link rate (1gbit, 100mbit)")
	f.StringVar(&profilePath, "profile", "", "host profile from 'ferry-lab calibrate' (default: built-in defaults)")
	f.DurationVar(&maxDowntime, "max-downtime", 0, "downtime budget (e.g. 500ms); 0: none")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVar(&learned, "learned", false, "plan with the profile the agent at --from learned from its migrations (instead of --profile)")
	src.add(cmd, "with --learned, the agent whose profile to plan with")
	f.StringVar(&runtimeKind, "runtime", "runc", "the container's runtime: "+all.Registry.KindList("or"))
	_ = cmd.MarkFlagRequired("memory")
	_ = cmd.MarkFlagRequired("bandwidth")
	return cmd
}

// planCaps is what a kind of runtime can do where CRIU's lazy pages work
// (and, for Docker, with ferry's ferry-runc runtime), as far as a plan
// cares.
func planCaps(reg *runtime.Registry, kind string) (runtime.Caps, error) {
	g, ok := reg.Get(kind)
	if !ok {
		return runtime.Caps{}, fmt.Errorf("--runtime: %q is not one of %s", kind, reg.KindList("or"))
	}
	return g.Caps(runtime.PlanFeatures), nil
}

func plan(p model.Profile, in model.Inputs, maxDowntime time.Duration) planOutput {
	preds, feasible, rec, reason := model.Best(p, in, float64(maxDowntime.Microseconds())/1000)
	if feasible == nil {
		feasible = []string{}
	}
	return planOutput{Predictions: preds, Feasible: feasible, Recommended: rec, Reason: reason}
}

func printPlan(w io.Writer, o planOutput) {
	fmt.Fprintf(w, "%-15s %6s %24s %24s %12s\n", "MODE", "ROUNDS", "DOWNTIME (P10-P90)", "TOTAL (P10-P90)", "SENT")
	for _, p := range o.Predictions {
		if math.IsNaN(p.DowntimeMs) {
			fmt.Fprintf(w, "%-15s %6s %24s %24s %12s  (%s)\n", p.Mode, "-", "-", "-", "-", p.Note)
			continue
		}
		fmt.Fprintf(w, "%-15s %6d %24s %24s %12s\n", p.Mode, p.Rounds, msInterval(p.DowntimeMs, p.DowntimeLowMs, p.DowntimeHighMs),
			msInterval(p.TotalMs, p.TotalLowMs, p.TotalHighMs), cli.HumanBytes(int64(p.Bytes)))
	}
	if o.Recommended == "" {
		fmt.Fprintf(w, "no technique fits: %s\n", o.Reason)
	} else {
		fmt.Fprintf(w, "recommended: %s (%s)\n", o.Recommended, o.Reason)
	}
	if o.Network != "" {
		fmt.Fprintf(w, "network: %s\n", o.Network)
	}
}

// msInterval is a prediction and its interval, in ms.
func msInterval(v, lo, hi float64) string {
	return fmt.Sprintf("%.0f ms (%.0f-%.0f)", v, lo, hi)
}

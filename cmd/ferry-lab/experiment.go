package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/renameio/v2"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/experiment"
	"github.com/ferry-migrate/ferry/internal/followlab"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/report"
)

func newLabExperimentCmd() *cobra.Command {
	var out, from, profile string
	var budget time.Duration
	var quiet bool
	cmd := &cobra.Command{
		Use:   "experiment FILE.yaml",
		Short: "Run a grid of migrations in the lab and write results and a report",
		Long: `experiment runs the grid an experiment file describes (workload x runtime
x mode x state size x dirty rate or load x bandwidth x repeats): for each
point it starts the workload on h1, fills it with that much state, loads it
from h3, migrates it to h2 and records what the migration and the client
measured. It writes, into --out:

  results.json   every run (saved after each one: an interrupted experiment
                 keeps what it measured)
  results.csv    one row per run, the client's latency and throughput split
                 before, during and after the migration
  report.html    a self-contained report: phase timelines, downtime against
                 state size, bytes per round, client latency and throughput
                 across the migration, predicted against measured (with a
                 profile), medians with 95 % confidence intervals

Workloads: memhog (ferry's own, probed), redis, memcached, mosquitto and
postgresql (Debian's packages, each in a root filesystem of its own built
once and cached, on an address of its own; their clients, ferry-lab lab-tool
load, run on h3 on connections they keep and check the state afterwards).

The file (YAML; every list is an axis, empty ones take the default):

  name: redis-modes
  workloads: [redis]            # memhog, redis, memcached, mosquitto, postgresql
  runtimes: [runc]              # services: runc; memhog also podman, lxc
  modes: [cold, precopy, postcopy, hybrid]   # precopy/1: at most one live round
  state_sizes: [64M, 256M]
  dirty_rates: [100]            # memhog: pages written per second
  loads: [200]                  # services: client requests per second
  bandwidths: [1gbit]
  repeats: 3
  before: 2s                    # client load before the migration
  after: 2s                     # and after it
  connections: 1                # a service client's kept connections
  tools: false                  # also the service's own benchmark beside it
                                # (redis-benchmark, pgbench, mosquitto_pub)
  profile: host.json            # optional: ferry-lab calibrate's profile
  budget: 500ms                 # with a profile: is --mode auto's pick the
                                # mode that measured best within this stall?

A file with "kind: follow" is a mobility scenario instead: edge hosts whose
round trip to a client (the lab's last host) follows a schedule, Redis with
its load client, and ferry follow moving it after the client. It writes
results.json (the round trips set, follow's events, the moves, the client's
timeline and the scores: mean_latency_ms against an oracle always on the
nearest host and a service that never moves) and report.html (on one time
axis the client's latency, which host served it, each decision and move):

  name: follow-drive
  kind: follow
  hosts: 3                      # edge hosts h1..h3; the client is h4
  start: h1
  duration: 120s
  schedule:                     # each host's round trip to the client, from "at" on
    - {at: 0s, rtt: {h1: 5ms, h2: 40ms, h3: 80ms}}
    - {at: 40s, rtt: {h1: 60ms, h2: 5ms, h3: 40ms}}
  noise: 0.2                    # every round trip jittered by up to ±20 %, anew each second
  follow: {threshold: 30ms, dwell: 5s, min_interval: 20s}

Shipped experiments are in the repository's experiments/ directory.
Needs root; tears down any lab already up.`,
		Example: `  ferry-lab lab experiment experiments/services.yaml --out /tmp/services
  ferry-lab lab experiment --from-results /tmp/services/results.json --profile ferry-profile.json --out /tmp/services`,
		Args: func(cmd *cobra.Command, args []string) error {
			if from != "" {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if from != "" {
				f, err := os.Open(from)
				if err != nil {
					return err
				}
				defer f.Close()
				res, err := experiment.ReadResults(f)
				if err != nil {
					return fmt.Errorf("%s: %w", from, err)
				}
				if cmd.Flags().Changed("budget") {
					res.BudgetMs = float64(budget) / float64(time.Millisecond)
				}
				if profile != "" {
					p, err := experiment.ReadProfile(profile)
					if err != nil {
						return err
					}
					experiment.Predict(&res, p)
				}
				if err := writeReport(out, res); err != nil {
					return err
				}
				if len(res.Auto) > 0 {
					fmt.Println(experiment.AutoSummary(res.Auto, res.BudgetMs))
				}
				return nil
			}
			data, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			if followlab.IsFollow(data) {
				return runFollowScenario(cmd, data, args[0], out, profile, quiet)
			}
			spec, err := experiment.ParseSpec(data)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if profile != "" {
				spec.Profile = profile
			}
			if cmd.Flags().Changed("budget") {
				spec.Budget = budget
			}
			if out == "" {
				out = "ferry-experiment-" + spec.Name
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			o := experiment.Options{Spec: spec, Checkpoint: func(res experiment.Results) error { return writeResults(out, res) }}
			if o.FerryBin, err = lab.FerryBin(); err != nil {
				return err
			}
			if !quiet {
				o.Log = os.Stderr
				if term.IsTerminal(int(os.Stderr.Fd())) {
					o.Log, o.Progress = nil, os.Stderr
				}
			}
			res, err := experiment.Execute(cmd.Context(), o)
			if werr := writeReport(out, res); werr != nil && err == nil {
				err = werr
			}
			if err != nil {
				return err
			}
			failed := 0
			for _, r := range res.Runs {
				if !r.OK || !r.StateOK {
					failed++
				}
			}
			fmt.Printf("%d runs (%d failed or lost state): %s\n", len(res.Runs), failed, filepath.Join(out, "report.html"))
			if len(res.Auto) > 0 {
				fmt.Println(experiment.AutoSummary(res.Auto, res.BudgetMs))
			}
			if failed > 0 {
				return cli.ExitError{Code: cli.ExitFailed}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory for results.json, results.csv and report.html (default ferry-experiment-NAME)")
	cmd.Flags().StringVar(&from, "from-results", "", "write the CSV and the report again from a results.json, running nothing")
	cmd.Flags().StringVar(&profile, "profile", "", "a calibrated profile (ferry-lab calibrate): each run gets the model's prediction (overrides the file's; with --from-results, predicts again)")
	cmd.Flags().DurationVar(&budget, "budget", 0, "the client stall --mode auto is held to (overrides the file's; with --from-results, checks again)")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress lines or bar")
	return cmd
}

// writeResults writes results.json and results.csv into dir.
func writeResults(dir string, res experiment.Results) error {
	if err := writeFileWith(filepath.Join(dir, "results.json"), res.WriteJSON); err != nil {
		return err
	}
	return writeFileWith(filepath.Join(dir, "results.csv"), res.WriteCSV)
}

// writeReport writes the results and report.html into dir.
func writeReport(dir string, res experiment.Results) error {
	if dir == "" {
		dir = "."
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeResults(dir, res); err != nil {
		return err
	}
	return writeFileWith(filepath.Join(dir, "report.html"), func(w io.Writer) error { return report.Write(w, res) })
}

// writeFileWith writes path through write, into a temporary file renamed
// into place, so that a reader never sees half of it.
func writeFileWith(path string, write func(io.Writer) error) error {
	f, err := renameio.NewPendingFile(path, renameio.WithPermissions(0o644))
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if err := write(f); err != nil {
		return err
	}
	return f.CloseAtomicallyReplace()
}

// runFollowScenario runs a follow scenario (package followlab) and writes
// its results and report into out.
func runFollowScenario(cmd *cobra.Command, data []byte, file, out, profile string, quiet bool) error {
	spec, err := followlab.ParseSpec(data)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if profile != "" {
		spec.Profile = profile
	}
	if out == "" {
		out = "ferry-experiment-" + spec.Name
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	o := followlab.Options{Spec: spec, Out: out}
	if o.FerryBin, err = lab.FerryBin(); err != nil {
		return err
	}
	if !quiet {
		o.Log = func(s string) { fmt.Fprintln(os.Stderr, s) }
	}
	res, err := followlab.Run(cmd.Context(), o)
	if err != nil {
		res.Error = err.Error()
	}
	werr := writeFileWith(filepath.Join(out, "results.json"), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	})
	if werr == nil {
		werr = writeFileWith(filepath.Join(out, "report.html"), func(w io.Writer) error { return report.WriteFollow(w, res) })
	}
	if err != nil {
		return errors.Join(err, werr)
	}
	if werr != nil {
		return werr
	}
	s := res.Scores
	fmt.Printf("%d moves; mean round trip %.1f ms, oracle %.1f ms (%.2fx), never moving %.1f ms (%.2fx): %s\n",
		s.Moves, s.MeanLatencyMs, s.OracleMeanLatencyMs, s.VsOracle, s.StaticMeanLatencyMs, s.StaticOver, filepath.Join(out, "report.html"))
	return nil
}

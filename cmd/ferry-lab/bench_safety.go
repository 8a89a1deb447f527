package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/units"
)

func newBenchFaultsCmd() *cobra.Command {
	var (
		o      bench.FaultsOptions
		memory string
		asJSON bool
		list   bool
	)
	cmd := &cobra.Command{
		Use:   "faults",
		Short: "Break migrations on purpose, in every phase, and check that no container runs twice or nowhere",
		Long: `bench faults brings up a lab (source h1, destination h2, a probing client
h3) and, for each technique x phase x fault, migrates memhog from h1 to h2
while the fault strikes, brings killed or stopped agents back (as systemd
would), waits for recovery and reports where the container ended up:

  running-at-source, running-at-destination   fine (state_ok says whether
                                              its client saw its state intact)
  running-twice                               the one thing that must never happen
  frozen-in-doubt                             a copy left frozen after recovery
  lost                                        running nowhere

and what was left behind once the container is removed: CRIU processes,
network namespaces, mounts, cgroups (Podman's and LXC's too), scratch
directories, Podman's and LXC's container storage, journal entries not
settled.

Phases: ` + strings.Join(fault.Phases, ", ") + `.
  rounds is pre-copy's second round; freeze strikes once the container is
  frozen, dump while CRIU dumps, commit once the source sent it.
Faults: ` + strings.Join(fault.Actions, ", ") + `.
  cut-link takes every path of the source down for the outage timeout + 3 s;
  scratch-full mounts a 64 KiB tmpfs over the destination's scratch space;
  strand-destination-criu kills the restore's CRIU alone (runc only), just
  after it forked the container's first task, which is left waiting for it.
Only the cases where a fault can strike are run (--list shows them).`,
		Example: `  ferry-lab bench faults --mode cold --json
  ferry-lab bench faults --runtime podman,lxc --fault kill-destination,kill-source
  ferry-lab bench faults --mode postcopy --phase lazy-pages
  ferry-lab bench faults --fault kill-destination,kill-source --list`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.MemoryBytes, err = units.ParseBytes(memory); err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			if list {
				for _, c := range bench.FaultMatrix(o.Runtimes, o.Modes, o.Phases, o.Actions) {
					fmt.Printf("%s\t%s\t%s@%s\n", c.Runtime, c.Mode, c.Fault, c.Phase)
				}
				return nil
			}
			if o.FerryBin, err = lab.FerryBin(); err != nil {
				return err
			}
			o.Log = os.Stderr // JSON or not: the matrix takes long, say how far it is
			res, err := bench.Faults(cmd.Context(), o)
			if len(res.Cases) == 0 {
				return err
			}
			// The cases that ran are printed even when the lab could not be
			// taken down, or the run was interrupted.
			if asJSON {
				if jerr := cli.PrintJSON(res); jerr != nil {
					return jerr
				}
			} else {
				printFaults(os.Stdout, res)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.Runtimes, "runtime", []string{"runc"}, "runtimes to run the workload in: "+strings.Join(lab.RunnableKinds(), ", "))
	f.StringSliceVar(&o.Modes, "mode", nil, "techniques (default all: cold, precopy, postcopy, hybrid)")
	f.StringSliceVar(&o.Phases, "phase", nil, "phases (default all)")
	f.StringSliceVar(&o.Actions, "fault", nil, "faults (default all)")
	f.StringVar(&memory, "memory", "64M", "workload memory")
	f.IntVar(&o.DirtyRate, "dirty-rate", 200, "pages the workload dirties per second")
	f.DurationVar(&o.OutageTimeout, "outage-timeout", 0, "the lab agents' --outage-timeout (default 3s, so link cuts outlast it quickly)")
	f.DurationVar(&o.Settle, "settle", 0, "how long to wait for recovery after each case (default 60s)")
	f.BoolVar(&asJSON, "json", false, "print JSON only")
	f.BoolVar(&list, "list", false, "list the cases and exit")
	f.BoolVar(&o.Address, "address", false, "give the workload an address of its own on the lab's segment (runc), probed there: the copy that runs must answer at it, and no host may keep its network namespace without it")
	return cmd
}

func printFaults(w io.Writer, r bench.FaultsResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUNTIME\tMODE\tPHASE\tFAULT\tOUTCOME\tSTATE\tRECOVERED\tLEAKS")
	for _, c := range r.Cases {
		st := "ok"
		if !c.StateOK {
			st = "BAD"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f s\t%s\n", c.Runtime, c.Mode, c.Phase, c.Fault, c.Outcome, st, c.RecoveredMs/1000, strings.Join(c.Leaks, ", "))
	}
	tw.Flush()
	s := r.Summary
	fmt.Fprintf(w, "%d cases: %d running twice, %d lost, %d frozen in doubt, %d with their state broken, %d hung, %d leaks\n",
		s.Cases, s.RunningTwice, s.Lost, s.FrozenInDoubt, s.StateBad, s.Hung, s.Leaks)
}

func newBenchSoakCmd() *cobra.Command {
	var (
		o      bench.SoakOptions
		memory string
	)
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Move one live workload back and forth many times and check that nothing grows or leaks",
		Long: `bench soak brings up a lab (h1, h2, a probing client h3), starts memhog on
h1 and migrates it h1 -> h2 -> h1 ... --migrations times, cycling through
--mode, while the client polls it. Afterwards it checks that every
migration worked, the workload's state held throughout, the agents'
resident memory and open files did not grow (compared after the first
tenth of the migrations and at the end), and nothing was left behind once
the container is removed (CRIU processes, network namespaces, mounts,
cgroups, scratch). It prints JSON and exits non-zero when a check fails.`,
		Example: `  ferry-lab bench soak --migrations 200
  ferry-lab bench soak --migrations 20 --mode cold,postcopy`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.MemoryBytes, err = units.ParseBytes(memory); err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			if o.FerryBin, err = lab.FerryBin(); err != nil {
				return err
			}
			o.Log = os.Stderr
			res, err := bench.Soak(cmd.Context(), o)
			if jerr := cli.PrintJSON(res); jerr != nil {
				return jerr
			}
			if err != nil {
				return err
			}
			if res.Failed > 0 || !res.StateOK || len(res.Leaks) > 0 || len(res.Growth) > 0 {
				return fmt.Errorf("soak failed: %d migrations failed, state_ok=%v, leaks %v, growth %v", res.Failed, res.StateOK, res.Leaks, res.Growth)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Migrations, "migrations", 200, "migrations to run, alternating h1 -> h2 and back")
	f.StringSliceVar(&o.Modes, "mode", nil, "techniques to cycle through (default cold, precopy, postcopy, hybrid)")
	f.StringVar(&memory, "memory", "64M", "workload memory")
	f.IntVar(&o.DirtyRate, "dirty-rate", 200, "pages the workload dirties per second")
	return cmd
}

func newBenchHostileCmd() *cobra.Command {
	var (
		o      bench.HostileOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "hostile",
		Short: "Attack an agent as a peer with a valid certificate would, and check it refuses everything and keeps serving",
		Long: `bench hostile brings up a lab (h1, h2) and, holding h1's certificate, sends
h2's agent what a compromised or malicious peer could: container names and
migration IDs that climb out of its directories, sizes and counts that lie,
addresses outside its segment, configurations that reach into the host
(hooks, host namespaces, bind mounts of host paths, capabilities, device
rules, unmasked kernel paths, writable sysfs and cgroupfs, host sysctls),
root filesystem and CRIU image streams whose entries climb out, a second
offer for a name in flight, a flood of offers, an offer that never
finishes, an unknown step. For each it reports whether h2 went ahead
(accepted), what it left behind (leaks: processes, namespaces, mounts,
cgroups, scratch directories, files written outside, h2's own container
touched) and whether its agent stopped serving (agent_down). At the end a
container moves from h1 to h2 the honest way.

Exit status 1 when a case was accepted, leaked or took the agent down, or
the honest migration failed.`,
		Example: `  ferry-lab bench hostile --json
  ferry-lab bench hostile --only config:`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.FerryBin, err = lab.FerryBin(); err != nil {
				return err
			}
			o.Log = os.Stderr
			res, err := bench.Hostile(cmd.Context(), o)
			if len(res.Cases) > 0 {
				if asJSON {
					if jerr := cli.PrintJSON(res); jerr != nil {
						return jerr
					}
				} else {
					printHostile(os.Stdout, res)
				}
			}
			if err != nil {
				return err
			}
			if s := res.Summary; s.Accepted+s.Leaks+s.AgentDown > 0 || !res.HonestOK {
				return cli.ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Only, "only", "", "run only the cases whose names contain this")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only")
	return cmd
}

func printHostile(w io.Writer, r bench.HostileResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tACCEPTED\tLEAKS\tAGENT\tANSWER")
	for _, c := range r.Cases {
		agentSt := "up"
		if c.AgentDown {
			agentSt = "DOWN"
		}
		answer, _, _ := strings.Cut(c.Refusal, "\n")
		if len(answer) > 100 {
			answer = answer[:100] + "..."
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\n", c.Name, c.Accepted, strings.Join(c.Leaks, ", "), agentSt, answer)
	}
	tw.Flush()
	s := r.Summary
	fmt.Fprintf(w, "%d cases: %d accepted, %d with leaks, %d took the agent down; honest migration after them: %v %s\n",
		s.Cases, s.Accepted, s.Leaks, s.AgentDown, r.HonestOK, r.Honest)
}

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/engine"
)

// followMigration runs a migration through the source agent and follows it
// to its report. The first interrupt cancels it (where the source can still
// resume; the report follows), a second one detaches; with detach it
// returns as soon as the agent gave the migration its ID. detached is that
// ID when the CLI left the migration running.
func followMigration(ctx context.Context, from client.Endpoint, req engine.Request, detach bool, accepted func(string), progress func(engine.Progress)) (rep engine.Report, detached string, err error) {
	fctx, leave := context.WithCancel(context.WithoutCancel(ctx))
	defer leave()
	ids := make(chan string, 1)
	var id string
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		interrupts := 0
		for {
			select {
			case <-fctx.Done():
				return
			case id = <-ids:
				if detach {
					leave()
					return
				}
			case <-sigs:
				interrupts++
				if interrupts > 1 || id == "" {
					leave()
					return
				}
				r, err := client.Cancel(fctx, from, id)
				switch {
				case err != nil:
					fmt.Fprintf(os.Stderr, "\ncancel %s: %v\n", id, err)
				case r.Cancelled:
					fmt.Fprintf(os.Stderr, "\ncancelling %s; Ctrl-C again to leave it and return\n", id)
				default:
					fmt.Fprintf(os.Stderr, "\n%s cannot be cancelled: %s\n", id, r.Reason)
				}
			}
		}
	}()
	var got string
	rep, err = client.MigrateJob(fctx, from, req, func(i string) {
		got = i
		if accepted != nil {
			accepted(i)
		}
		ids <- i
	}, progress)
	if fctx.Err() != nil && got != "" {
		return rep, got, nil
	}
	return rep, "", err
}

func newPsCmd() *cobra.Command {
	var (
		src         agentFlags
		all, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List the migrations a source agent runs (and, with --all, those it ran)",
		Long: `ps lists the migrations the agent at --from runs as their source: ID,
container, destination, technique, phase, bytes sent, rate and time so far.
With --all it adds the ended ones it kept (the last 200, across restarts)
with their outcome and downtime; ferry wait ID prints one's report.`,
		Example: `  ferry ps
  ferry ps --all --from h1
  ferry ps --from node1@192.0.2.1:7070 --tls-dir ~/.ferry/alice
  ferry ps --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			from, _, err := src.endpoints("")
			if err != nil {
				return err
			}
			js, err := client.Jobs(cmd.Context(), from, all)
			if err != nil {
				return err
			}
			if asJSON {
				if js == nil {
					js = []engine.Job{}
				}
				return cli.PrintJSON(js)
			}
			printJobs(os.Stdout, js, time.Now())
			return nil
		},
	}
	f := cmd.Flags()
	src.add(cmd, "the source agent")
	f.BoolVar(&all, "all", false, "also the ended migrations the agent kept")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printJobs prints jobs as a table.
func printJobs(w io.Writer, js []engine.Job, now time.Time) {
	if len(js) == 0 {
		fmt.Fprintln(w, "no migrations")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONTAINER\tTO\tMODE\tSTATE\tSENT\tRATE\tTIME")
	for _, j := range js {
		state, rate := j.Progress.Phase, cli.HumanRate(j.Progress.RateBps)
		elapsed := now.Sub(j.Started)
		sent := cli.HumanBytes(j.Progress.Bytes)
		if r := j.Report; r != nil {
			elapsed, rate = j.Ended.Sub(j.Started), "-"
			state = fmt.Sprintf("ok, downtime %.0f ms", r.DowntimeMs)
			switch {
			case r.Settled != "":
				state = "in doubt at " + r.FailedAt + ", settled: source " + r.SourceState // removed, resumed, lost or diverged
			case !r.OK:
				state = "failed at " + r.FailedAt
				if r.SourceState != "" {
					state += ", source " + r.SourceState // resumed, frozen (in doubt) or lost
				}
			}
			sent = cli.HumanBytes(r.BytesSent)
		}
		if state == "" {
			state = "starting"
		}
		if pr := j.Progress; j.Report == nil && pr.PredictedDowntimeMs > 0 {
			state += fmt.Sprintf(" (%d rounds, %.0f pages/s dirty, downtime now ~%.0f ms)", pr.Rounds, pr.DirtyRate, pr.PredictedDowntimeMs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.Container, j.To, j.Mode, state, sent, rate, elapsed.Round(100*time.Millisecond))
	}
	tw.Flush()
}

func newCancelCmd() *cobra.Command {
	var src agentFlags
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Abort a migration while its source can still resume the container",
		Long: `cancel asks the source agent (--from) to abort migration ID. Before the
commit the source resumes the container and the destination drops its copy;
the migration's report (ferry wait ID) says so. From the commit on the
destination owns the container, or may: such a migration is not cancelled,
and cancel says why. Exit status 1 when nothing was cancelled.`,
		Example: `  ferry cancel 3f2a9c0b71de`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, _, err := src.endpoints("")
			if err != nil {
				return err
			}
			r, err := client.Cancel(cmd.Context(), from, args[0])
			if err != nil {
				return err
			}
			if !r.Cancelled {
				fmt.Printf("%s not cancelled: %s\n", args[0], r.Reason)
				return cli.ExitError{Code: 1}
			}
			fmt.Printf("cancelling %s: the source resumes the container (ferry wait %s for the report)\n", args[0], args[0])
			return nil
		},
	}
	src.add(cmd, "the source agent")
	return cmd
}

func newResolveCmd() *cobra.Command {
	var (
		src    agentFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "resolve ID",
		Short: "Settle a migration left in doubt, by asking its destination",
		Long: `resolve settles migration ID, whose outcome its source could not know (ferry
migrate exited 3: the source copy stays frozen). The source agent (--from)
asks the destination what became of its copy, and does what the answer
calls for: the destination committed, so the frozen source copy is removed;
the destination has no copy, so the source copy resumes (its network back
on). While the destination cannot answer, nothing changes: the copy stays
frozen, and the agent keeps asking on its own.

Never resume an in-doubt copy with its runtime (runc resume, podman
unpause...): the destination may run the container already, and then it
would run twice. If the source copy was resumed by hand and the destination
had committed, resolve removes neither copy and says "diverged".

Exit status: 0 settled, 3 still in doubt (the destination cannot answer yet).`,
		Example: `  ferry resolve 3f2a9c0b71de
  ferry resolve 3f2a9c0b71de --from node1@192.0.2.1:7070 --tls-dir ~/.ferry/alice`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, _, err := src.endpoints("")
			if err != nil {
				return err
			}
			r, err := client.Resolve(cmd.Context(), from, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				if err := cli.PrintJSON(r); err != nil {
					return err
				}
			} else {
				fmt.Printf("%s (%s): source %s", r.ID, r.Container, r.State)
				if r.Note != "" {
					fmt.Printf(": %s", r.Note)
				}
				fmt.Println()
			}
			if !r.Settled {
				return cli.ExitError{Code: exitInDoubt}
			}
			return nil
		},
	}
	src.add(cmd, "the source agent")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the resolution as JSON")
	return cmd
}

func newWaitCmd() *cobra.Command {
	var (
		src    agentFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Follow a migration to its end and print its report",
		Long: `wait follows migration ID on the source agent (--from) until it ends, and
prints its report as ferry migrate does (at once for one that has ended),
with ferry migrate's exit status (see ferry migrate --help).`,
		Example: `  id=$(ferry migrate web --to node2@192.0.2.10:7070 --mode precopy --detach)
  ferry wait $id`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, _, err := src.endpoints("")
			if err != nil {
				return err
			}
			rep, err := client.Wait(cmd.Context(), from, args[0], nil)
			if err != nil {
				return err
			}
			return showReport(rep, asJSON)
		},
	}
	src.add(cmd, "the source agent")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

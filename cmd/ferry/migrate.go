package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
	"github.com/ferry-migrate/ferry/internal/units"
)

func newMigrateCmd() *cobra.Command {
	var (
		req    engine.Request
		src    agentFlags
		maxBW  string
		asJSON bool
		events bool
		detach bool
		// namespace is a containerd namespace.
		namespace string
		runcRoot  string
	)
	cmd := &cobra.Command{
		Use:   "migrate CONTAINER --to DEST",
		Short: "Move a running container to another host",
		Long: `migrate asks the source host's agent (--from) to move CONTAINER to the agent
at --to, restores it there under the same name, and only then removes it at
the source. If anything fails before the destination confirms the container
runs, the source resumes it and the report says what failed and where.

Techniques (--mode):
  cold      freeze, dump with the memory streaming to the destination, restore
  precopy   copy memory in rounds while the container runs, then a short
            stop-and-copy of what changed (--max-rounds, --min-round-bytes,
            --max-downtime, --auto-converge, --compress)
  postcopy  freeze, dump all but memory, run at the destination at once; the
            source pushes the memory at link speed, faults are served first
  hybrid    pre-copy rounds, then post-copy for what is left
  auto      measure memory, dirty rate and link, plan (ferry plan), run the
            recommended technique, or refuse when none fits --max-downtime

` + runtimesHelp(all.Registry) + `
DEST is an agent address (10.0.0.2:7070), NAME@ADDR (the agent must prove it
is host NAME) or a host name of the hosts file $FERRY_HOSTS (h2; ferry-lab's
is /run/ferry/lab/state.json): the source agent dials it. --from is
the source agent: its control socket when the CLI runs on the source host
(the default), or, from any other machine, NAME@ADDR of its listen address
with an operator's certificate (--tls-dir; ferry certs operator --help).

Report fields: downtime_ms (freeze at the source until running at the
destination), total_ms (until the destination owns the container and, for
post-copy modes, has all its memory), frozen_ms (time the source copy stayed
frozen), bytes_sent (on the wire), memory_bytes (memory moved), phases, and
per technique: rounds, pages faulted/pushed, pages the destination already
held. The report's JSON Schema is docs/report.schema.json.

--events prints the migration as it happens, one JSON object per line:
{"job":{"id":ID}} once the agent accepted it, {"progress":{...}} about five
times a second (phase, bytes sent, rate_bps, and in pre-copy the rounds
done, the last round's dirty_rate and predicted_downtime_ms), and last
{"report":{...}}.

The migration runs in the source agent, under an ID it gives it when it
accepts the request: ferry ps lists it, ferry wait ID follows it, ferry
cancel ID aborts it while the source can still resume. Ctrl-C cancels the
same way (and waits for the report); a second Ctrl-C leaves it running and
returns. --detach returns at once with the ID.

Exit status: 0 the container runs at the destination; 1 the migration
failed and the source resumed it; 2 the command line was wrong; 3 in doubt:
a copy stays frozen until the agents can settle it (the report says which,
and the agents settle it on their own once they reach each other; ferry
resolve ID settles it at once; never resume the frozen copy by hand: the
destination may run it already), or both hosts ran it (a copy resumed by
hand: the report says "diverged"); 4
refused or failed before anything was frozen (the container never
stopped); 5 lost: the source copy's processes died before it could resume
(a CRIU killed while its code ran inside them) and no copy runs anywhere:
start the container again with its runtime.`,
		Example: `  ferry migrate memhog --from h1 --to h2
  ferry migrate web --to 192.0.2.10:7070 --json
  ferry migrate web --from node1@192.0.2.1:7070 --to node2@192.0.2.2:7070 --tls-dir ~/.ferry/alice
  ferry migrate web --to 192.0.2.10:7070 --mode precopy --events | jq -c .progress
  ferry migrate db --runtime runc --runc-root /run/myapp/runc --to 192.0.2.10:7070
  ferry migrate redis --runtime containerd --namespace prod --to 192.0.2.10:7070
  ferry migrate web --to 192.0.2.10:7070 --id 5e1f0c2a9b37   # run again after a lost connection: follows the same migration`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Container = args[0]
			if req.ID != "" && !engine.ValidID(req.ID) {
				return cli.Usage(fmt.Errorf("--id %q: a migration ID is 12 lowercase hexadecimal digits", req.ID))
			}
			if namespace != "" {
				if req.Runtime != "containerd" {
					return cli.Usage(errors.New("--namespace names a containerd namespace: use it with --runtime containerd"))
				}
				req.Container = containerd.JoinName(namespace, args[0])
			}
			if runcRoot != "" {
				req.SetRuntimeOption("runc", api.RuncOptionRoot, runcRoot)
			}
			from, to, err := src.endpoints(req.To)
			if err != nil {
				return err
			}
			req.To = to
			if maxBW != "" {
				if req.MaxBandwidthBps, err = units.ParseRate(maxBW); err != nil {
					return fmt.Errorf("--max-bandwidth: %w", err)
				}
			}
			var progress func(engine.Progress)
			var accepted func(string)
			var enc *json.Encoder
			switch {
			case events:
				enc = json.NewEncoder(os.Stdout)
				accepted = func(id string) { _ = enc.Encode(engine.Event{Job: &engine.JobRef{ID: id}}) }
				progress = func(p engine.Progress) { _ = enc.Encode(engine.Event{Progress: &p}) }
			case !asJSON && term.IsTerminal(int(os.Stderr.Fd())):
				told := false
				progress = func(p engine.Progress) {
					if !told && len(p.Networks) > 0 {
						// Said before anything is frozen, not only in the report.
						for _, n := range p.Networks {
							fmt.Fprintf(os.Stderr, "\r\033[Knetwork: %s\n", n.Outcome)
						}
						told = true
					}
					fmt.Fprintf(os.Stderr, "\r\033[K%-12s %10s  %s", p.Phase, cli.HumanBytes(p.Bytes), cli.HumanRate(p.RateBps))
				}
				defer fmt.Fprint(os.Stderr, "\r\033[K")
			}
			rep, detached, err := followMigration(cmd.Context(), from, req, detach, accepted, progress)
			if detached != "" {
				if detach {
					fmt.Println(detached)
				} else {
					fmt.Fprintf(os.Stderr, "detached: migration %s goes on at the source agent; ferry wait %s shows its end\n", detached, detached)
				}
				return nil
			}
			if err != nil {
				return err
			}
			if enc != nil {
				_ = enc.Encode(engine.Event{Report: &rep})
				return reportExitError(rep)
			}
			return showReport(rep, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.To, "to", "", "destination agent: NAME@ADDR (the agent must prove, by its certificate, that it is host NAME), ADDR, or a host name from $FERRY_HOSTS (required)")
	src.add(cmd, "the source agent")
	f.StringVar(&req.Mode, "mode", engine.ModeCold, "technique: cold, precopy, postcopy, hybrid, or auto (measure, plan with the host profile, run the recommended one)")
	cli.AddPrecopyFlags(cmd, &req.Precopy)
	f.BoolVar(&asJSON, "json", false, "print the report as JSON, no progress line")
	f.BoolVar(&events, "events", false, "print the job's ID, its progress and the report as JSON lines while it runs (see above)")
	f.BoolVar(&detach, "detach", false, "print the migration's ID once the agent accepted it and leave it running (ferry ps, ferry wait ID, ferry cancel ID)")
	f.StringVar(&req.ID, "id", "", "the migration's ID, your choice (12 lowercase hex digits; default: the agent's): the same command again with it follows that migration, running or ended, and never starts a second (for scripts and controllers that retry)")
	f.StringVar(&req.Runtime, "runtime", engine.RuntimeAuto, "the container's runtime: auto (find it by name), "+all.Registry.KindList("or"))
	f.StringVar(&namespace, "namespace", "", "containerd: the container's namespace (default: default)")
	f.StringVar(&runcRoot, "runc-root", "", "runc root the container lives under (default: the source agent's --runc-root)")
	f.BoolVar(&req.KeepVolumes, "keep-volumes", false, "after the commit, keep the source's copy of the volumes that moved (named volumes: Docker), instead of removing them with the container")
	f.StringVar(&maxBW, "max-bandwidth", "", "cap the migration's sending rate (e.g. 500mbit) to leave room for other traffic")
	f.DurationVar(&req.MaxFrozen, "max-frozen", 0, "the longest the container may stay frozen, e.g. 20s (a health check restarts it after that; a post-copy source stays frozen until its pages are pulled): the source measures the container and the link first and refuses a --mode predicted to hold it longer, before anything is frozen; auto picks among the others")
	f.StringSliceVar(&req.Faults, "inject-fault", nil, "inject a failure for testing (agents with --allow-faults only): ACTION@PHASE, e.g. kill-destination@restore (see ferry-lab bench faults --help)")
	_ = f.MarkHidden("inject-fault")
	_ = cmd.MarkFlagRequired("to")
	cmd.MarkFlagsMutuallyExclusive("json", "events")
	cmd.MarkFlagsMutuallyExclusive("detach", "events")
	return cmd
}

// Exit statuses of a migration (ferry migrate, wait, drain): a contract
// for scripts, documented in ferry migrate --help and the README.
const (
	exitOK      = cli.ExitOK
	exitFailed  = cli.ExitFailed // failed; the source resumed the container
	exitUsage   = cli.ExitUsage  // the command line was wrong
	exitInDoubt = 3              // a copy is frozen until the agents settle it (see the report)
	exitRefused = 4              // refused or failed before anything was frozen
	exitLost    = 5              // the source copy's processes died; no copy runs
)

// reportExit is the exit status a migration's report calls for.
func reportExit(rep engine.Report) int {
	switch {
	case rep.OK:
		return exitOK
	case rep.SourceState == "lost":
		return exitLost
	case rep.SourceState == "frozen" || rep.SourceState == "diverged" || (rep.InDoubtID != "" && rep.Settled == ""):
		return exitInDoubt
	}
	for _, p := range rep.Phases {
		if p.Name == "freeze" {
			return exitFailed
		}
	}
	return exitRefused
}

// showReport prints a migration's report (as JSON with asJSON) and exits
// with the status the report calls for.
func showReport(rep engine.Report, asJSON bool) error {
	if asJSON {
		_ = cli.PrintJSON(rep)
	} else {
		printReport(os.Stdout, rep)
	}
	return reportExitError(rep)
}

// reportExitError is the exit status the report calls for, as an error
// (nil for 0).
func reportExitError(rep engine.Report) error {
	if code := reportExit(rep); code != exitOK {
		return cli.ExitError{Code: code}
	}
	return nil
}

func printReport(w io.Writer, r engine.Report) {
	status := "ok"
	if !r.OK {
		status = "FAILED"
	}
	rt := ""
	if r.Runtime != "" {
		rt = ", " + r.Runtime
	}
	fmt.Fprintf(w, "%s: %s -> %s (%s%s) %s\n", r.Container, r.From, r.To, r.Mode, rt, status)
	if !r.OK {
		fmt.Fprintf(w, "  error         %s\n", r.Error)
		if r.FailedAt != "" {
			fmt.Fprintf(w, "  failed at     %s\n", r.FailedAt)
		}
		if r.SourceState != "" {
			fmt.Fprintf(w, "  source copy   %s\n", r.SourceState)
		}
		if r.Logs != "" {
			fmt.Fprintf(w, "  logs kept in  %s\n", r.Logs)
		}
	}
	fmt.Fprintf(w, "  downtime      %.0f ms\n", r.DowntimeMs)
	fmt.Fprintf(w, "  total         %.0f ms\n", r.TotalMs)
	fmt.Fprintf(w, "  frozen        %.0f ms\n", r.FrozenMs)
	fmt.Fprintf(w, "  bytes sent    %s\n", cli.HumanBytes(r.BytesSent))
	fmt.Fprintf(w, "  memory        %s\n", cli.HumanBytes(r.MemoryBytes))
	printModelLine(w, r)
	if len(r.Rounds) > 0 {
		fmt.Fprintf(w, "  rounds       ")
		for _, rd := range r.Rounds {
			final := ""
			if rd.Final {
				final = " (frozen)"
			}
			fmt.Fprintf(w, " [%d: %s in %.0f ms%s]", rd.Index, cli.HumanBytes(rd.Bytes), rd.DurationMs, final)
		}
		fmt.Fprintln(w)
		if r.StopReason != "" {
			fmt.Fprintf(w, "  switched over %s\n", r.StopReason)
		}
	}
	if r.PagesFaulted+r.PagesPushed > 0 {
		fmt.Fprintf(w, "  lazy pages    %d on fault, %d pushed", r.PagesFaulted, r.PagesPushed)
		if r.PagesReferenced > 0 {
			fmt.Fprintf(w, ", %d from the destination's own copy", r.PagesReferenced)
		}
		fmt.Fprintln(w)
	} else if r.FillMs > 0 {
		fmt.Fprintf(w, "  switchover    memory-less dump; %d pages from the destination's own copy, %d fetched, images completed in %.0f ms\n",
			r.PagesReferenced, r.PagesFetched, r.FillMs)
	} else if r.PagesReferenced > 0 {
		fmt.Fprintf(w, "  final dump    %d pages already at the destination, sent as references\n", r.PagesReferenced)
	}
	if r.Transport != "" {
		fmt.Fprintf(w, "  transport     %s\n", r.Transport)
	}
	for _, v := range r.Volumes {
		fmt.Fprintf(w, "  volume        %s at %s: %s live, %s frozen\n", v.Name, v.Path, cli.HumanBytes(v.Bytes), cli.HumanBytes(v.FrozenBytes))
	}
	for _, n := range r.Networks {
		fmt.Fprintf(w, "  network       %s\n", n.Outcome)
	}
	if r.Auto != nil {
		fmt.Fprintf(w, "  auto          %s\n", r.Auto.Reason)
	}
	fmt.Fprintf(w, "  phases       ")
	for _, p := range r.Phases {
		fmt.Fprintf(w, " %s %.0f", p.Name, p.EndMs-p.StartMs)
	}
	fmt.Fprintln(w, " (ms)")
}

// runtimesHelp is migrate's paragraph on --runtime: every registered
// runtime, as it describes itself.
func runtimesHelp(reg *runtime.Registry) string {
	var ds []string
	for _, g := range reg.All() {
		ds = append(ds, g.Describe)
	}
	text := "Runtimes (--runtime): the container is found by name in the runtimes the " +
		"source host has (auto, the default; the report says which) or in the one " +
		"named: " + strings.Join(ds, ", ") + ". It is restored at the destination into " +
		"the same kind of runtime, under the same name, and that runtime manages it " +
		"afterwards. A technique the runtime cannot do is refused before anything " +
		"is frozen; ferry check lists what each runtime supports on a host."
	return wrapText(text, 76) + "\n"
}

// wrapText breaks text into lines of at most width columns, at spaces.
func wrapText(text string, width int) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(text) {
		switch {
		case n == 0:
		case n+1+len(w) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}

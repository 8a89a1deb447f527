package main

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/drain"
	"github.com/ferry-migrate/ferry/internal/engine"
)

func newDrainCmd() *cobra.Command {
	var (
		o      drain.Options
		src    agentFlags
		kube   kubeDrainFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "drain (--to DEST [CONTAINER...] | --kubernetes NODE)",
		Short: "Move every running container off a host",
		Long: `drain moves the containers running on the source host (--from) to the agent
at --to, one after another by default, the smallest first: each one that
is done frees the link for the others sooner. Without CONTAINER arguments it
moves every container running in the source agent's runc root; name Podman
and LXC containers (with --runtime) to move them.

Each container moves by an ordinary migration (see ferry migrate --help for
--mode and the pre-copy options) with its own report; one that fails stays
where its report says, and the others go on. The exit status is 1 if any
failed.

The migrations wait in a line at the source: while one's memory crosses,
the next connects and syncs its root filesystem, then waits for its turn.
A pre-copy or hybrid migration gives its turn away at its commit (its
downtime over, its memory across), or with --handoff freeze at its freeze:
the next one's first round then overlaps its switchover, which ends the
drain sooner (four 256 MiB containers on a two-core host: 1.18-1.34x the
link's time against 1.23-1.40x) but can raise a container's downtime (up
to 0.22x its cold migration's, against 0.10x). Cold and post-copy keep
their turn to their end: cold's memory crosses while it is frozen,
post-copy's after its commit.

--concurrency N lets N migrations' memory cross at once (and one more set
up). Those share the link and the source's CPU (reading and hashing
memory): on a two-core host, four at once took as long in all as one at a
time and doubled each container's downtime. More at once pays where one
migration cannot fill the link (a long round trip, many cores). The
destination takes at most its --max-incoming migrations at a time (4 by
default).

--kubernetes NODE drains a Kubernetes node instead, through the cluster
(--kubeconfig; ferry-controller must run there, docs/KUBERNETES.md): it
cordons NODE and makes a Migration for every pod ferry can move, the
smallest memory request first, --concurrency at a time, each with --mode
and --max-downtime (and --target-node, or a node weighed per pod). The
pods it cannot move (a StatefulSet's, hostPath or persistent volumes,
several containers, the host's network: the reason is printed) and those
whose Migration failed are evicted as kubectl drain evicts them, honouring
disruption budgets; --no-evict leaves them running. DaemonSets' and static
pods stay. Run again after an interruption, it follows the Migrations it
made (named after each pod's UID) rather than starting second ones. The
exit status is 1 if a pod was neither moved nor evicted. Without
--target-node, a node whose cores are all busy (the cost model's
constraint 7.3) is no target: on a saturated cluster the pods no node can
take are evicted, and the reason says so.`,
		Example: `  ferry drain --from h1 --to h2 --mode precopy
  ferry drain --to 192.0.2.10:7070 --mode auto --max-downtime 300ms web db
  ferry drain --kubernetes node-1 --mode precopy --max-downtime 300ms`,
		Args: func(cmd *cobra.Command, args []string) error {
			if kube.node != "" {
				return kube.check(cmd, args)
			}
			if o.To == "" {
				return cli.UsageError{Err: errors.New("--to DEST is required (or --kubernetes NODE)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if kube.node != "" {
				return kube.run(cmd, o, asJSON)
			}
			from, to, err := src.endpoints(o.To)
			if err != nil {
				return err
			}
			o.From, o.To, o.Containers = from, to, args
			var mu sync.Mutex
			if !asJSON {
				o.Started = func(name string) {
					mu.Lock()
					defer mu.Unlock()
					fmt.Fprintf(os.Stderr, "moving %s\n", name)
				}
				o.Finished = func(name string, r engine.Report, err error) {
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
						return
					}
					printReport(os.Stdout, r)
				}
			}
			res, err := drain.Run(cmd.Context(), o)
			if asJSON {
				_ = cli.PrintJSON(res)
			} else if len(res.Reports) == 0 && err == nil {
				fmt.Println("nothing to drain: no container is running there")
			} else {
				fmt.Printf("drained %d container(s) in %.0f ms\n", len(res.Reports), res.TotalMs)
			}
			if err != nil && len(res.Reports) == 0 {
				return err
			}
			if !res.OK {
				return cli.ExitError{Code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.To, "to", "", "destination agent: NAME@ADDR, ADDR, or a host name from $FERRY_HOSTS (required without --kubernetes)")
	src.add(cmd, "the source agent (the host to empty)")
	f.IntVar(&o.Concurrency, "concurrency", 1, "migrations whose memory crosses at once")
	f.StringVar(&o.Handoff, "handoff", engine.HandoffCommit, "when a pre-copy or hybrid migration lets the next one's memory cross: commit or freeze (sooner; see above)")
	f.StringVar(&o.Request.Mode, "mode", engine.ModePrecopy, "technique for every container: cold, precopy, postcopy, hybrid, or auto")
	f.StringVar(&o.Request.Runtime, "runtime", engine.RuntimeAuto, "the containers' runtime: auto, runc, podman or lxc")
	cli.AddPrecopyFlags(cmd, &o.Request.Precopy)
	f.BoolVar(&asJSON, "json", false, "print every report as JSON at the end, no progress lines")
	kube.add(cmd)
	return cmd
}

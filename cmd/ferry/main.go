// Command ferry moves running Linux containers between hosts with CRIU.
// The lab, the benchmarks and the calibration are ferry-lab's
// (cmd/ferry-lab): this binary links none of them.
package main

import (
	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
)

// newRootCmd is ferry with every command.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "ferry",
		Short: "Live migration of running Linux containers",
		Long: `ferry moves a running container from one host to another, state and all,
with CRIU doing the checkpoint and restore. One agent runs per host; the CLI
asks the source host's agent to migrate a container to another agent.

Start with:
  ferry check                      is this host ready?
  ferry migrate app --from /run/ferry/agent.sock --to h2@10.0.0.2:7070

To try it on one machine, ferry-lab (a separate binary) emulates hosts:
  ferry-lab lab up --hosts 2       two emulated hosts; it prints FERRY_HOSTS
  ferry-lab lab run h1 app -- memhog --memory 64M
  FERRY_HOSTS=/run/ferry/lab/state.json ferry migrate app --from h1 --to h2`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Version = version
	root.SetVersionTemplate(versionLine() + "\n")
	root.AddCommand(newCheckCmd(), newAgentCmd(), newMigrateCmd(), newDrainCmd(), newPsCmd(), newCancelCmd(), newWaitCmd(), newResolveCmd(), newCertsCmd(), newPlanCmd(), newFollowCmd(), newCalibrateCmd(), newVersionCmd(), newManCmd(), newLazyRelayCmd(), newPageKeeperCmd())
	cli.MarkUsageErrors(root)
	return root
}

func main() { cli.Main(newRootCmd()) }

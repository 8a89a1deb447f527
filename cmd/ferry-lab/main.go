// Command ferry-lab is ferry's test world, apart from the production
// binary as containerd's ctr is from containerd: the emulated lab, the
// benchmarks, the calibration that measures a host profile in the lab, and
// the helpers the lab runs inside its hosts (lab-tool). Its lab runs
// production agents from the ferry binary next to it.
package main

import (
	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
)

// Set at build time (the Makefile: -ldflags "-X main.version=...").
var version, commit = "dev", ""

// newRootCmd is ferry-lab with every command.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "ferry-lab",
		Short: "ferry's emulated lab, benchmarks and calibration",
		Long: `ferry-lab emulates ferry hosts on this machine (each its own network
namespace running a production ferry agent, from the ferry binary next to
this one or $FERRY_BIN), measures migrations in them (bench), fits a host's
model profile to such measurements (calibrate) and runs experiments. It
needs root; the production binary, ferry, links none of it.

Start with:
  ferry-lab lab up --hosts 2       two emulated hosts on this machine
  ferry-lab lab run h1 app -- memhog --memory 64M
  export FERRY_HOSTS=/run/ferry/lab/state.json
  ferry migrate app --from h1 --to h2
  ferry-lab bench migrate --mode cold --memory 256M --bandwidth 1gbit`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Version = version
	root.SetVersionTemplate(cli.VersionLine("ferry-lab", version, commit) + "\n")
	root.AddCommand(newLabCmd(), newBenchCmd(), newCalibrateCmd(), newLabToolCmd(), newDebrootCmd())
	cli.MarkUsageErrors(root)
	return root
}

func main() { cli.Main(newRootCmd()) }

package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
)

// newCalibrateCmd is what production keeps of calibrate: the agent's
// learned model (--status). Measuring a profile runs migrations in the
// lab, so it is ferry-lab calibrate's.
func newCalibrateCmd() *cobra.Command {
	var (
		status, asJSON bool
		src            agentFlags
	)
	cmd := &cobra.Command{
		Use:   "calibrate --status",
		Short: "Show what an agent learned of this host's migration costs",
		Long: `calibrate --status shows what the agent at --from learned from its own
migrations: for each term of the model profile, how many migrations fed it,
whether it was refitted and its recent error, the prediction intervals, and
the profile the agent plans with (docs/MODEL.md).

Measuring a profile from migrations in the emulated lab is
'ferry-lab calibrate' (a separate binary, not in the package).`,
		Example: `  ferry calibrate --status
  ferry calibrate --status --from h2@10.0.0.2:7070 --tls-dir ~/.ferry --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !status {
				return cli.Usage(errors.New("ferry calibrate only shows an agent's learned model (--status); measuring a profile in the lab is ferry-lab calibrate"))
			}
			return showModelStatus(cmd.Context(), src, asJSON)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&status, "status", false, "show what the agent at --from learned from its migrations: each term's migrations, refit and recent error, the intervals, the profile it plans with")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	src.add(cmd, "the agent to ask")
	return cmd
}

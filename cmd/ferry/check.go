package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/preflight"
)

func newCheckCmd() *cobra.Command {
	var (
		asJSON   bool
		stateDir string
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check that this host can migrate containers",
		Long: `check inspects this host: CRIU (path, version, 'criu check'), the kernel
features that decide which techniques work (dirty-page tracking for CRIU
pre-dump, userfaultfd and pipe size for post-copy, TCP repair, MPTCP), the
container runtimes installed, the cgroup layout and privileges.

Where the host's agent kept migrations to learn from (under --state), it
also says whether its model drifts: a term whose recent predictions are
off by more than 25 % (ferry calibrate --status for the whole picture).

It exits 0 when a cold migration is possible here, 1 otherwise, and names
each problem with its fix.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := preflight.Run(cmd.Context())
			mc := checkModel(stateDir)
			if asJSON {
				if err := cli.PrintJSON(struct {
					preflight.Report
					Model *modelCheck `json:"model,omitempty"`
				}{r, mc}); err != nil {
					return err
				}
			} else {
				fmt.Print(r.Text())
				if mc != nil {
					fmt.Print(mc.text())
				}
			}
			if !r.OK {
				return cli.ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().StringVar(&stateDir, "state", "/var/lib/ferry", "the agent's state directory, whose model history says whether its profile drifts from what its migrations measure")
	return cmd
}

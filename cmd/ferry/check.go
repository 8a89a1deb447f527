package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/preflight"
)

func newCheckCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check that this host can migrate containers",
		Long: `check inspects this host: CRIU (path, version, 'criu check'), the kernel
features that decide which techniques work (dirty-page tracking for CRIU
pre-dump, userfaultfd and pipe size for post-copy, TCP repair, MPTCP), the
container runtimes installed, the cgroup layout and privileges.

It exits 0 when a cold migration is possible here, 1 otherwise, and names
each problem with its fix.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := preflight.Run(cmd.Context())
			if asJSON {
				if err := printJSON(r); err != nil {
					return err
				}
			} else {
				fmt.Print(r.Text())
			}
			if !r.OK {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

package main

import (
	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/lazyrelay"
)

// newLazyRelayCmd is the process a destination agent starts beside each
// post-copy pull's lazy-pages daemon (package lazyrelay); not for users.
func newLazyRelayCmd() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:    lazyrelay.Command,
		Hidden: true,
		Short:  "hold a post-copy pull's page requests across agent restarts",
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return lazyrelay.Main(socket)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "where agents connect")
	_ = cmd.MarkFlagRequired("socket")
	return cmd
}

package main

import (
	"time"

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

// newPageKeeperCmd is the process a source agent starts beside each
// post-copy dump's page server (lazyrelay's keeper); not for users.
func newPageKeeperCmd() *cobra.Command {
	var socket string
	var idle time.Duration
	cmd := &cobra.Command{
		Use:    lazyrelay.KeeperCommand,
		Hidden: true,
		Short:  "hold a post-copy dump's page server connection across agent restarts",
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return lazyrelay.KeeperMain(socket, idle)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "where agents connect")
	cmd.Flags().DurationVar(&idle, "idle", lazyrelay.KeeperIdle, "let go of the page server after this long with no agent")
	_ = cmd.MarkFlagRequired("socket")
	return cmd
}

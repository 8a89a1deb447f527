package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/debroot"
)

// newDebrootCmd builds the clean Debian root that the package tests
// install ferry's .debs into (package debroot), once: scripts/setup.sh
// runs it so that make test only copies it.
func newDebrootCmd() *cobra.Command {
	var (
		o     debroot.Options
		quiet bool
	)
	cmd := &cobra.Command{
		Use:    "debroot",
		Hidden: true,
		Short:  "build the package tests' cached Debian root, if it is not built yet",
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !quiet {
				o.Log = os.Stderr
			} else {
				o.Log = io.Discard
			}
			c, err := debroot.Ensure(cmd.Context(), o)
			if err != nil {
				return err
			}
			if c.Built {
				fmt.Printf("%s: built in %s\n", c.Tarball, c.Took.Round(100*time.Millisecond))
			} else {
				fmt.Printf("%s: up to date\n", c.Tarball)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.CacheDir, "cache", "", "cache directory (default $FERRY_CACHE/debroot, /var/cache/ferry/debroot)")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no mmdebstrap output (its end is in the error, should it fail)")
	return cmd
}

// Command ferry moves running Linux containers between hosts with CRIU.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// exitError carries an exit code without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

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
  ferry lab up --hosts 2           two emulated hosts on this machine
  ferry lab run h1 app -- memhog --memory 64M
  ferry migrate app --from h1 --to h2
  ferry bench migrate --mode cold --memory 256M --bandwidth 1gbit`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Version = version
	root.SetVersionTemplate(versionLine() + "\n")
	root.AddCommand(newCheckCmd(), newAgentCmd(), newMigrateCmd(), newDrainCmd(), newPsCmd(), newCancelCmd(), newWaitCmd(), newResolveCmd(), newLabCmd(), newBenchCmd(), newCertsCmd(), newPlanCmd(), newFollowCmd(), newCalibrateCmd(), newVersionCmd(), newManCmd(), newLabToolCmd(), newLazyRelayCmd(), newPageKeeperCmd())
	markUsageErrors(root)
	return root
}

func main() {
	root := newRootCmd()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		if e := (exitError{}); errors.As(err, &e) {
			os.Exit(e.code)
		}
		fmt.Fprintln(os.Stderr, "ferry:", err)
		os.Exit(exitCode(err))
	}
}

// usageError is a command line cobra or a command refused.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// exitCode is the status an error ends ferry with: 2 for a wrong command
// line, 1 for anything else.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var u usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	// Cobra's own complaints about the command line are plain errors.
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "required flag(s)", "flag needs an argument", "invalid argument", "if any flags in the group"} {
		if strings.HasPrefix(msg, p) {
			return exitUsage
		}
	}
	return exitFailed
}

// markUsageErrors makes every command's argument and flag errors usage
// errors (exit status 2).
func markUsageErrors(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
	}
}

// printJSON writes v to stdout as indented JSON.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

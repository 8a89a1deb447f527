// Package cli is what ferry's two commands, ferry (production) and
// ferry-lab (the lab, benchmarks and calibration), share of a command
// line: exit statuses, usage errors, JSON output and the main loop. It
// holds no command, so that neither binary links the other's.
package cli

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
	"github.com/spf13/pflag"
)

// Exit statuses every command shares; ferry's migrations add their own
// from 3 up (ferry migrate --help).
const (
	ExitOK     = 0
	ExitFailed = 1
	ExitUsage  = 2 // the command line was wrong
)

// ExitError carries an exit status without printing anything more.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit %d", e.Code) }

// UsageError is a command line cobra or a command refused.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usage marks err as the command line's fault (exit status 2).
func Usage(err error) error { return UsageError{err} }

// ExitCode is the status an error ends a command with: 2 for a wrong
// command line, 1 for anything else.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	if e := (ExitError{}); errors.As(err, &e) {
		return e.Code
	}
	var u UsageError
	if errors.As(err, &u) {
		return ExitUsage
	}
	// Cobra's own complaints about the command line are plain errors.
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "required flag(s)", "flag needs an argument", "invalid argument", "if any flags in the group"} {
		if strings.HasPrefix(msg, p) {
			return ExitUsage
		}
	}
	return ExitFailed
}

// MarkUsageErrors makes every command's argument and flag errors usage
// errors (exit status 2).
func MarkUsageErrors(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{err} })
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return UsageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		MarkUsageErrors(sub)
	}
}

// Main runs root until it returns or SIGINT/SIGTERM cancels its context,
// and exits with the status its error calls for, printing the error
// (prefixed with root's name) unless it is an ExitError.
func Main(root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	if e := (ExitError{}); !errors.As(err, &e) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", root.Name(), err)
	}
	os.Exit(ExitCode(err))
}

// VersionLine is a build in one line: name, version and, when known, the
// commit.
func VersionLine(name, version, commit string) string {
	if commit == "" {
		return name + " " + version
	}
	return fmt.Sprintf("%s %s (commit %s)", name, version, commit)
}

// PrintJSON writes v to stdout as indented JSON.
func PrintJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteJSON writes v to path as indented JSON.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// QuotedUsages lists the flags under c whose help has a backtick: pflag
// takes a `quoted` word in a usage string for the value's name, which is
// rarely meant (--tls-dir ferry certs).
func QuotedUsages(c *cobra.Command) []string {
	var out []string
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if strings.Contains(f.Usage, "`") {
			out = append(out, fmt.Sprintf("%s --%s: %s", c.CommandPath(), f.Name, f.Usage))
		}
	})
	for _, sub := range c.Commands() {
		out = append(out, QuotedUsages(sub)...)
	}
	return out
}

package cli

import (
	"errors"
	"fmt"
	"testing"
)

// Exit statuses: an ExitError's own, 2 for the command line's faults
// (marked or cobra's), 1 for the rest.
func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{ExitError{Code: 3}, 3},
		{fmt.Errorf("wrapped: %w", ExitError{Code: 5}), 5},
		{Usage(errors.New("--id: not an ID")), ExitUsage},
		{fmt.Errorf("run: %w", Usage(errors.New("bad"))), ExitUsage},
		{errors.New(`unknown command "teleport" for "ferry"`), ExitUsage},
		{errors.New("connect: connection refused"), ExitFailed},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

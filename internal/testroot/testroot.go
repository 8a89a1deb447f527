// Package testroot is the one check tests make before they touch what
// only root may (namespaces, cgroups, ptrace, CRIU): without root they are
// skipped, saying why, never counted as passing silently.
package testroot

import (
	"os"
	"testing"
)

// Require skips t unless it runs as root; why says what needs root.
func Require(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(why)
	}
}

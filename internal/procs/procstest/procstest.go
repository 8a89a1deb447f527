// Package procstest has test helpers that make processes in given states.
package procstest

import (
	"os/exec"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// Zombie returns the PID of a child that exited and is not reaped until
// the test ends: a process that is dying, as procs.Dying sees it.
func Zombie(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Wait() })
	for st, _ := procs.State(cmd.Process.Pid); st != 'Z'; st, _ = procs.State(cmd.Process.Pid) {
		time.Sleep(time.Millisecond)
	}
	return cmd.Process.Pid
}

package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Alive is true for a live process, false for a gone or zombie one.
func Alive(pid int) bool {
	st, ok := State(pid)
	return ok && st != 'Z'
}

// FromPIDFile is the PID a daemon wrote to pidFile when a live process of
// executable exe (its base name) has it, 0 otherwise (no file, the daemon
// gone, or its PID reused since).
func FromPIDFile(pidFile, exe string) int {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !Alive(pid) {
		return 0
	}
	if path, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || filepath.Base(path) != exe {
		return 0
	}
	return pid
}

// Terminate sends SIGTERM to every pid, SIGKILL to those still alive after
// the grace period, and waits briefly for them to go.
func Terminate(pids []int, grace time.Duration) error {
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	left := WaitGone(pids, grace)
	for _, p := range left {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	if left = WaitGone(left, 2*time.Second); len(left) > 0 {
		return fmt.Errorf("processes %v survived SIGKILL", left)
	}
	return nil
}

// WaitGone waits up to d for pids to be gone and returns those left.
func WaitGone(pids []int, d time.Duration) []int {
	deadline := time.Now().Add(d)
	for {
		var left []int
		for _, p := range pids {
			if Alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package procs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
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

// Started is a process StartDetached started.
type Started struct {
	PID int
	// Exited gets the process's end, once (it is reaped while the starter
	// lives; init adopts it when the starter ends first).
	Exited <-chan error
}

// StartDetached starts argv in a session of its own, so that it outlives
// its starter as a daemon does: in the network namespace netns (a path;
// "" the starter's, through nsenter, which execs argv so that the PID is
// its), its output appended to logPath, env added to the starter's
// environment.
func StartDetached(argv []string, netns, logPath string, env []string) (Started, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return Started{}, err
	}
	defer log.Close()
	if netns != "" {
		argv = append([]string{"nsenter", "--net=" + netns, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Started{}, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return Started{PID: cmd.Process.Pid, Exited: exited}, nil
}

// AwaitReady polls ready every interval until it succeeds (nil), the
// process ends, limit passes or ctx ends; the error says which.
func (s Started) AwaitReady(ctx context.Context, limit, interval time.Duration, ready func(context.Context) error) error {
	deadline := time.Now().Add(limit)
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case werr := <-s.Exited:
			return fmt.Errorf("it exited (%v)", werr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// StopWhen lets pid run step at a time, stopped (SIGSTOP) between steps,
// until done, asked while it is stopped, says so: pid is left stopped
// then, for the caller to kill or continue. Stepping, pid cannot get past
// what done looks for unseen. False when pid is gone.
func StopWhen(pid int, step time.Duration, done func() bool) bool {
	for {
		if syscall.Kill(pid, syscall.SIGSTOP) != nil {
			return false
		}
		WaitStopped(pid, time.Second)
		if done() {
			return true
		}
		_ = syscall.Kill(pid, syscall.SIGCONT)
		time.Sleep(step)
	}
}

// WaitStopped waits up to d for pid to be stopped (SIGSTOP), a zombie, or
// gone.
func WaitStopped(pid int, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
		if st, ok := State(pid); !ok || st == 'T' || st == 'Z' {
			return
		}
	}
}

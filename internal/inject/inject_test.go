//go:build linux && amd64

package inject

import (
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The restart fixup, for each way the kernel marks an interrupted call.
func TestRestartable(t *testing.T) {
	const rip, nr = 0x1000, 230 // clock_nanosleep
	neg := func(e int64) uint64 { return uint64(-e) }
	for _, c := range []struct {
		name          string
		rax, orig     uint64
		wantRax       uint64
		wantRip       uint64
		wantOrigReset bool
	}{
		{"not in a call", 7, ^uint64(0), 7, rip, true},
		{"finished call", 0, nr, 0, rip, true},
		{"ERESTARTSYS", neg(errRestartSys), nr, nr, rip - 2, true},
		{"ERESTARTNOINTR", neg(errRestartNoIntr), nr, nr, rip - 2, true},
		{"ERESTARTNOHAND", neg(errRestartNoHand), nr, nr, rip - 2, true},
		{"ERESTART_RESTARTBLOCK", neg(errRestartBlock), nr, sysRestartSyscall, rip - 2, true},
		{"EINTR stays", neg(int64(unix.EINTR)), nr, neg(int64(unix.EINTR)), rip, true},
	} {
		got := restartable(unix.PtraceRegs{Rax: c.rax, Orig_rax: c.orig, Rip: rip})
		if got.Rax != c.wantRax || got.Rip != c.wantRip || got.Orig_rax != ^uint64(0) {
			t.Errorf("%s: rax %d rip %#x orig %d, want rax %d rip %#x orig -1",
				c.name, int64(got.Rax), got.Rip, int64(got.Orig_rax), int64(c.wantRax), c.wantRip)
		}
	}
}

// Calls made in a sleeping process return its own results (its pid, an
// errno), and the process goes on as if nothing happened.
func TestSyscallInAnotherProcess(t *testing.T) {
	cmd := exec.Command("sleep", "1")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	time.Sleep(100 * time.Millisecond) // asleep in clock_nanosleep
	start := time.Now()
	err := Do(pid, []uintptr{unix.SYS_GETPID, unix.SYS_CLOSE}, func(s *Session) error {
		got, err := s.Syscall(unix.SYS_GETPID)
		if err != nil {
			return err
		}
		if int(got) != pid {
			t.Errorf("getpid in %d returned %d", pid, got)
		}
		if _, err := s.Syscall(unix.SYS_CLOSE, 1<<20); !errors.Is(err, unix.EBADF) {
			t.Errorf("close of a bad fd: %v, want EBADF", err)
		}
		return nil
	})
	if errors.Is(err, unix.EPERM) {
		t.Skipf("ptrace not permitted here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("sleep after the calls: %v", err)
	}
	if d := time.Since(start); d < 800*time.Millisecond {
		t.Fatalf("sleep ended %v after the calls: the interrupted sleep was not restarted", d)
	}
}

// fn's error comes back, and the thread still runs.
func TestDoReturnsFnError(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(50 * time.Millisecond)
	boom := errors.New("boom")
	err := Do(cmd.Process.Pid, []uintptr{unix.SYS_GETPID}, func(*Session) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Do: %v, want %v", err, boom)
	}
	// Detached: a signal ends it as it would any process.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the process did not end on SIGTERM after Do: still traced or stopped")
	}
}

// A process that is gone is an error, not a hang.
func TestDoOnExitedProcess(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no true(1): %v", err)
	}
	if err := Do(cmd.Process.Pid, nil, func(*Session) error { return nil }); err == nil {
		t.Fatal("Do on an exited process succeeded")
	}
}

//go:build linux && amd64

package inject

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/procs"
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

// sleeper starts sleep(1) for secs seconds, asleep once this returns,
// and kills it when the test ends if it still runs.
func sleeper(t *testing.T, secs string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", secs)
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(50 * time.Millisecond)
	return cmd
}

// waitEnd waits up to within for cmd to end and returns how it ended.
func waitEnd(t *testing.T, cmd *exec.Cmd, within time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("%s still runs after %v", cmd, within)
		return nil
	}
}

// A process stopped by SIGSTOP is refused (a call would resume it), and
// left stopped: it goes on only when continued.
func TestDoOnStoppedProcess(t *testing.T) {
	cmd := sleeper(t, "1")
	pid := cmd.Process.Pid
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if !stopsWithin(pid, 2*time.Second) {
		t.Fatal("sleep did not stop")
	}
	ran := false
	err := Do(pid, []uintptr{unix.SYS_GETPID}, func(*Session) error { ran = true; return nil })
	if !errors.Is(err, ErrStopped) || ran {
		t.Fatalf("Do on a stopped process: %v (fn ran: %v), want ErrStopped", err, ran)
	}
	// Detached, it wakes for a moment to enter its group stop again.
	if !stopsWithin(pid, 2*time.Second) {
		st, _ := procs.State(pid)
		t.Fatalf("after Do the process is in state %c, not stopped", st)
	}
	if err := unix.Kill(pid, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := waitEnd(t, cmd, 5*time.Second); err != nil {
		t.Fatalf("sleep after SIGCONT: %v", err)
	}
}

// stopsWithin says whether pid is stopped (state T) within d.
func stopsWithin(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if st, _ := procs.State(pid); st == 'T' {
			return true
		}
	}
	return false
}

// A signal that arrives while the thread is held is not lost: the stop
// swallows it, and it is sent again once the thread goes (SIGUSR1 ends
// sleep at once, not after its 30 s).
func TestSignalDuringCallsIsSentAgain(t *testing.T) {
	cmd := sleeper(t, "30")
	pid := cmd.Process.Pid
	err := Do(pid, []uintptr{unix.SYS_GETPID}, func(s *Session) error {
		if err := unix.Tgkill(pid, pid, unix.SIGUSR1); err != nil {
			return err
		}
		_, err := s.Syscall(unix.SYS_GETPID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = waitEnd(t, cmd, 5*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("sleep ended with %v, want SIGUSR1", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGUSR1 {
		t.Fatalf("sleep ended with %v, want SIGUSR1", err)
	}
}

// The syscall instruction calls are made at is one the process maps, in
// its vDSO.
func TestSyscallInsnInTheVDSO(t *testing.T) {
	pid := sleeper(t, "30").Process.Pid
	at, err := syscallInsn(pid)
	if err != nil {
		t.Fatal(err)
	}
	insn := make([]byte, syscallInsnLen)
	if n, err := readMem(pid, uint64(at), insn); err != nil || n != syscallInsnLen || insn[0] != 0x0f || insn[1] != 0x05 {
		t.Fatalf("at %#x: % x (%d bytes, %v), want 0f 05", at, insn, n, err)
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range procs.ParseMaps(maps) {
		if uint64(at) >= m.Start && uint64(at) < m.End {
			if m.Path != "[vdso]" {
				t.Errorf("the instruction is in %q, not the vDSO", m.Path)
			}
			return
		}
	}
	t.Errorf("%#x is in no mapping", at)
}

// A thread's process is its thread group's leader.
func TestTgidOf(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, tid := range []int{unix.Getpid(), unix.Gettid()} {
		if got, err := tgidOf(tid); err != nil || got != unix.Getpid() {
			t.Errorf("tgidOf(%d) = %d, %v; want %d", tid, got, err, unix.Getpid())
		}
	}
	if _, err := tgidOf(1 << 30); err == nil {
		t.Error("a thread that does not exist has a process")
	}
}

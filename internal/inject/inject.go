//go:build linux && amd64

package inject

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Session is a thread held stopped for calls. Its methods must be called
// from the goroutine that made it (ptrace's tracer is a thread).
type Session struct {
	tid     int
	saved   unix.PtraceRegs // the thread's registers, as it is to resume
	insn    uintptr         // address of a syscall instruction
	pending []unix.Signal   // signals the stop swallowed, sent again at the end
	// stuck: the thread never stopped, so it cannot be detached; the
	// tracer thread exits instead, which detaches it.
	stuck bool
}

// Do holds thread tid stopped, calls fn with it and lets it go on. fn
// runs on a locked OS thread: it may make calls, and system calls of its
// own (pidfd_getfd) while the thread waits. calls lists every call fn may
// make: the thread's seccomp filters are checked for each before fn runs.
func Do(tid int, calls []uintptr, fn func(s *Session) error) (err error) {
	done := make(chan error, 1)
	go func() { done <- do(tid, calls, fn) }()
	return <-done
}

func do(tid int, calls []uintptr, fn func(s *Session) error) (err error) {
	runtime.LockOSThread()
	s, err := seize(tid)
	if s != nil && s.stuck {
		// Left locked: the thread ends with this goroutine, and the
		// kernel detaches its tracees.
		return err
	}
	defer runtime.UnlockOSThread()
	if err != nil {
		return err
	}
	defer func() {
		if rerr := s.release(); rerr != nil && err == nil {
			err = rerr
		}
	}()
	if err := allowed(tid, calls); err != nil {
		return err
	}
	return fn(s)
}

// seize stops the thread at a point where its registers can be changed.
func seize(tid int) (*Session, error) {
	if err := unix.PtraceSeize(tid); err != nil {
		return nil, fmt.Errorf("inject: seize %d: %w", tid, err)
	}
	s := &Session{tid: tid}
	if err := unix.PtraceInterrupt(tid); err != nil {
		_ = unix.PtraceDetach(tid)
		return nil, fmt.Errorf("inject: interrupt %d: %w", tid, err)
	}
	if err := s.waitInterrupt(); err != nil {
		if s.stuck {
			return s, err
		}
		_ = unix.PtraceDetach(tid)
		s.resend()
		return nil, err
	}
	if err := unix.PtraceGetRegs(tid, &s.saved); err != nil {
		s.detach()
		return nil, fmt.Errorf("inject: registers of %d: %w", tid, err)
	}
	s.saved = restartable(s.saved)
	insn, err := syscallInsn(tid)
	if err != nil {
		s.detach()
		return nil, err
	}
	s.insn = insn
	return s, nil
}

// waitInterrupt waits for the stop PTRACE_INTERRUPT asked for. Signals
// that arrive first are swallowed and sent again at the end.
func (s *Session) waitInterrupt() error {
	for {
		ws, err := s.wait()
		if err != nil {
			return err
		}
		if ws.event() == unix.PTRACE_EVENT_STOP {
			switch ws.StopSignal() {
			case unix.SIGTRAP:
				return nil
			default: // a group stop: the process was stopped by a signal
				return ErrStopped
			}
		}
		s.pending = append(s.pending, ws.StopSignal())
		if err := unix.PtraceCont(s.tid, 0); err != nil {
			return fmt.Errorf("inject: continue %d: %w", s.tid, err)
		}
	}
}

// waitStatus is a wait status with its ptrace event.
type waitStatus struct{ unix.WaitStatus }

func (w waitStatus) event() int { return int(uint32(w.WaitStatus) >> 16) }

// stopTimeout bounds the wait for the thread to stop: a thread in a
// frozen cgroup does not stop until it is thawed.
const stopTimeout = 2 * time.Second

// ErrTimeout is returned when the thread did not stop in time.
var errTimeout = errors.New("inject: the thread did not stop (is its cgroup frozen?)")

func (s *Session) wait() (waitStatus, error) {
	deadline := time.Now().Add(stopTimeout)
	for delay := 50 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(s.tid, &ws, unix.WALL|unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return waitStatus{}, fmt.Errorf("inject: wait for %d: %w", s.tid, err)
		}
		if pid == 0 {
			if time.Now().After(deadline) {
				s.stuck = true
				return waitStatus{}, errTimeout
			}
			time.Sleep(delay)
			continue
		}
		if ws.Exited() || ws.Signaled() {
			return waitStatus{}, fmt.Errorf("inject: thread %d ended", s.tid)
		}
		return waitStatus{ws}, nil
	}
}

// Syscall makes one call in the thread and returns its result; a failed
// call returns its errno.
func (s *Session) Syscall(nr uintptr, args ...uintptr) (uintptr, error) {
	if len(args) > 6 {
		return 0, fmt.Errorf("inject: %d arguments", len(args))
	}
	regs := s.saved
	regs.Rip = uint64(s.insn)
	regs.Rax = uint64(nr)
	regs.Orig_rax = ^uint64(0) // not in a system call: nothing to restart
	var a [6]uint64
	for i, v := range args {
		a[i] = uint64(v)
	}
	regs.Rdi, regs.Rsi, regs.Rdx, regs.R10, regs.R8, regs.R9 = a[0], a[1], a[2], a[3], a[4], a[5]
	if err := unix.PtraceSetRegs(s.tid, &regs); err != nil {
		return 0, fmt.Errorf("inject: set registers of %d: %w", s.tid, err)
	}
	if err := unix.PtraceSingleStep(s.tid); err != nil {
		return 0, fmt.Errorf("inject: step %d: %w", s.tid, err)
	}
	for {
		ws, err := s.wait()
		if err != nil {
			return 0, err
		}
		if ws.StopSignal() == unix.SIGTRAP && ws.event() == 0 {
			break // the step after the syscall instruction
		}
		if ws.event() == 0 {
			// A signal arrived before the step ended: keep it for later.
			s.pending = append(s.pending, ws.StopSignal())
		}
		if err := unix.PtraceSingleStep(s.tid); err != nil {
			return 0, fmt.Errorf("inject: step %d: %w", s.tid, err)
		}
	}
	if err := unix.PtraceGetRegs(s.tid, &regs); err != nil {
		return 0, fmt.Errorf("inject: registers of %d: %w", s.tid, err)
	}
	if regs.Rip != uint64(s.insn)+2 {
		return 0, fmt.Errorf("inject: thread %d did not stop after the system call (at %#x)", s.tid, regs.Rip)
	}
	if r := int64(regs.Rax); r < 0 && r >= -4095 {
		return 0, unix.Errno(-r)
	}
	return uintptr(regs.Rax), nil
}

// release puts the thread's registers back and lets it go.
func (s *Session) release() error {
	err := unix.PtraceSetRegs(s.tid, &s.saved)
	if err != nil {
		err = fmt.Errorf("inject: restore registers of %d: %w", s.tid, err)
	}
	s.detach()
	return err
}

func (s *Session) detach() {
	_ = unix.PtraceDetach(s.tid)
	s.resend()
}

// resend sends the signals the stop swallowed again, to the same thread.
func (s *Session) resend() {
	for _, sig := range s.pending {
		if sig == unix.SIGTRAP || sig == 0 {
			continue
		}
		tgid, err := tgidOf(s.tid)
		if err == nil {
			_ = unix.Tgkill(tgid, s.tid, sig)
		}
	}
	s.pending = nil
}

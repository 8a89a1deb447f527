package criu

import (
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CRIU stops each task it dumped or restored at a hardware breakpoint
// (its parasite's exit, its restorer's end). A task's first breakpoint is
// a perf event, and when no per-task perf event exists on the host the
// kernel first turns on its perf scheduling hooks, patching its code on
// every CPU: 7-8 ms on this VM for a ptrace write of a debug register, and
// 8-21 ms in CRIU's dumps here, all while the container is frozen. The
// kernel turns the hooks off again a second after the last such event
// goes, so every migration paid it anew.
//
// WarmBreakpoints holds an idle per-task perf event (a disabled software
// dummy, which counts nothing) until release is called, so that the hooks
// are on when CRIU sets its breakpoints: the write then takes 0.01-0.03
// ms. Opening it costs the same few milliseconds, in the background,
// before anything is frozen. The event belongs to a thread of its own
// that only waits: a task with perf events pays a little at each of its
// context switches, and the agent's busy threads should not. Where perf
// events are not allowed (perf_event_paranoid, seccomp), nothing is held
// and CRIU pays as before.
func WarmBreakpoints() (release func()) {
	done, closed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(closed)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		fd, err := openIdlePerfEvent()
		<-done
		if err == nil {
			unix.Close(fd)
		}
	}()
	return sync.OnceFunc(func() {
		close(done)
		<-closed
	})
}

// openIdlePerfEvent opens a disabled software dummy event on the calling
// thread: per-task, counting nothing.
func openIdlePerfEvent() (int, error) {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_DUMMY,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	return unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
}

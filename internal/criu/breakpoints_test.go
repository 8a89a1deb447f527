package criu

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// perfEvents counts this process's open perf event descriptors.
func perfEvents(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && l == "anon_inode:[perf_event]" {
			n++
		}
	}
	return n
}

// WarmBreakpoints holds one perf event until release, and none after.
func TestWarmBreakpointsHoldsAPerfEvent(t *testing.T) {
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_DUMMY,
		Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{})), Bits: unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		t.Skipf("perf events are not allowed here (%v): WarmBreakpoints holds nothing", err)
	}
	unix.Close(fd)

	before := perfEvents(t)
	release := WarmBreakpoints()
	deadline := time.Now().Add(5 * time.Second)
	for perfEvents(t) != before+1 {
		if time.Now().After(deadline) {
			release()
			t.Fatalf("no perf event held: %d open, %d before", perfEvents(t), before)
		}
		time.Sleep(time.Millisecond)
	}
	release()
	release() // a second call does nothing
	if n := perfEvents(t); n != before {
		t.Errorf("%d perf events open after release, %d before", n, before)
	}
}

// A release right away waits for the open and closes what it opened.
func TestWarmBreakpointsReleasedAtOnce(t *testing.T) {
	before := perfEvents(t)
	WarmBreakpoints()()
	if n := perfEvents(t); n != before {
		t.Errorf("%d perf events open after release, %d before", n, before)
	}
}

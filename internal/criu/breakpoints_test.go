package criu

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// perfEvents counts this process's open perf event descriptors.
func perfEvents() int { return descriptorsHere("anon_inode:[perf_event]") }

// WarmBreakpoints holds one perf event until release, and none after.
func TestWarmBreakpointsHoldsAPerfEvent(t *testing.T) {
	fd, err := openIdlePerfEvent()
	if err != nil {
		t.Skipf("perf events are not allowed here (%v): WarmBreakpoints holds nothing", err)
	}
	unix.Close(fd)

	before := perfEvents()
	release := WarmBreakpoints()
	deadline := time.Now().Add(5 * time.Second)
	for perfEvents() != before+1 {
		if time.Now().After(deadline) {
			release()
			t.Fatalf("no perf event held: %d open, %d before", perfEvents(), before)
		}
		time.Sleep(time.Millisecond)
	}
	release()
	release() // a second call does nothing
	if n := perfEvents(); n != before {
		t.Errorf("%d perf events open after release, %d before", n, before)
	}
}

// A release right away waits for the open and closes what it opened.
func TestWarmBreakpointsReleasedAtOnce(t *testing.T) {
	before := perfEvents()
	WarmBreakpoints()()
	if n := perfEvents(); n != before {
		t.Errorf("%d perf events open after release, %d before", n, before)
	}
}

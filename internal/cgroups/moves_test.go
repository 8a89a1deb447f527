package cgroups

import (
	"os"
	"testing"
	"time"
)

// KeepMovesFast moves this process into the cgroup it is in, again and
// again, and leaves it there: its cgroups are the same after Stop, and
// Wait says how many moves were made, the same after a second Stop.
func TestKeepMovesFast(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to move a process between cgroups")
	}
	if _, err := dirOf(os.Getpid(), "freezer"); err != nil {
		t.Skipf("no freezer cgroup to move this process in: %v", err)
	}
	before, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	k := KeepMovesFast()
	time.Sleep(6 * keepEvery)
	k.Stop()
	moves, err := k.Wait()
	if err != nil {
		t.Fatalf("a move failed: %v", err)
	}
	// The first waits for a grace period (up to ~16 ms here), the others
	// come every keepEvery.
	if moves < 2 {
		t.Errorf("%d moves in %v, want at least 2", moves, 6*keepEvery)
	}
	k.Stop()
	if again, err := k.Wait(); again != moves || err != nil {
		t.Errorf("after a second Stop: %d moves, %v; want %d, nil", again, err, moves)
	}
	after, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Errorf("the process's cgroups changed:\n%s\nbecame\n%s", before, after)
	}
}

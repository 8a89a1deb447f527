package cgroups

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Moving a process into a cgroup takes the kernel's cgroup threadgroup
// lock for writing, and unless a hierarchy is mounted with favordynmods,
// the writer first switches the lock's per-CPU readers (every fork and
// exit) to a shared mode: an RCU grace period, 5-16 ms on a 2-core VM.
// The lock stays in that mode for about a grace period after its last
// writer, so a move within ~20 ms of another took 0.03-0.1 ms here. A
// restore moves the restored tasks into the container's cgroups, and
// runc moves CRIU, inside the downtime.

// keepEvery spaces KeepMovesFast's moves: well within the ~20 ms that
// the lock stays in its writers' mode.
const keepEvery = 10 * time.Millisecond

// MovesKept is KeepMovesFast at work.
type MovesKept struct {
	done  chan struct{}
	ended chan struct{}
	stop  sync.Once
	moves int
	err   error
}

// KeepMovesFast keeps every move of a process into a cgroup on this host
// fast until Stop, by moving this process into its own cgroup (a move
// that changes nothing) every 10 ms. Meanwhile forks and exits take the
// lock's shared mode, as favordynmods has them do all the time. A move
// that fails (no freezer hierarchy, no permission) ends the keeping.
func KeepMovesFast() *MovesKept {
	k := &MovesKept{done: make(chan struct{}), ended: make(chan struct{})}
	dir, err := dirOf(os.Getpid(), "freezer")
	if err != nil {
		k.err = err
		close(k.ended)
		return k
	}
	procs := filepath.Join(dir, "cgroup.procs")
	self := []byte(strconv.Itoa(os.Getpid()))
	go func() {
		defer close(k.ended)
		t := time.NewTicker(keepEvery)
		defer t.Stop()
		for {
			if k.err = os.WriteFile(procs, self, 0); k.err != nil {
				return
			}
			k.moves++
			select {
			case <-t.C:
			case <-k.done:
				return
			}
		}
	}()
	return k
}

// Stop ends the moves; one under way ends by itself.
func (k *MovesKept) Stop() { k.stop.Do(func() { close(k.done) }) }

// Wait returns, once the moves have ended, how many were made and the
// error that ended them early, if any.
func (k *MovesKept) Wait() (moves int, err error) {
	<-k.ended
	return k.moves, k.err
}

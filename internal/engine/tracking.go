package engine

import (
	"fmt"
	"sort"

	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/pages"
)

// Content-based pre-copy finds changed pages by hashing all of memory
// every round. Where the kernel tracks writes for it (userfaultfd's
// asynchronous write protection and PAGEMAP_SCAN, package dirty), a round
// reads only what was written since the round before, and so does
// hybrid's and the rebuild's frozen last round: their cost follows the
// dirty rate, not the container's size. Hashes still decide what is sent.

// Write tracking of content pre-copy (PrecopyOptions.WriteTracking).
const (
	TrackingAuto = "auto" // the kernel's write tracking where it works, else hashing all
	TrackingOff  = "off"  // read and hash all of memory every round
)

// writeTracking holds a tracker for each of the container's processes
// that could have one.
type writeTracking struct {
	on       bool
	trackers map[int]*dirty.Tracker // by host pid
	failed   map[int]error          // processes read whole, and why
}

func newWriteTracking(mode string) *writeTracking {
	return &writeTracking{on: mode != TrackingOff, trackers: map[int]*dirty.Tracker{}, failed: map[int]error{}}
}

// forPIDs starts tracking the processes not yet tracked, if running (a
// process makes its userfaultfd itself, which a frozen one cannot), and
// returns the trackers of pids. A process that cannot be tracked (the
// kernel, its seccomp profile) is read whole.
func (w *writeTracking) forPIDs(pids []int, running bool) map[int]pages.WriteTracker {
	out := map[int]pages.WriteTracker{}
	if !w.on {
		return out
	}
	for _, pid := range pids {
		t, ok := w.trackers[pid]
		if !ok && running && w.failed[pid] == nil {
			var err error
			if t, err = dirty.Track(pid); err != nil {
				w.failed[pid] = err
				continue
			}
			w.trackers[pid] = t
		}
		if t != nil {
			out[pid] = t
		}
	}
	return out
}

// close stops tracking: the processes' memory is as if never tracked.
func (w *writeTracking) close() {
	for pid, t := range w.trackers {
		t.Close()
		delete(w.trackers, pid)
	}
}

// summary says how the rounds found changed pages, for the report.
func (w *writeTracking) summary() string {
	if !w.on {
		return "hashing all memory (write tracking off)"
	}
	n := len(w.trackers)
	if len(w.failed) == 0 {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf("userfaultfd write protection (%d of %d processes)", n, n)
	}
	pids := make([]int, 0, len(w.failed))
	for pid := range w.failed {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return fmt.Sprintf("userfaultfd write protection (%d of %d processes); hashing all memory of process %d: %v",
		n, n+len(w.failed), pids[0], w.failed[pids[0]])
}

// pageSet is the pages a round found: those it read one by one, and the
// ranges write tracking reported unchanged (a map entry per page of a
// large container would cost more than the tracking saves).
type pageSet struct {
	pages  map[pages.Key]struct{}
	ranges []pages.Range
	sorted bool
}

// newPageSet sizes the set for the pages held, or for a few of them where
// tracking reports most as ranges.
func newPageSet(held int, tracked bool) *pageSet {
	if tracked {
		held /= 16
	}
	return &pageSet{pages: make(map[pages.Key]struct{}, held)}
}

func (s *pageSet) add(k pages.Key) { s.pages[k] = struct{}{} }

func (s *pageSet) addRange(r pages.Range) {
	s.ranges = append(s.ranges, r)
	s.sorted = false
}

func (s *pageSet) has(k pages.Key) bool {
	if _, ok := s.pages[k]; ok {
		return true
	}
	if !s.sorted {
		sort.Slice(s.ranges, func(i, j int) bool {
			a, b := s.ranges[i], s.ranges[j]
			return a.PID < b.PID || a.PID == b.PID && a.Start < b.Start
		})
		s.sorted = true
	}
	// The first range after k; k is in the one before it, if anywhere.
	i := sort.Search(len(s.ranges), func(i int) bool {
		r := s.ranges[i]
		return r.PID > k.PID || r.PID == k.PID && r.Start > k.Addr
	})
	if i == 0 {
		return false
	}
	r := s.ranges[i-1]
	return r.PID == k.PID && k.Addr >= r.Start && k.Addr < r.End
}

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
// kernel, its seccomp profile) is read whole. Frozen, the round is the
// last: its scans do not protect again.
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
			if !running {
				t.Last()
			}
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

// pageSet is the pages a round found, as ranges: a round reports pages
// in address order, process by process, so neighbours extend the range
// before them (a map entry per page of a large container would cost more
// than write tracking saves). Every page in it is one the destination
// holds as the round found it.
type pageSet struct {
	ranges []pages.Range
	index  map[uint32][]pages.Range // sorted and merged, built on first use
}

func newPageSet() *pageSet { return &pageSet{} }

func (s *pageSet) add(k pages.Key) {
	s.addRange(pages.Range{PID: k.PID, Start: k.Addr, End: k.Addr + pageSize})
}

func (s *pageSet) addRange(r pages.Range) {
	s.index = nil
	if n := len(s.ranges); n > 0 {
		if last := &s.ranges[n-1]; last.PID == r.PID && last.End == r.Start {
			last.End = r.End
			return
		}
	}
	s.ranges = append(s.ranges, r)
}

// process returns the set's ranges of one process, sorted and merged.
func (s *pageSet) process(pid uint32) []pages.Range {
	if s.index == nil {
		s.index = indexRanges(s.ranges)
	}
	return s.index[pid]
}

func (s *pageSet) has(k pages.Key) bool {
	rs := s.process(k.PID)
	i := sort.Search(len(rs), func(i int) bool { return rs[i].End > k.Addr })
	return i < len(rs) && rs[i].Start <= k.Addr
}

// heldParts returns the parts of r in the set, in address order: what the
// next round need not read of a range the kernel says was not written.
// A nil set (no round before) holds nothing.
func (s *pageSet) heldParts(r pages.Range) []pages.Range {
	if s == nil {
		return nil
	}
	rs := s.process(r.PID)
	var out []pages.Range
	for i := sort.Search(len(rs), func(i int) bool { return rs[i].End > r.Start }); i < len(rs) && rs[i].Start < r.End; i++ {
		out = append(out, pages.Range{PID: r.PID, Start: max(rs[i].Start, r.Start), End: min(rs[i].End, r.End)})
	}
	return out
}

// indexRanges sorts ranges by process and address and merges those that
// touch.
func indexRanges(ranges []pages.Range) map[uint32][]pages.Range {
	by := map[uint32][]pages.Range{}
	for _, r := range ranges {
		by[r.PID] = append(by[r.PID], r)
	}
	for pid, rs := range by {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
		merged := rs[:1]
		for _, r := range rs[1:] {
			if last := &merged[len(merged)-1]; r.Start <= last.End {
				last.End = max(last.End, r.End)
				continue
			}
			merged = append(merged, r)
		}
		by[pid] = merged
	}
	return by
}

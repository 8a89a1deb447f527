package engine

import (
	"slices"
	"time"

	"github.com/ferry-migrate/ferry/internal/images"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Hybrid's destination restores lazily, and every page the copy touches
// first after the commit costs a fault's round trip through the lazy-pages
// daemon, ferry's relay and the page store, one after another: 11-22 ms
// before memhog answered again, against 2-5 ms for pre-copy, whose daemon
// reads its own images. The pages the container keeps writing (its
// stacks, its allocator's and scheduler's state: written in the frozen
// round and in the live round before it) are those it touches first once
// it runs again: the restore writes them into the copy itself
// (images.FillPicked), and the faults left are for memory it had not
// touched lately. A page written once, as a workload's data often is
// (memhog's are, at random), is left to the daemon: each picked page adds
// to the restore.

// maxLastWrites bounds the pages the restore writes itself (~7 µs each
// here, its fill and its copy): beyond that they cost more downtime than
// the faults they spare.
const maxLastWrites = 1024

// lastWrites records the pages the last two rounds after the first
// brought, as the store takes them (Store.Observe). It is used by the
// goroutine receiving the rounds, then read once they are all in.
type lastWrites struct {
	rounds int            // rounds ended
	cur    []pages.Key    // the round being received
	ended  [2][]pages.Key // the last round ended, then the one before
}

func (l *lastWrites) put(k pages.Key, _ []byte) {
	if l.rounds > 0 { // the first round is all of memory
		l.cur = append(l.cur, k)
	}
}

func (l *lastWrites) roundEnded() {
	if l.rounds > 0 {
		l.ended[0], l.ended[1], l.cur = l.cur, l.ended[0], l.ended[1][:0]
	}
	l.rounds++
}

// picked lists the pages both of the last two rounds brought, each task's
// sorted, at most max of them.
func (l *lastWrites) picked(max int) map[uint32][]uint64 {
	before := make(map[pages.Key]bool, len(l.ended[1]))
	for _, k := range l.ended[1] {
		before[k] = true
	}
	out := make(map[uint32][]uint64)
	n := 0
	for _, k := range l.ended[0] {
		if n == max {
			break
		}
		if before[k] {
			before[k] = false // once
			out[k.PID] = append(out[k.PID], k.Addr)
			n++
		}
	}
	for _, addrs := range out {
		slices.Sort(addrs)
	}
	return out
}

// restoreLastWrites has the restore write the pages the container wrote
// last (see above) from the store into the copy.
func (in *incoming) restoreLastWrites() (filled, error) {
	start := time.Now()
	st, err := images.FillPicked(in.images, in.lastWrites.picked(maxLastWrites), func(pid uint32, addr uint64, dst []byte) bool {
		_, ok := in.store.ReadInto(pages.Key{PID: pid, Addr: addr}, dst)
		return ok
	})
	return filled{st, units.Millis(time.Since(start))}, err
}

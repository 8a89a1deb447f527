package engine

import (
	"context"
	"errors"
	"maps"
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
//
// Post-copy has no rounds, and its faults cross to the source (1-2 ms
// each, 20-35 ms before memhog answered). Its source tracks the writes
// while the root filesystem syncs and the dump gets ready, and sends the
// pages written then beside the frozen dump, as one round: the pages the
// container was working on, which the restore writes in the same way.

// maxLastWrites bounds the pages the restore writes itself (~7 µs each
// here, its fill and its copy): beyond that they cost more downtime than
// the faults they spare.
const maxLastWrites = 1024

// lastWrites records the pages the last two rounds brought, as the store
// takes them (Store.Observe), from round first on (hybrid's first round is
// all of memory; post-copy's only one is its last writes). It is used by
// the goroutine receiving the rounds, then read once they are all in.
type lastWrites struct {
	first  int            // the first round that counts
	rounds int            // rounds ended
	cur    []pages.Key    // the round being received
	ended  [2][]pages.Key // the last round ended, then the one before
}

func (l *lastWrites) put(k pages.Key, _ []byte) {
	if l.rounds >= l.first {
		l.cur = append(l.cur, k)
	}
}

func (l *lastWrites) roundEnded() {
	if l.rounds >= l.first {
		l.ended[0], l.ended[1], l.cur = l.cur, l.ended[0], l.ended[1][:0]
	}
	l.rounds++
}

// picked lists the pages both of the last two rounds brought (all of the
// only one, where one counts), each task's sorted, at most max of them.
func (l *lastWrites) picked(max int) map[uint32][]uint64 {
	both := l.rounds-l.first > 1
	before := make(map[pages.Key]bool, len(l.ended[1]))
	for _, k := range l.ended[1] {
		before[k] = true
	}
	seen := make(map[pages.Key]bool)
	out := make(map[uint32][]uint64)
	n := 0
	for _, k := range l.ended[0] {
		if n == max {
			break
		}
		if (!both || before[k]) && !seen[k] {
			seen[k] = true
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
	in.store.Observe(nil, nil) // post-copy's push fills it next
	st, err := images.FillPicked(in.images, in.lastWrites.picked(maxLastWrites), func(pid uint32, addr uint64, dst []byte) bool {
		_, ok := in.store.ReadInto(pages.Key{PID: pid, Addr: addr}, dst)
		return ok
	})
	return filled{st, units.Millis(time.Since(start))}, err
}

// maxPostcopyWrites bounds what post-copy's source sends beside its dump
// (2 MiB: 17 ms of a 1 Gbit/s link, within the dump's time here).
const maxPostcopyWrites = 512

// errEnough stops a scan once it found what it may send.
var errEnough = errors.New("enough pages")

// lastWritesSource is post-copy's source half: trackers on the container's
// processes from before the root filesystem sync, and the rounds channel
// that carries what they found.
type lastWritesSource struct {
	ps       *precopySource
	trackers map[int]pages.WriteTracker
}

// trackLastWrites opens the rounds channel and starts tracking the
// running container's writes (where the kernel can: else nothing is
// sent). The trackers' first scan protects every page: from then on only
// writes count.
func (m *migration) trackLastWrites() (*lastWritesSource, error) {
	ps, err := m.startRounds()
	if err != nil {
		return nil, err
	}
	l := &lastWritesSource{ps: ps, trackers: map[int]pages.WriteTracker{}}
	pids, err := pages.ContainerPIDs(m.ctr.PID)
	if err != nil {
		return l, nil
	}
	for pid, t := range ps.tracking.forPIDs(pids, true) {
		if t.Scan(func(uint64, uint64, bool) error { return nil }) == nil {
			l.trackers[pid] = t
		}
	}
	m.report.WriteTracking = ps.tracking.summary()
	return l, nil
}

// send reads the pages the frozen container's processes wrote since
// tracking began, up to maxPostcopyWrites, and sends them as one round.
func (l *lastWritesSource) send(ctx context.Context, m *migration) error {
	ps := l.ps
	if len(l.trackers) > 0 {
		pids := slices.Collect(maps.Keys(l.trackers))
		ps.tracking.forPIDs(pids, false) // frozen: the scan is the last, it protects nothing
		if rd, err := pages.NewReader(pids); err == nil {
			// Pages not written since are not sent: the daemon asks for them.
			rd.UseTrackersWrittenOnly(l.trackers)
			n := 0
			_, err := rd.Scan(func(p pages.Page) error {
				if err := ctx.Err(); err != nil {
					return withdrawn(err)
				}
				if n == maxPostcopyWrites {
					return errEnough
				}
				n++
				return ps.enc.Page(p.Key, p.Data)
			})
			if err != nil && !errors.Is(err, errEnough) {
				return err
			}
		}
	}
	if err := ps.enc.EndRound(0); err != nil {
		return err
	}
	// Its acknowledgement is read beside the switchover (pendingAcks).
	ps.unacked = true
	acked, err := ps.finish(false)
	m.acks.expect("post-copy's last writes", acked)
	return err
}

// close ends the tracking (at the migration's end: closing a tracker
// takes the process's memory map lock for tens of ms at 1 GiB).
func (l *lastWritesSource) close() { l.ps.close() }

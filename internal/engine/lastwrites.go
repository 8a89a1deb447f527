package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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

// A restored process also reads memory it did not write lately, and
// post-copy's copy faults on it at once: of the first 33 faults of one
// run at 1 GiB (1.9 ms each across the link), 29 fell on Go's runtime
// mappings and heap and 4 on memhog's 1 GiB buffer. Which pages a process
// reads is not known here (no accessed bit per page), but where it reads
// is: its small mappings (stacks, its runtime's and allocator's state,
// libraries' data) serve every step it takes; its large ones hold its
// data. So while the container runs, post-copy's source sends its
// smallest mappings, up to maxAhead, as a round before the last writes'.
// At the freeze it reads them again, sends the pages that changed and
// names those gone: the destination holds them as they were frozen and
// serves the copy's faults on them itself, and the push skips them.

// maxAhead bounds the memory post-copy sends ahead (8 MiB: 67 ms of a
// 1 Gbit/s link before the freeze; read again while frozen, beside
// CRIU's dump, in a few ms). Mappings larger than maxAheadMapping are
// data, and the stretches read again span at most maxAheadSpan of
// addresses (their page tables are walked while frozen).
const (
	maxAhead        = 2048 // pages
	maxAheadMapping = 64 << 20
	maxAheadSpan    = 1 << 30
)

// errEnough stops a scan once it found what it may send.
var errEnough = errors.New("enough pages")

// lastWritesSource is post-copy's source half: trackers on the container's
// processes from before the root filesystem sync, and the rounds channel
// that carries what they found.
type lastWritesSource struct {
	ps       *precopySource
	trackers map[int]pages.WriteTracker
	// ahead is the pages sent ahead (their hashes are in ps.held).
	ahead *pageSet
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
	l := &lastWritesSource{ps: ps, trackers: map[int]pages.WriteTracker{}, ahead: newPageSet()}
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

// sendAhead sends the running container's smallest mappings, up to
// maxAhead pages, as round 0 (see above); the pages the container changes
// after are found when they are read again (sendAheadAgain).
func (l *lastWritesSource) sendAhead(ctx context.Context, m *migration) error {
	ps := l.ps
	if err := l.readAhead(ctx, m.ctr.PID); err != nil {
		return err
	}
	if err := ps.enc.EndRound(0); err != nil {
		return err
	}
	var ack RoundAck
	if err := ps.ch.Recv(&ack); err != nil {
		return fmt.Errorf("destination did not acknowledge the pages sent ahead: %w", err)
	}
	return nil
}

// readAhead sends the smallest data mappings' pages of the container
// whose init is pid first (code is the files', and CRIU patches it while
// it dumps), until maxAhead. l.ahead gets the stretches read: whole
// mappings, and the last one up to where it stopped.
func (l *lastWritesSource) readAhead(ctx context.Context, pid int) error {
	pids, err := pages.ContainerPIDs(pid)
	if err != nil {
		return err
	}
	rd, err := pages.NewReader(pids)
	if err != nil {
		return err
	}
	ranges, err := rd.DataMappings()
	if err != nil {
		return err
	}
	slices.SortStableFunc(ranges, func(a, b pages.Range) int { return cmp.Compare(a.End-a.Start, b.End-b.Start) })
	ps := l.ps
	var span uint64
	for _, rg := range ranges {
		size := rg.End - rg.Start
		if size > maxAheadMapping || span+size > maxAheadSpan {
			return nil
		}
		span += size
		err := rd.ReadRange(rg, func(p pages.Page) error {
			if err := ctx.Err(); err != nil {
				return withdrawn(err)
			}
			if len(ps.held) == maxAhead {
				rg.End = p.Key.Addr
				return errEnough
			}
			ps.held[p.Key] = p.Hash
			return ps.enc.Page(p.Key, p.Data)
		})
		if (err == nil || errors.Is(err, errEnough)) && rg.End > rg.Start {
			l.ahead.addRange(rg)
		}
		if errors.Is(err, errEnough) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// sendAheadAgain reads the stretches sent ahead from the frozen container
// and sends the pages that changed or came since; ps.seen has those there
// now.
func (l *lastWritesSource) sendAheadAgain(ctx context.Context, pid int) error {
	ps := l.ps
	ps.seen = newPageSet()
	if len(ps.held) == 0 {
		return nil
	}
	pids, err := pages.ContainerPIDs(pid)
	if err != nil {
		return nil // gone: every page sent ahead is stale
	}
	rd, err := pages.NewReader(pids)
	if err != nil {
		return nil
	}
	return rd.ReadRanges(l.ahead.ranges, func(p pages.Page) error {
		if err := ctx.Err(); err != nil {
			return withdrawn(err)
		}
		ps.seen.add(p.Key)
		if h, ok := ps.held[p.Key]; ok && h == p.Hash {
			return nil
		}
		ps.held[p.Key] = p.Hash
		return ps.enc.Page(p.Key, p.Data)
	})
}

// send sends, as one round, the pages sent ahead that changed since, and
// the pages the frozen container's processes wrote since tracking began,
// up to maxPostcopyWrites; the round's end names the pages sent ahead
// that are gone.
func (l *lastWritesSource) send(ctx context.Context, m *migration) error {
	ps := l.ps
	if err := l.sendAheadAgain(ctx, m.ctr.PID); err != nil {
		return err
	}
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
				if l.ahead.has(p.Key) {
					return nil // read again above
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
	if err := ps.enc.EndRound(1); err != nil {
		return err
	}
	var ack RoundAck
	if err := ps.ch.Recv(&ack); err != nil {
		return fmt.Errorf("destination did not acknowledge the last writes: %w", err)
	}
	if err := ps.finish(true); err != nil {
		return err
	}
	for k := range ps.held {
		if !ps.seen.has(k) {
			delete(ps.held, k)
		}
	}
	return nil
}

// close ends the tracking (at the migration's end: closing a tracker
// takes the process's memory map lock for tens of ms at 1 GiB).
func (l *lastWritesSource) close() { l.ps.close() }

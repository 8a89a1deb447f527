package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"time"

	"github.com/ferry-migrate/ferry/api"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/zeebo/xxh3"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/images"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/pagestream"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Content-based pre-copy, for kernels without soft-dirty tracking (CRIU's
// pre-dump needs it): while the container runs, ferry reads its memory from
// the host, hashes every page and sends the pages whose hash changed since
// the last round; the destination keeps a copy of each. At the switchover
// CRIU dumps the frozen container as usual, but the stream to the
// destination's page server carries a reference instead of every page the
// destination holds with the same hash, and the destination puts its copy
// back in. Correctness rests on the final dump alone: a page from an earlier
// round is used only where its hash equals the final dump's page.

// ChanRounds carries pre-copy rounds (source -> destination) and their
// acknowledgements (destination -> source).
const ChanRounds = "rounds"

// Round describes one pre-copy round.
type Round = api.Round

// RoundAck tells the source a round is stored at the destination.
type RoundAck struct {
	Index int `json:"index"`
	Pages int `json:"pages"` // pages the destination holds
}

// PrecopyOptions are the stop rule and the stream's shape.
type PrecopyOptions = api.PrecopyOptions

// How content-based pre-copy switches over (see api).
const (
	SwitchoverRebuild = api.SwitchoverRebuild
	SwitchoverDump    = api.SwitchoverDump
)

// withDefaults fills the options a request left out.
func withDefaults(o PrecopyOptions) PrecopyOptions {
	if o.MaxRounds <= 0 {
		o.MaxRounds = 8
	}
	if o.MinRoundBytes <= 0 {
		o.MinRoundBytes = 4 << 20
	}
	return o
}

// deltaCacheLimit bounds the copies of sent pages kept for XOR deltas, as
// QEMU's XBZRLE cache does; only pages seen dirty once enter it.
const deltaCacheLimit = 64 << 20

// precopySource is the source side's memory of what the destination holds.
type precopySource struct {
	held   map[pages.Key]xxh3.Uint128
	cache  map[pages.Key][]byte
	cached int64
	enc    *pages.Encoder
	ch     *transport.Channel
	next   int   // index of the next round
	last   Round // the last round sent
	// seen holds the pages the latest round found.
	seen *pageSet
	// unacked: the last round was sent without waiting for its
	// acknowledgement (finish leaves it to the switchover's pendingAcks).
	unacked bool
	// tracking finds the written pages where the kernel can; frozen: the
	// container is, so no process can start being tracked.
	tracking *writeTracking
	frozen   bool
}

// close ends the rounds channel and the write tracking.
func (ps *precopySource) close() {
	ps.ch.Close()
	ps.tracking.close()
}

func (m *migration) precopy(ctx context.Context) error {
	var ahead *aheadDump
	if m.req.Precopy.Switchover == SwitchoverRebuild {
		ahead = m.lazyDumpAhead(ctx)
	}
	rs, err := m.liveRoundsBesideRootfs(ctx)
	if err != nil {
		if ahead != nil {
			ahead.drop()
		}
		return err
	}
	defer rs.close()
	if ahead != nil {
		return m.finalRoundThen(ctx, rs, ahead, m.rebuildSwitchover)
	}
	if _, err := rs.finish(false); err != nil {
		return m.abort(ctx, failAt("pre-copy", err))
	}
	rs.tracking.close() // CRIU dumps memory as if never tracked
	if err := m.freeze(ctx); err != nil {
		return m.abort(ctx, err)
	}
	m.begin(phaseDump)
	lookup := func(k pagestream.PageKey) (pagestream.Hash, bool) {
		h, ok := rs.held[k]
		return h, ok
	}
	if err := m.dumpStreamingVia(ctx, func(dst io.Writer, src io.Reader) error {
		st, err := pagestream.Dedup(dst, src, lookup)
		m.report.PagesReferenced = st.Referenced
		return err
	}); err != nil {
		return m.abort(ctx, err)
	}
	return m.switchover(ctx)
}

// rebuildSwitchover ends pre-copy after dumpWithFinalRound: the destination
// receives the memory-less dump's images, completes them with the pages it
// holds (asking this host's CRIU page server, through the session, for any
// the rounds never saw), restores them as a plain dump and commits. Until
// the commit the container here stays resumable, as in cold.
func (m *migration) rebuildSwitchover(ctx context.Context, ld *lazyDump) error {
	m.begin(phaseImages)
	lazyCh, err := m.shipLazyDump(ctx, ld, false)
	if err != nil {
		return m.abort(ctx, err)
	}
	defer lazyCh.Close()
	return m.switchover(ctx)
}

// receivePrecopy is content pre-copy's destination half: the rounds into
// the store, then the final dump's page server, which puts the pages its
// references name back from the store.
func receivePrecopy(in *incoming, ctx context.Context, rx receivers) {
	in.store = in.newStore()
	// Rounds must be stored before the final dump's references arrive.
	rounds := make(chan error, 1)
	go func() { rounds <- in.receiveRounds(ctx, rx.sess, rx.router) }()
	rx.g.Go(func() error {
		if err := <-rounds; err != nil {
			return err
		}
		return in.receiveFinalPages(ctx, rx.sess, rx.router, in.store)
	})
}

// receiveRebuild is the destination half of the techniques that complete
// a memory-less dump's images from rounds (rebuildSwitchover; cold's too):
// the rounds go into a store and, as a parent image, into the images.
// arriveRebuild (localpull.go) completes them before the restore.
func receiveRebuild(in *incoming, ctx context.Context, rx receivers) {
	in.store = in.newStore()
	in.startParent()
	rx.g.Go(func() error { return in.receiveRounds(ctx, rx.sess, rx.router) })
}

// liveRounds opens the rounds stream and sends rounds while the container
// runs, until the stop rule says switch over.
func (m *migration) liveRounds(ctx context.Context) (*precopySource, error) {
	rs, err := m.startRounds()
	if err != nil {
		return nil, m.abort(ctx, failAt("pre-copy", err))
	}
	if err := m.runRounds(ctx, rs); err != nil {
		rs.close()
		return nil, m.abort(ctx, err)
	}
	return rs, nil
}

// startRounds opens the rounds channel and its encoder.
func (m *migration) startRounds() (*precopySource, error) {
	ch, err := m.sess.Open(ChanRounds)
	if err != nil {
		return nil, err
	}
	enc, err := pages.NewEncoder(ch, m.req.Precopy.Compress == "zstd")
	if err != nil {
		ch.Close()
		return nil, err
	}
	return &precopySource{held: map[pages.Key]xxh3.Uint128{}, cache: map[pages.Key][]byte{}, enc: enc, ch: ch,
		tracking: newWriteTracking(m.req.Precopy.WriteTracking)}, nil
}

// finish ends the rounds stream, then names the pages the destination
// holds that the last round no longer found (unmapped, unreadable): the
// destination must not serve those from its copy. Only hybrid's frozen
// last round makes that list meaningful; pre-copy's final dump checks every
// page by hash anyway and sends an empty one. A last round sent unacked
// leaves acked, which reads its acknowledgement and then closes the
// channel (nil: closed now).
func (ps *precopySource) finish(lastRoundComplete bool) (acked func() error, err error) {
	if err := ps.enc.Close(); err != nil {
		return nil, err
	}
	if err := ps.ch.CloseWrite(); err != nil {
		return nil, err
	}
	stale := StalePages{Keys: []pages.Key{}}
	if lastRoundComplete {
		for k := range ps.held {
			if !ps.seen.has(k) {
				stale.Keys = append(stale.Keys, k)
			}
		}
	}
	if err := ps.ch.Send(stale); err != nil {
		return nil, err
	}
	// Nothing more crosses it. Closed once done, both ends drop it and
	// what it buffered (at the destination up to a window, 16 MiB) before
	// the switchover, where the destination gives memory back, not once
	// the migration's session ends.
	if !ps.unacked {
		return nil, ps.ch.Close()
	}
	return func() error {
		defer ps.ch.Close()
		return ps.recvAck()
	}, nil
}

// recvAck reads the destination's acknowledgement of a round.
func (ps *precopySource) recvAck() error {
	var ack RoundAck
	if err := ps.ch.Recv(&ack); err != nil {
		return fmt.Errorf("destination did not acknowledge: %w", err)
	}
	return nil
}

// StalePages ends the rounds channel: pages the destination must forget.
type StalePages struct {
	Keys []pages.Key `json:"keys"`
}

// runRounds sends rounds while the container runs, until the stop rule
// says switch over, throttling the CPU when auto-converge is on.
func (m *migration) runRounds(ctx context.Context, ps *precopySource) error {
	o := withDefaults(m.req.Precopy)
	throttle := &cpuThrottle{}
	m.liftThrottle = throttle.lift
	var prev *Round
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return failAt(fmt.Sprintf("pre-copy round %d", i), withdrawn(err))
		}
		m.begin(roundPhase(i))
		r, err := m.precopyRound(ctx, ps, i, prev, true)
		if err != nil {
			return failAt(fmt.Sprintf("pre-copy round %d", i), err)
		}
		r.ThrottlePct = throttle.pct
		m.roundDone(r, prev, i, m.contentSwitchover)
		ps.next, ps.last = i+1, r
		stop, why := stopRule(o, r, prev, i, m.contentSwitchover)
		if stop == stopNotConverging && o.AutoConverge && throttle.pct < 99 && i+1 < o.MaxRounds {
			if !m.throttled {
				// Journaled first: an agent that dies from here on lifts it
				// when it starts again.
				m.throttled = true
				if err := m.record(journal.Copying); err != nil {
					return failAt(fmt.Sprintf("pre-copy round %d", i), err)
				}
			}
			if err := throttle.step(m.ctr.PID); err == nil {
				m.report.ThrottlePct = throttle.pct
				prev = &r
				continue
			}
		}
		if stop != keepGoing {
			m.report.StopReason = why
			return nil
		}
		prev = &r
	}
}

// withdrawn is the error of a migration whose context ended.
func withdrawn(err error) error {
	return fmt.Errorf("cancelled (the agent is stopping, or the request was withdrawn): %w", err)
}

// precopyRound reads the whole memory once and sends what changed. With
// await it waits until the destination stored it (a live round: the stop
// rule needs the link's pace); a frozen round's acknowledgement is left to
// finish.
func (m *migration) precopyRound(ctx context.Context, ps *precopySource, i int, prev *Round, await bool) (Round, error) {
	r := Round{Index: i}
	start := time.Now()
	wire0 := m.sess.BytesSent()
	raw0 := ps.enc.RawBytes()
	pids, err := pages.ContainerPIDs(m.ctr.PID)
	if err != nil {
		return r, err
	}
	rd, err := pages.NewReader(pids)
	if err != nil {
		return r, err
	}
	trackers := ps.tracking.forPIDs(pids, !ps.frozen)
	// What the round before found, the destination holds as found: of a
	// range not written since, that part need not be read.
	before := ps.seen
	ps.seen = newPageSet()
	rd.UseTrackers(trackers, before.heldParts, ps.seen.addRange)
	st, err := rd.Scan(func(p pages.Page) error {
		if err := ctx.Err(); err != nil {
			return withdrawn(err) // a cancel need not wait for the round's end
		}
		ps.seen.add(p.Key)
		if old, ok := ps.held[p.Key]; ok && old == p.Hash {
			return nil
		}
		r.Pages++
		if c, ok := ps.cache[p.Key]; ok {
			if d, ok := pages.EncodeDelta(c, p.Data, nil); ok {
				copy(c, p.Data)
				ps.held[p.Key] = p.Hash
				r.DeltaPages++
				return ps.enc.Delta(p.Key, d)
			}
			copy(c, p.Data)
		} else if _, seen := ps.held[p.Key]; seen && ps.cached < deltaCacheLimit {
			ps.cache[p.Key] = append([]byte(nil), p.Data...)
			ps.cached += int64(len(p.Data))
		}
		ps.held[p.Key] = p.Hash
		return ps.enc.Page(p.Key, p.Data)
	})
	if err != nil {
		return r, err
	}
	if err := ps.enc.EndRound(i); err != nil {
		return r, err
	}
	ps.unacked = !await
	if await {
		if err := ps.recvAck(); err != nil {
			return r, err
		}
	}
	if i == 0 {
		m.memoryFound(int64(st.Pages) * pageSize)
	}
	r.UnchangedPages = st.Unchanged
	m.report.WriteTracking = ps.tracking.summary()
	d := time.Since(start)
	r.DurationMs = units.Millis(d)
	r.Bytes = m.sess.BytesSent() - wire0
	r.RawBytes = ps.enc.RawBytes() - raw0
	if prev != nil && prev.DurationMs > 0 {
		r.DirtyRate = float64(r.Pages) / (prev.DurationMs / 1000)
	}
	return r, nil
}

type stopKind int

const (
	keepGoing stopKind = iota
	stopSmall
	stopNotConverging
	stopMaxRounds
	stopFits
)

// stop applies the stop rule after round r. switchover predicts the
// downtime when left bytes remain to send at throughput bytes/s.
func stopRule(o PrecopyOptions, r Round, prev *Round, i int, switchover func(left, throughput float64) time.Duration) (stopKind, string) {
	if r.Bytes < o.MinRoundBytes && i > 0 {
		return stopSmall, fmt.Sprintf("round %d sent %d bytes, under the %d-byte threshold", i, r.Bytes, o.MinRoundBytes)
	}
	if o.MaxDowntime > 0 {
		if pred, ok := predictSwitchover(r, prev, i, switchover); ok && pred <= o.MaxDowntime {
			return stopFits, fmt.Sprintf("predicted downtime %v fits --max-downtime %v", pred.Round(time.Millisecond), o.MaxDowntime)
		}
	}
	if i+1 >= o.MaxRounds {
		return stopMaxRounds, fmt.Sprintf("reached --max-rounds %d", o.MaxRounds)
	}
	if prev != nil && i >= 2 && float64(r.Bytes) >= 0.9*float64(prev.Bytes) {
		return stopNotConverging, fmt.Sprintf("round %d sent %d bytes after %d: the dirty rate is at or above what the link carries", i, r.Bytes, prev.Bytes)
	}
	return keepGoing, ""
}

// predictSwitchover is the downtime switchover predicts for a switchover
// right after round r (the i-th): what r's dirty rate leaves for the final
// pass, at the better of r's and the round before's throughput. false for
// round 0, which measures no dirty rate, and a round that took no time.
func predictSwitchover(r Round, prev *Round, i int, switchover func(left, throughput float64) time.Duration) (time.Duration, bool) {
	if i == 0 || r.DurationMs <= 0 {
		return 0, false
	}
	throughput := float64(r.Bytes) / (r.DurationMs / 1000)
	if prev != nil && prev.DurationMs > 0 {
		throughput = max(throughput, float64(prev.Bytes)/(prev.DurationMs/1000))
	}
	left := r.DirtyRate * (r.DurationMs / 1000) * pageSize
	return switchover(left, throughput), true
}

// contentSwitchover predicts content-based pre-copy's downtime with this
// host's profile (calibrated, or the defaults).
func (m *migration) contentSwitchover(left, throughput float64) time.Duration {
	return seconds(m.profile.SwitchoverS(float64(m.report.MemoryEstimate), left, throughput, m.rt.Caps().LazyRestore))
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// dumpStreamingVia is dumpStreaming with the page stream passed through a
// transform (the source half of pre-copy's deduplication).
func (m *migration) dumpStreamingVia(ctx context.Context, transform func(dst io.Writer, src io.Reader) error) error {
	m.pageTransform = transform
	defer func() { m.pageTransform = nil }()
	return m.dumpStreaming(ctx)
}

// cpuThrottle is auto-converge: a CFS bandwidth limit on the container's
// cgroup, raised each time a round fails to converge.
type cpuThrottle struct {
	pct int
	cpu *cgroups.CPU
	old cgroups.Bandwidth
}

// throttlePeriodUs is the CFS period the throttle sets (the kernel's default).
const throttlePeriodUs = 100_000

// step raises the throttle by QEMU's steps: 20 %, then 10 % more, at most 99 %.
func (t *cpuThrottle) step(pid int) error {
	if t.cpu == nil {
		cpu, err := cgroups.CPUOf(pid)
		if err != nil {
			return err
		}
		old, err := cpu.Get()
		if err != nil {
			return err
		}
		t.cpu, t.old = cpu, old
	}
	switch {
	case t.pct == 0:
		t.pct = 20
	default:
		t.pct = min(t.pct+10, 99)
	}
	return t.cpu.Set(cgroups.Limited(float64(100-t.pct)/100, throttlePeriodUs))
}

// lift restores the limit the container had.
func (t *cpuThrottle) lift() {
	if t.cpu != nil {
		_ = t.cpu.Set(t.old)
	}
}

// LiftThrottle puts back the CPU limit a source container's configuration
// gives, for an agent resuming a copy whose migration throttled it and
// ended with the agent (journal.Entry.Throttled).
func LiftThrottle(ctx context.Context, rt runtime.Runtime, name string) error {
	c, err := rt.Inspect(ctx, name)
	if err != nil {
		return err
	}
	return liftThrottle(c.PID, c.Spec)
}

// liftThrottle puts back the CPU limit the container's configuration
// gives (none, where it gives none): CRIU restored the cgroup as the
// source's auto-converge left it.
func liftThrottle(pid int, spec []byte) error {
	cpu, err := cgroups.CPUOf(pid)
	if err != nil {
		return err
	}
	return cpu.Set(configuredCPU(spec))
}

// configuredCPU is the CPU limit an OCI configuration sets.
func configuredCPU(spec []byte) cgroups.Bandwidth {
	var s specs.Spec
	if json.Unmarshal(spec, &s) != nil || s.Linux == nil || s.Linux.Resources == nil || s.Linux.Resources.CPU == nil {
		return cgroups.Unlimited
	}
	c := s.Linux.Resources.CPU
	if c.Quota == nil || *c.Quota <= 0 {
		return cgroups.Unlimited
	}
	b := cgroups.Bandwidth{QuotaUs: *c.Quota}
	if c.Period != nil {
		b.PeriodUs = *c.Period
	}
	return b
}

// --- destination ---

// receiveRounds stores every round's pages and acknowledges each round.
func (in *incoming) receiveRounds(ctx context.Context, sess *transport.Session, router *transport.Router) error {
	ch, err := router.Wait(ctx, sess, ChanRounds)
	if err != nil {
		return err
	}
	defer ch.Close()
	dec, err := pages.NewDecoder(ch)
	if err != nil {
		return err
	}
	for {
		round, end, err := dec.Next(in.store)
		if errors.Is(err, io.EOF) {
			// Read to the channel's end of data, then the stale list.
			if _, err := io.Copy(io.Discard, ch); err != nil {
				return err
			}
			var stale StalePages
			if err := ch.Recv(&stale); err != nil {
				return fmt.Errorf("pre-copy stream: %w", err)
			}
			for _, k := range stale.Keys {
				in.store.Delete(k)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("pre-copy stream: %w", err)
		}
		if end {
			if in.lastWrites != nil {
				in.lastWrites.roundEnded()
			}
			if round == 1 {
				in.faults.At(fault.Destination, fault.Rounds)
			}
			if round == 0 && in.parent != nil {
				_ = in.parent.Seal() // a broken image is not used
			}
			if err := ch.Send(RoundAck{Index: round, Pages: in.store.Len()}); err != nil {
				return err
			}
		}
	}
}

// startParent has the store's pages laid out as a parent image as the
// first round brings them (images.ParentImage) and kept current with every
// later change: the switchover's completed dump then refers to it instead
// of copying those pages while the container is down. Set before the
// rounds start, so no change is missed.
func (in *incoming) startParent() {
	if in.rt.Caps().CopiesImages && !in.restoresFromOwnImages() {
		return // the restore copies the images: they must be whole
	}
	parent, err := images.NewParent(filepath.Join(in.work, "parent"))
	if err != nil {
		return // the switchover copies every page instead
	}
	ref := func(k pages.Key) images.PageRef { return images.PageRef{PID: k.PID, Addr: k.Addr} }
	in.store.Observe(func(k pages.Key, data []byte) { _ = parent.Put(ref(k), data) },
		func(k pages.Key) { parent.Forget(ref(k)) })
	in.parent = parent
}

// runExpandingPageServer is runPageServer with pre-copy's references put
// back: CRIU's page server sees the plain stream.
func runExpandingPageServer(ctx context.Context, ch *transport.Channel, store *pages.Store, imagesDir, workDir string) error {
	expand := func(dst io.Writer, src io.Reader) error {
		_, err := pagestream.Expand(dst, src, func(k pagestream.PageKey) ([]byte, pagestream.Hash, bool) {
			return store.Get(k)
		})
		return err
	}
	return criu.PageServer(ctx, imagesDir, workDir, func(conn *net.UnixConn) error {
		return spliceVia(conn, ch, plainCopy, expand, nil)
	})
}

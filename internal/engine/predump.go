package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Native pre-copy, where the kernel tracks dirty pages (soft-dirty): each
// round is a CRIU pre-dump (`runc checkpoint --pre-dump`, memory tracking
// on) whose pages stream to a page server at the destination, into a
// directory of its own whose "parent" link names the round before; the
// final dump carries only the pages changed since the last pre-dump and
// the restore follows the parent chain. This is what CRIU and P.Haul do;
// ferry adds the streaming and the stop rule.
//
// This machine's kernel has no soft-dirty, so this engine is exercised only
// where the kernel has it; its test skips here and says so.

// Engines behind mode precopy.
const (
	PrecopyAuto    = "auto"    // native where the kernel tracks dirty pages, else content
	PrecopyNative  = "native"  // CRIU pre-dump with soft-dirty
	PrecopyContent = "content" // ferry's content hashing
)

// predumpChan is round i's page stream.
func predumpChan(i int) string { return fmt.Sprintf("predump.%d", i) }

// predumpDir is round i's images directory, under a migration's work dir.
func predumpDir(i int) string { return fmt.Sprintf("pre-%d", i) }

// PageStreamInfo opens a page stream: where its images go and which round
// is their parent (-1: none).
type PageStreamInfo struct {
	Round  int `json:"round"`  // -1 for the final dump
	Parent int `json:"parent"` // -1 without a parent
}

func (m *migration) precopyNative(ctx context.Context) error {
	o := withDefaults(m.req.Precopy)
	if err := m.syncRootfsLive(ctx); err != nil {
		return err
	}
	// A dump of what is left, then a restore of all of memory.
	switchover := func(left, throughput float64) time.Duration {
		p := m.profile
		return seconds(p.FreezeS + p.DumpFixedS + left/throughput + p.RestoreFixedS + float64(m.report.MemoryEstimate)/p.RestoreBps)
	}
	var prev *Round
	last := -1
	for i := 0; i < o.MaxRounds; i++ {
		m.begin(roundPhase(i))
		r, err := m.predumpRound(ctx, i, last)
		if err != nil {
			// CRIU freezes the container for each pre-dump: killed in one,
			// it leaves it frozen. The abort then resumes it as after any
			// freeze, and says so, rather than reporting a container that
			// never stopped.
			if st, serr := runtime.State(context.WithoutCancel(ctx), m.rt, m.ctr.Name); serr == nil && st != "running" {
				m.begin(phaseFreeze) // CRIU's, as the report shows it
				m.frozenAt = time.Now()
			}
			return m.abort(ctx, failAt(fmt.Sprintf("pre-dump round %d", i), err))
		}
		m.roundDone(r, prev, i, switchover)
		last = i
		stop, why := stopRule(o, r, prev, i, switchover)
		if stop != keepGoing {
			m.report.StopReason = why
			break
		}
		prev = &r
	}
	if err := m.freeze(ctx); err != nil {
		return m.abort(ctx, err)
	}
	m.begin(phaseDump)
	m.parentRound = last
	if err := m.dumpStreaming(ctx); err != nil {
		return m.abort(ctx, err)
	}
	return m.switchover(ctx)
}

// predumpRound runs one pre-dump with its pages streamed to the
// destination. CRIU freezes the container briefly to collect the pages.
func (m *migration) predumpRound(ctx context.Context, i, parent int) (Round, error) {
	r := Round{Index: i}
	start := time.Now()
	wire0 := m.sess.BytesSent()
	dir := filepath.Join(m.work, predumpDir(i))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return r, err
	}
	ch, err := m.sess.Open(predumpChan(i))
	if err != nil {
		return r, err
	}
	defer ch.Close()
	if err := ch.Send(PageStreamInfo{Round: i, Parent: parent}); err != nil {
		return r, err
	}
	addr, tunnelDone, err := pageClientTunnel(ctx, ch, nil)
	if err != nil {
		return r, err
	}
	opts := runtime.CheckpointOptions{ImagesDir: dir, WorkDir: dir, PageServer: addr, PreDump: true, TCPEstablished: m.keepsAddress()}
	if parent >= 0 {
		opts.ParentDir = filepath.Join("..", predumpDir(parent))
	}
	if _, err := m.checkpoint(ctx, ch, opts); err != nil {
		ch.Close()
		return r, err
	}
	if err := tunnelDone(); err != nil {
		return r, err
	}
	if st, err := criu.ReadDumpStats(dir); err == nil {
		r.Pages = st.PagesWritten
		r.FrozenMs = units.Millis(st.FrozenTime)
		if i == 0 {
			m.memoryFound(int64(st.PagesScanned) * pageSize)
		}
	}
	d := time.Since(start)
	r.DurationMs = units.Millis(d)
	r.Bytes = m.sess.BytesSent() - wire0
	r.RawBytes = int64(r.Pages) * pageSize
	if i > 0 {
		r.DirtyRate = float64(r.Pages) / d.Seconds()
	}
	return r, nil
}

// receivePredumps runs a page server for each pre-dump round the source
// may send, each into its own directory linked to its parent's.
func (in *incoming) receivePredumps(ctx context.Context, sess *transport.Session, router *transport.Router, rounds int) {
	for i := 0; i < rounds; i++ {
		go func(i int) {
			ch, err := router.Wait(ctx, sess, predumpChan(i))
			if err != nil {
				return
			}
			defer ch.Close()
			var info PageStreamInfo
			if err := ch.Recv(&info); err != nil {
				return
			}
			dir := filepath.Join(in.work, predumpDir(i))
			if err := linkParent(dir, info.Parent); err != nil {
				_ = ch.Fail(err)
				return
			}
			if err := runPageServer(ctx, ch, dir, dir); err != nil {
				_ = ch.Fail(err)
			}
		}(i)
	}
}

// linkParent makes dir and, for a round with a parent, its "parent" link,
// which CRIU follows for pages that did not change.
func linkParent(dir string, parent int) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if parent < 0 {
		return nil
	}
	return os.Symlink(filepath.Join("..", predumpDir(parent)), filepath.Join(dir, "parent"))
}

// nativeChannels are native pre-copy's: one per pre-dump it may run,
// then the final dump's pages.
func nativeChannels(o PrecopyOptions) []string {
	chans := []string{ChanPages}
	for i := 0; i < withDefaults(o).MaxRounds; i++ {
		chans = append(chans, predumpChan(i))
	}
	return chans
}

// receiveNative is native pre-copy's destination half: the pre-dumps'
// page servers, then the final dump's, linked to its parent.
func receiveNative(in *incoming, ctx context.Context, rx receivers) {
	in.receivePredumps(ctx, rx.sess, rx.router, withDefaults(in.offer.Precopy).MaxRounds)
	rx.g.Go(func() error { return in.receiveFinalPages(ctx, rx.sess, rx.router, nil) })
}

package engine

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// Hybrid: pre-copy rounds while the container runs, then post-copy for
// what is left. At the switchover CRIU dumps without memory (--lazy-pages)
// while ferry reads the frozen memory and sends the pages that changed
// since the last round as one more round; the destination's lazy-pages
// daemon is then served from the destination's own copy, and only requests
// for pages the rounds never carried cross the network to CRIU's page
// server at the source. A stored page is used only if the frozen memory's
// page has its hash: the final round replaced every page that differed.
func (m *migration) hybrid(ctx context.Context) error {
	ahead := m.lazyDumpAhead(ctx)
	rs, err := m.liveRoundsBesideRootfs(ctx)
	if err != nil {
		ahead.drop()
		return err
	}
	defer rs.close()
	return m.finalRoundThen(ctx, rs, ahead, m.lazySwitchover)
}

// finalRoundThen ends pre-copy's rebuild, hybrid and cold's rebuild:
// dumpWithFinalRound, then switchover with the lazy dump, which stops
// when the migration ends.
func (m *migration) finalRoundThen(ctx context.Context, rs *precopySource, ahead *aheadDump, switchover func(context.Context, *lazyDump) error) error {
	ld, err := m.dumpWithFinalRound(ctx, rs, ahead)
	if err != nil {
		return m.abort(ctx, err)
	}
	defer ld.stop()
	return switchover(ctx, ld)
}

// aheadDump is a lazy dump readied (beginLazyDump) beside the live
// rounds, so that the wait for the runtime's dump to come to its gate is
// not added to the migration.
type aheadDump struct {
	done chan struct{}
	ld   *lazyDump
	err  error
}

func (m *migration) lazyDumpAhead(ctx context.Context) *aheadDump {
	a := &aheadDump{done: make(chan struct{})}
	go func() {
		a.ld, a.err = m.beginLazyDump(ctx)
		close(a.done)
	}()
	return a
}

// take waits for the dump readied.
func (a *aheadDump) take() (*lazyDump, error) {
	<-a.done
	return a.ld, a.err
}

// drop ends a dump readied and never taken: it touched nothing.
func (a *aheadDump) drop() {
	if ld, err := a.take(); err == nil {
		ld.stop()
	}
}

// dumpWithFinalRound freezes the container, has CRIU dump it without its
// memory (--lazy-pages) and, at the same time, reads the frozen memory and
// sends what changed since the last round as one more round. After it the
// destination holds every page the container has, as it is now, save those
// the rounds never found (CRIU's page server on this host still has them).
func (m *migration) dumpWithFinalRound(ctx context.Context, rs *precopySource, ahead *aheadDump) (*lazyDump, error) {
	ld, err := ahead.take()
	if err != nil {
		return nil, err
	}
	if err := m.freeze(ctx); err != nil {
		ld.stop()
		return nil, err
	}
	m.begin(phaseDump)
	var g errgroup.Group
	g.Go(ld.run)
	rs.frozen = true
	g.Go(func() error {
		prev := rs.last
		// The trackers stay open until the migration ends (rs.close):
		// closing one rewrites the page tables with the memory map
		// locked, which CRIU's dump beside this would wait for.
		// Not acknowledged before the images and the restore request go:
		// the destination restores only once it stored it (pendingAcks).
		r, err := m.precopyRound(ctx, rs, rs.next, &prev, false)
		if err != nil {
			return failAt("final round", err)
		}
		r.Final = true
		r.FrozenMs = r.DurationMs
		m.roundDone(r, nil, 0, nil)
		acked, err := rs.finish(true)
		m.acks.expect("final round", acked)
		return failAt("final round", err)
	})
	if err := m.syncRootfsBeside(&g); err != nil {
		ld.stop()
		return nil, err
	}
	return ld, nil
}

// receiveHybrid is hybrid's destination half: the rounds into the store
// the lazy-pages daemon answers from (arriveLazy), noting the last ones'
// pages for the restore to write itself (lastwrites.go).
func receiveHybrid(in *incoming, ctx context.Context, rx receivers) {
	in.store = in.newStore()
	in.lastWrites = &lastWrites{first: 1}
	in.store.Observe(in.lastWrites.put, nil)
	rx.g.Go(func() error { return in.receiveRounds(ctx, rx.sess, rx.router) })
}

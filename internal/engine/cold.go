package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// cold is stop-and-copy: freeze, dump with the pages streaming straight to
// the destination's page server while CRIU writes them, send the remaining
// images, restore. The root filesystem is synced once while the container
// runs, so the frozen pass carries only what changed since.
func (m *migration) cold(ctx context.Context) error {
	if err := m.syncRootfsLive(ctx); err != nil {
		return err
	}
	if err := m.freeze(ctx); err != nil {
		return m.abort(ctx, err)
	}
	m.begin(phaseDump)
	if err := m.dumpStreaming(ctx); err != nil {
		return m.abort(ctx, err)
	}
	return m.switchover(ctx)
}

// coldRebuild is cold for a runtime whose restore copies its images
// (Docker's: into containerd's content store, then out again, 3.4-4.2 s
// for 256 MiB here). Frozen, CRIU dumps without memory while ferry reads
// all of it and sends it as pre-copy's one and final round; the
// destination completes the images beside the dump as it came and, where
// the runtime restores lazily, restores that dump with a lazy-pages
// daemon reading the completed ones (localpull.go): what the runtime
// copies holds no memory. Everything still moves while the container is
// frozen, and the source stays resumable until the commit.
func (m *migration) coldRebuild(ctx context.Context) error {
	if err := m.syncRootfsLive(ctx); err != nil {
		return err
	}
	rs, err := m.startRounds()
	if err != nil {
		return m.abort(ctx, failAt("cold", err))
	}
	defer rs.close()
	return m.finalRoundThen(ctx, rs, m.lazyDumpAhead(ctx), m.rebuildSwitchover)
}

// checkpoint runs the runtime's checkpoint to its end whatever becomes of
// ctx: a killed runtime leaves CRIU running, and CRIU puts back the
// freezer state it found when it ends, freezing again a container resumed
// meanwhile. Cancelling ctx (the agent stopping) closes the page stream
// instead, so that CRIU fails by itself.
func (m *migration) checkpoint(ctx context.Context, pages *transport.Channel, opts runtime.CheckpointOptions) (runtime.Dump, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cancelled before the dump (the agent is stopping, or the request was withdrawn): %w", err)
	}
	stop := context.AfterFunc(ctx, func() { pages.Close() })
	defer stop()
	d, err := m.rt.Checkpoint(context.WithoutCancel(ctx), m.ctr, opts)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("cancelled during the dump (the agent is stopping, or the request was withdrawn): %w", err)
	}
	return d, err
}

// dumpStreaming checkpoints the frozen container with its pages going
// through the session, syncs the root filesystem's last changes alongside,
// then sends the rest of the images.
func (m *migration) dumpStreaming(ctx context.Context) error {
	imgDir := filepath.Join(m.work, "images")
	pages, err := m.sess.Open(ChanPages)
	if err != nil {
		return failAt("dump", err)
	}
	defer pages.Close()
	if err := pages.Send(PageStreamInfo{Round: -1, Parent: m.parentRound}); err != nil {
		return failAt("dump", err)
	}
	addr, tunnelDone, err := pageClientTunnel(ctx, pages, m.pageTransform)
	if err != nil {
		return failAt("dump", err)
	}
	// A failed rootfs sync closes the page stream (see checkpoint), so
	// CRIU fails by itself, and the source resumes only after the dump
	// has ended.
	var g errgroup.Group
	var rootfsErr error
	g.Go(func() error {
		err := m.syncTrees(false)
		if err != nil {
			pages.Close()
		}
		rootfsErr = failAt("rootfs sync (frozen)", err)
		return rootfsErr
	})
	g.Go(func() error {
		opts := runtime.CheckpointOptions{ImagesDir: imgDir, WorkDir: m.work, PageServer: addr,
			TCPEstablished: m.keepsAddress(), TCPClose: m.closesConnections(), NetworkQuiet: m.keepsAddress(), SmapsSnapshot: m.smapsSnapshotDir(),
			IrmapScanPaths: criu.IrmapScanPaths(m.ctr.PID)}
		if m.parentRound >= 0 {
			opts.ParentDir = filepath.Join("..", predumpDir(m.parentRound))
		}
		d, err := m.checkpoint(ctx, pages, opts)
		m.dumped = d
		if err != nil {
			pages.Close() // unblock the tunnel
			return failAt("dump on "+m.host.Name, err)
		}
		return failAt("page transfer", tunnelDone())
	})
	if err := g.Wait(); err != nil {
		if rootfsErr != nil {
			// The cause, whichever ended first: the dump then failed for
			// the page stream the sync's failure closed.
			return rootfsErr
		}
		return err
	}
	// CRIU writes its statistics into the work directory.
	if st, err := criu.ReadDumpStats(m.work); err == nil {
		m.report.MemoryBytes = int64(st.PagesWritten) * pageSize
	}
	m.begin(phaseImages)
	return m.sendImages()
}

const pageSize = 4096

func isLog(name string) bool { return strings.HasSuffix(name, ".log") }

// receiveCold is cold's destination half: CRIU's page server for the
// dump's pages.
func receiveCold(in *incoming, ctx context.Context, rx receivers) {
	rx.g.Go(func() error { return in.receiveFinalPages(ctx, rx.sess, rx.router, nil) })
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/lazyrelay"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/pagestream"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// A post-copy pull that outlives the destination's agent (QEMU's
// postcopy-paused and recover). The daemon's page requests go through a
// relay process (package lazyrelay), so an agent that dies mid-pull leaves
// the pull paused, not broken: the copy's faults wait in the daemon. The
// source, having lost its destination, keeps its page server and asks the
// destination, for resumeWindow, to go on (ChanLazyResume); the restarted
// agent has taken the pull over (AdoptPull) and serves it from the
// relay's socket, and the pull ends as if nothing had happened. If the
// source does not come back in time, the copy is frozen and dropped, and
// the source resumes its own when it asks, as before.

// ChanLazyResume is how a source asks its destination to go on with a
// pull the destination's previous agent left: LazyResume, then
// LazyResumeAnswer; on OK the source opens a ChanLazy channel to its page
// server, and the destination sends LazyDone here when the pull ended.
const ChanLazyResume = "lazy-resume"

// LazyResume asks for migration ID's pull to go on.
type LazyResume struct {
	ID string `json:"id"`
}

// LazyResumeAnswer is the destination's: OK, or the state its journal
// holds (dropped: the source resumes its own copy).
type LazyResumeAnswer struct {
	OK    bool   `json:"ok"`
	State string `json:"state,omitempty"`
}

// resumeWindow is how long a source whose destination vanished mid-pull
// keeps asking it to go on: past the outage timeout (the session's own
// reconnection) and an agent's restart.
func resumeWindow(outage time.Duration) time.Duration { return outage + 30*time.Second }

// StrandedPullWait is how long a restarted destination keeps a pull for
// its source: the source may notice the loss only after its outage
// timeout, then asks for resumeWindow.
func StrandedPullWait(outage time.Duration) time.Duration { return outage + resumeWindow(outage) }

// resumePull is the source's side: the destination was lost (lost) while
// its copy pulled memory. The page server stands between two requests
// (ld.serve's proxy), so the destination, if its agent restarted with the
// pull kept, can go on: it is asked to until resumeWindow passes. done
// is the pull's outcome; dropped says the destination dropped its copy
// (the source resumes its own); an error leaves the outcome in doubt.
func (m *migration) resumePull(ctx context.Context, ld *lazyDump, lost error) (done LazyDone, dropped bool, err error) {
	deadline := time.Now().Add(resumeWindow(m.sess.OutageTimeout()))
	for {
		select {
		case <-ld.exited:
			return done, false, lost // no page server, nothing to go on with
		default:
		}
		done, dropped, err = m.askToResume(ctx, ld)
		if err == nil || dropped {
			if err == nil {
				m.report.Warnings = append(m.report.Warnings, "the destination's agent restarted during the pull, which went on where it stopped")
			}
			return done, dropped, err
		}
		m.log.Info("post-copy: asking the destination to go on with the pull", "migration", m.id, "error", err)
		if time.Now().After(deadline) {
			return done, false, fmt.Errorf("%w; the destination did not come back to go on with the pull within %v (%v)", lost, resumeWindow(m.sess.OutageTimeout()), err)
		}
		select {
		case <-ctx.Done():
			return done, false, lost
		case <-time.After(time.Second):
		}
	}
}

// askToResume opens a new session to the destination and, if it still
// has the pull, serves it there until it ends.
func (m *migration) askToResume(ctx context.Context, ld *lazyDump) (LazyDone, bool, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	sess, err := m.dial(dctx, m.req.To)
	cancel()
	if err != nil {
		return LazyDone{}, false, err
	}
	defer sess.Close()
	return askToResumeOn(ctx, sess, m.id, ld.serve)
}

// askToResumeOn asks the destination on sess to go on with migration
// id's pull and, if it does, serves it (serve answers the lazy channel)
// until it ends. dropped says the destination dropped its copy.
func askToResumeOn(ctx context.Context, sess *transport.Session, id string, serve func(context.Context, *transport.Channel) error) (done LazyDone, dropped bool, err error) {
	ch, err := sess.Open(ChanLazyResume)
	if err != nil {
		return LazyDone{}, false, err
	}
	defer ch.Close()
	if err := ch.Send(LazyResume{ID: id}); err != nil {
		return LazyDone{}, false, err
	}
	var a LazyResumeAnswer
	if err := ch.Recv(&a); err != nil {
		return LazyDone{}, false, err
	}
	if !a.OK {
		return LazyDone{}, a.State == journal.Dropped, fmt.Errorf("the destination has no pull to go on with (its journal: %s)", a.State)
	}
	data, err := sess.Open(ChanLazy)
	if err != nil {
		return LazyDone{}, false, err
	}
	go func() { _ = serve(context.WithoutCancel(ctx), data) }()
	if err := ch.Recv(&done); err != nil {
		data.Close()
		return LazyDone{}, false, err
	}
	return done, done.Error != "", nil
}

// ServeKeptPull is a restarted source agent's side of a pull its earlier
// run served through a page keeper (journal entry e's Pull): it asks the
// destination on sess to go on, and serves the pull from the keeper,
// which holds CRIU's page server, until it ends. dropped says the
// destination dropped its copy (the source resumes its own, EndKeptPull
// first).
func ServeKeptPull(ctx context.Context, sess *transport.Session, e journal.Entry) (done LazyDone, dropped bool, err error) {
	if e.Pull == nil {
		return LazyDone{}, false, errors.New("the journal names no page keeper for this pull")
	}
	return askToResumeOn(ctx, sess, e.ID, func(_ context.Context, ch *transport.Channel) error {
		conn, err := lazyrelay.DialKeeper(e.Pull.Dir)
		if err != nil {
			ch.Fail(err)
			return err
		}
		defer conn.Close()
		closed, err := pagestream.NewLazyProxy(conn).Serve(ch)
		if err != nil && !closed {
			ch.Close()
			return err
		}
		return ch.CloseWrite()
	})
}

// KeptPull says whether journal entry e is a source's pull whose page
// keeper still runs: a restarted agent serves it on (ServeKeptPull).
func KeptPull(e journal.Entry) bool {
	if e.Role != journal.Source || e.Pull == nil || journal.Final(e.State) {
		return false
	}
	_, err := os.Stat(lazyrelay.KeeperSocket(e.Pull.Dir))
	return err == nil
}

// EndKeptPull ends what an earlier run left of a source's pull (e.Pull):
// the page keeper and, with its connection gone, CRIU's dump, which puts
// back the freezer state it found (frozen) as it ends; then their work
// directory goes. The source copy can then be resumed or removed.
func EndKeptPull(e journal.Entry, keepWork bool, log *slog.Logger) error {
	if e.Pull == nil {
		return nil
	}
	if procs.CmdlineHas(e.Pull.Daemon, lazyrelay.KeeperCommand, lazyrelay.KeeperSocket(e.Pull.Dir)) {
		_ = syscall.Kill(e.Pull.Daemon, syscall.SIGKILL)
	}
	if _, forced := criu.KillWorkingIn(e.Pull.Dir); len(forced) > 0 {
		log.Error("a kept pull's CRIU ran its code inside the container's processes and was killed all the same", "migration", e.ID, "pids", forced)
	}
	if keepWork {
		return nil
	}
	return mounts.RemoveAll(e.Pull.Dir)
}

// strandedPull is a pull an earlier run of this agent left.
type strandedPull struct {
	e      journal.Entry
	rt     runtime.Runtime
	daemon *criu.LazyPages
	expiry *time.Timer
	until  time.Time // when it is dropped unless its source came back
	busy   bool      // a source is resuming it
}

// AdoptPull takes over the pull of journal entry e (pulling, with its
// relay) from an earlier run of this agent: the daemon's faults are held
// here at once, and its source has until wait passes to go on with it;
// then the copy is dropped. An error means there is nothing to go on with
// (the daemon or its relay is gone): the caller drops the copy.
func (d *Destination) AdoptPull(e journal.Entry, rt runtime.Runtime, wait time.Duration) error {
	if e.Pull == nil {
		return errors.New("the journal names no relay for this pull")
	}
	daemon, err := criu.AttachLazyPages(e.Pull.Daemon, e.Pull.Dir)
	if err != nil {
		return err
	}
	if _, err := daemon.HoldFaults(); err != nil {
		d.log().Warn("post-copy: a pull taken over is held by its lazy-pages daemon alone", "migration", e.ID, "error", err)
	}
	sp := &strandedPull{e: e, rt: rt, daemon: daemon}
	conn, err := lazyrelay.Dial(e.Pull.Dir)
	if err != nil {
		d.dropPull(sp)
		return fmt.Errorf("the pull's relay is gone: %w", err)
	}
	conn.Close()
	d.waitForSource(sp, wait)
	return nil
}

// waitForSource keeps sp for its source to go on with (ResumePull) until
// wait passes; then the copy is dropped.
func (d *Destination) waitForSource(sp *strandedPull, wait time.Duration) {
	d.pullsMu.Lock()
	defer d.pullsMu.Unlock()
	if d.pulls == nil {
		d.pulls = map[string]*strandedPull{}
	}
	d.pulls[sp.e.ID] = sp
	sp.until = time.Now().Add(wait)
	sp.expiry = time.AfterFunc(wait, func() { d.expire(sp.e.ID) })
	go d.completeAlone(sp)
}

// completeAlone ends a waiting pull whose daemon finishes well by itself:
// every page was in already (a hybrid's few last pages, the source's
// close passed on just before it was lost), so the copy runs whole and
// needs no source. A source that comes back hears it started.
func (d *Destination) completeAlone(sp *strandedPull) {
	if r := sp.daemon.Wait(); r.Err != nil {
		return
	}
	d.pullsMu.Lock()
	if d.pulls[sp.e.ID] != sp || sp.busy {
		d.pullsMu.Unlock()
		return // expired, or a source is resuming it: its end is theirs
	}
	delete(d.pulls, sp.e.ID)
	sp.expiry.Stop()
	d.pullsMu.Unlock()
	sp.daemon.ReleaseFaults()
	d.endPull(sp.e, journal.Started)
	d.log().Info("post-copy: a pull whose source was lost had every page already: the copy runs whole", "migration", sp.e.ID, "container", sp.e.Container)
}

// strand leaves a pull whose source was lost (its agent died, or the link
// stayed down past the outage timeout) to wait for it, as a restarted
// agent leaves one it adopted: the relay keeps the daemon's requests, the
// copy's faults wait, and the source, back, asks to go on (ResumePull)
// within wait, or the copy is dropped. Its error says so.
func (in *incoming) strand(lp *lazyPages, peer string, wait time.Duration) error {
	lp.handedOff, in.stranded = true, true
	if lp.endPush != nil {
		lp.endPush() // no pushed page comes any more
	}
	// This agent's turn at the relay ends: the next source's is ResumePull's.
	lp.conn.Close()
	if !lp.tunnelEnds(5 * time.Second) {
		in.d.log().Warn("post-copy: the tunnel of a pull whose source was lost did not end", "migration", in.offer.ID)
	}
	sp := &strandedPull{e: in.entry(peer, journal.Pulling, lp.pull(in.work)), rt: in.rt, daemon: lp.daemon}
	in.d.waitForSource(sp, wait)
	in.d.log().Warn("post-copy: lost the source mid-pull; the copy's faults wait for it to come back", "migration", in.offer.ID, "container", in.offer.Container, "wait", wait)
	return fmt.Errorf("lost the source during the post-copy pull: the copy's faults wait for it to come back within %v", wait)
}

// expire drops a stranded pull its source did not come back for (one
// being resumed is left to unclaim).
func (d *Destination) expire(id string) {
	d.pullsMu.Lock()
	sp := d.pulls[id]
	if sp == nil || sp.busy {
		d.pullsMu.Unlock()
		return
	}
	delete(d.pulls, id)
	d.pullsMu.Unlock()
	d.log().Warn("post-copy: the source did not come back for a pull this agent took over; the copy is dropped", "migration", id, "container", sp.e.Container)
	d.dropPull(sp)
}

// dropPull freezes a stranded pull's copy while its faults are held (the
// daemon's end would give them zeros), stops the daemon, removes the copy
// and records it dropped: the source resumes its own.
func (d *Destination) dropPull(sp *strandedPull) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := JournaledContainer(sp.e)
	fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
	if err := sp.rt.Freeze(fctx, c); err != nil {
		d.log().Warn("post-copy: a dropped pull's copy could not be frozen first", "migration", sp.e.ID, "error", err)
	}
	fcancel()
	sp.daemon.Stop()
	err := sp.rt.Remove(ctx, c)
	sp.daemon.ReleaseFaults()
	if err != nil && !errors.Is(err, runtime.ErrNotFound) {
		d.log().Error("post-copy: a dropped pull's copy could not be removed", "migration", sp.e.ID, "container", sp.e.Container, "error", err)
		return
	}
	d.endPull(sp.e, journal.Dropped)
}

// endPull records a stranded pull's end and removes its work directory.
func (d *Destination) endPull(e journal.Entry, state string) {
	if d.Journal != nil {
		if err := d.Journal.Set(e.ID, state); err != nil {
			d.log().Error("journal", "migration", e.ID, "error", err)
		}
	}
	d.RemovePullDir(e)
}

// RemovePullDir removes the work directory of a pull that has ended (unless
// the work is kept), which a restarted agent spares while the pull may go
// on.
func (d *Destination) RemovePullDir(e journal.Entry) {
	if e.Pull == nil || d.KeepWork {
		return
	}
	if err := mounts.RemoveAll(e.Pull.Dir); err != nil {
		d.log().Warn("scratch left by an earlier run", "dir", e.Pull.Dir, "error", err)
	}
}

// claim marks a stranded pull as being resumed by peer, its source.
func (d *Destination) claim(id, peer string) *strandedPull {
	d.pullsMu.Lock()
	defer d.pullsMu.Unlock()
	sp := d.pulls[id]
	if sp == nil || sp.busy || sp.e.Peer != peer {
		return nil
	}
	sp.busy = true
	return sp
}

// unclaim puts a pull whose source was lost again back to wait for it,
// or drops it if its time is up.
func (d *Destination) unclaim(sp *strandedPull) {
	d.pullsMu.Lock()
	sp.busy = false
	late := time.Now().After(sp.until)
	d.pullsMu.Unlock()
	if late {
		d.expire(sp.e.ID)
	}
}

// forget ends a stranded pull's wait.
func (d *Destination) forget(sp *strandedPull) {
	d.pullsMu.Lock()
	delete(d.pulls, sp.e.ID)
	sp.expiry.Stop()
	d.pullsMu.Unlock()
}

// ResumePull serves a source's ChanLazyResume (peer is the source's host
// name, as its certificate says).
func (d *Destination) ResumePull(ctx context.Context, sess *transport.Session, router *transport.Router, ch *transport.Channel, peer string) {
	defer ch.Close()
	var req LazyResume
	if err := ch.Recv(&req); err != nil {
		return
	}
	sp := d.claim(req.ID, peer)
	if sp == nil {
		state := "unknown"
		if d.Journal != nil {
			if e, ok, err := d.Journal.Get(req.ID); err == nil && ok && e.Peer == peer {
				state = e.State
			}
		}
		_ = ch.Send(LazyResumeAnswer{State: state})
		return
	}
	router.Expect(ChanLazy)
	if err := ch.Send(LazyResumeAnswer{OK: true}); err != nil {
		d.unclaim(sp)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	data, err := router.Wait(wctx, sess, ChanLazy)
	cancel()
	if err != nil {
		d.unclaim(sp)
		return
	}
	defer data.Close()
	// giveUp drops a pull whose daemon ended with pages missing, and says
	// so: the source resumes its own copy.
	giveUp := func(why string) {
		d.forget(sp)
		d.dropPull(sp)
		_ = ch.Send(LazyDone{Error: why})
	}
	conn, err := lazyrelay.Dial(sp.e.Pull.Dir)
	if err != nil {
		// The relay ends with its daemon.
		giveUp("the pull's relay is gone: " + err.Error())
		return
	}
	start := time.Now()
	hc := newHoldingReads(conn, sp.daemon, d.log())
	st, err := pagestream.ServeLazy(hc, data, func(pagestream.PageKey) ([]byte, pagestream.Hash, bool) { return nil, pagestream.Hash{}, false }) // no page is held here any more
	hc.stop()
	conn.Close()
	switch {
	case st.Closed:
		// Every page is in: the daemon ends by itself.
		exited := make(chan struct{})
		go func() { sp.daemon.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			sp.daemon.Stop()
		}
		sp.daemon.ReleaseFaults()
		d.forget(sp)
		faulted, pushed := criu.LazyCounts(sp.daemon.LogPath())
		d.endPull(sp.e, journal.Started)
		d.log().Info("post-copy: a pull taken over after a restart is complete", "migration", sp.e.ID, "container", sp.e.Container, "pages", st.Pages)
		_ = ch.Send(LazyDone{Ms: units.Millis(time.Since(start)), Faulted: faulted, Pushed: pushed})
	case err != nil:
		// The source's side broke again: it asks again within its window.
		d.unclaim(sp)
	default:
		giveUp("the lazy-pages daemon ended before every page was in")
	}
}

// StrandedPullDirs lists the work directories of the pulls an earlier run
// left that may be taken over (AdoptPull at a destination, ServeKeptPull
// at a source): the scratch cleanup of a restarted agent must spare them
// and the processes working there.
func StrandedPullDirs(entries []journal.Entry) []string {
	var dirs []string
	for _, e := range entries {
		if KeptPull(e) {
			dirs = append(dirs, e.Pull.Dir)
			continue
		}
		if e.Role == journal.Destination && e.State == journal.Pulling && e.Pull != nil {
			if _, err := os.Stat(e.Pull.Dir); err == nil {
				dirs = append(dirs, e.Pull.Dir)
			}
		}
	}
	return dirs
}

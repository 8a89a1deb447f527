package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/lazyrelay"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// What a restarted agent does with the migrations its journal holds, and
// how a source settles one it left in doubt. The invariant: a container
// runs at most once, and somewhere as long as either host holds a
// complete copy.

// resolveRetry is how often a source asks again while its destination
// cannot say what became of a migration.
const resolveRetry = 3 * time.Second

// clearScratch ends the CRIU processes and removes the scratch
// directories of migrations a previous run of this agent left (it was
// killed mid-migration): none is under way yet, and recovery needs none of them (a frozen source copy resumes or
// goes without its images; a restored copy is kept or dropped). Only
// directories named like a migration ID go.
func (a *Agent) clearScratch() {
	root := a.Host.WorkRoot()
	// A pull a relay kept going is taken over (recoverDestination): its
	// daemon and directory stay.
	var spare []string
	if all, err := a.journal.All(); err == nil {
		spare = engine.StrandedPullDirs(all)
	}
	// CRIU processes the dead agent started outlive it, reparented: a
	// dump's page server would refreeze the container recovery resumes.
	// One still inside a container's process (a dump's injected calls)
	// is waited for first.
	pids, forced := criu.KillWorkingIn(root, spare...)
	if len(pids) > 0 {
		a.Log.Warn("killed CRIU processes an earlier run of this agent left", "pids", pids)
	}
	if len(forced) > 0 {
		a.Log.Error("CRIU processes an earlier run left still ran their code inside containers' processes and were killed all the same: those processes may not have survived it", "pids", forced, "waited", criu.InsidePatience)
	}
	a.rescue()
	if a.KeepWork {
		return
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		if e.IsDir() && engine.ValidID(e.Name()) && !slices.Contains(spare, dir) {
			if err := mounts.RemoveAll(dir); err != nil {
				a.Log.Warn("scratch left by an earlier run", "dir", dir, "error", err)
			}
		}
	}
}

// rescue puts back the processes a CRIU that died (killed by someone,
// crashed) left with its code in them (criu.Rescue); one frozen is put
// back once thawed, by a later call.
func (a *Agent) rescue() {
	// Made again if someone removed it: without it CRIU keeps no records.
	if err := os.MkdirAll(a.Host.RescueDir(), 0o700); err != nil {
		a.Log.Warn("CRIU's rescue directory", "error", err)
	}
	rescued, err := criu.RescueWithin(a.Host.RescueDir(), time.Second)
	if len(rescued) > 0 {
		a.Log.Warn("processes a dead CRIU left with its code in them were put back", "pids", rescued)
	}
	// A record that cannot be put back fails the same way every few
	// seconds: said once, and again only when what fails changes.
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if last, _ := a.rescueErr.Swap(msg).(string); msg != "" && msg != last {
		a.Log.Error("processes a dead CRIU left could not all be put back", "error", err)
	}
}

// watchRescues puts back, every few seconds until ctx ends, what a CRIU
// that died outside any migration's watch left (an operator's kill, the
// OOM killer): a migration that failed does so itself before it resumes
// its container.
func (a *Agent) watchRescues(ctx context.Context) {
	t := time.NewTicker(rescueEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.rescue()
		}
	}
}

// rescueEvery is how often watchRescues looks.
const rescueEvery = 2 * time.Second

// recoverDestination settles every copy a previous run of this agent
// restored and never committed, removes the containers it prepared for
// migrations that never reached their restore, and starts those committed
// but maybe not started. A copy restored stopped (every runtime here) never ran: it is
// removed, and its source resumes its own. A copy whose runtime let it
// run at once (Caps.RestoreStopped false) and that still runs has run on
// since, its clients saw it change: dropping it would take them back in
// time, and its source, which never resumes without this host's word, is
// frozen; so it is kept and committed, and the source removes its own
// when it asks. A copy that no
// longer runs is removed. This runs before the agent answers anyone.
func (a *Agent) recoverDestination(ctx context.Context) {
	all, err := a.journal.All()
	if err != nil {
		a.Log.Error("journal unreadable: restored copies of earlier migrations are not checked", "error", err)
		return
	}
	for _, e := range all {
		if e.Role != journal.Destination || (e.State != journal.Prepared && e.State != journal.Restoring && e.State != journal.Committed && e.State != journal.Pulling) {
			continue
		}
		rt, c, err := a.journaled(e)
		if err != nil {
			a.Log.Error("a copy from before a restart cannot be checked", "migration", e.ID, "container", e.Container, "error", err)
			continue
		}
		if e.State == journal.Committed {
			if err := a.startCommitted(ctx, rt, c, e); err != nil {
				a.Log.Error("a committed copy could not be started", "migration", e.ID, "container", e.Container, "error", err)
				continue
			}
			if err := a.journal.Set(e.ID, journal.Started); err != nil {
				a.Log.Error("journal", "migration", e.ID, "error", err)
			}
			continue
		}
		if e.State == journal.Prepared {
			// Made for a migration that never reached its restore: its
			// source resumed when the session broke.
			if err := a.drop(ctx, rt, c, e); err == nil {
				a.Log.Info("removed a container prepared for a migration that ended with the restart", "migration", e.ID, "container", e.Container)
			}
			continue
		}
		if e.State == journal.Pulling && e.Pull != nil && e.Pull.Local {
			// Pre-copy's copy, its memory arriving from its own images: the
			// daemon needs no agent, only to finish.
			if err := a.dst.AdoptLocalPull(e, rt); err != nil {
				a.Log.Error("a committed copy's local pull could not be taken over", "migration", e.ID, "container", e.Container, "error", err)
			}
			if err := a.startCommitted(ctx, rt, c, e); err != nil {
				a.Log.Error("a committed copy could not be started", "migration", e.ID, "container", e.Container, "error", err)
			}
			continue
		}
		if e.State == journal.Pulling && e.Pull != nil && lazyrelay.Completed(e.Pull.Dir) {
			// The pull ended whole (the daemon's close was answered) as this
			// agent died, before it recorded so: the copy is complete and
			// committed. Its source, in doubt, hears it runs.
			if err := a.startCommitted(ctx, rt, c, e); err != nil {
				a.Log.Error("a committed copy whose pull had ended could not be started", "migration", e.ID, "container", e.Container, "error", err)
				continue
			}
			if err := a.journal.Set(e.ID, journal.Started); err != nil {
				a.Log.Error("journal", "migration", e.ID, "error", err)
			}
			a.dst.RemovePullDir(e)
			a.Log.Info("a post-copy pull had ended whole before the restart; the copy runs", "migration", e.ID, "container", e.Container)
			continue
		}
		if e.State == journal.Pulling {
			// Its memory came through this agent, which died. With a relay
			// the pull is only paused: its source, which has not lost its
			// page server, may come back to go on with it.
			why := errors.New("no relay kept it going")
			if e.Pull != nil {
				why = a.dst.AdoptPull(e, rt, engine.StrandedPullWait(a.transportConfig().OutageTimeout))
			}
			if why == nil {
				// It runs, its faults held until the source is back.
				if err := a.startCommitted(ctx, rt, c, e); err != nil {
					a.Log.Error("a committed copy whose pull was taken over could not be started", "migration", e.ID, "container", e.Container, "error", err)
				}
				a.Log.Info("took over a post-copy pull an earlier run left; its source may go on with it", "migration", e.ID, "container", e.Container)
				continue
			}
			// The copy must not run on pages that are not the source's. It
			// goes; its source resumes its own, complete as it was at the
			// freeze.
			if err := a.drop(ctx, rt, c, e); err == nil {
				a.Log.Warn("dropped a post-copy copy whose memory was still arriving when this agent stopped; its source resumes its own, as it was at the freeze", "migration", e.ID, "container", e.Container, "why", why)
			}
			a.dst.RemovePullDir(e) // clearScratch spared it for the pull
			continue
		}
		// A copy restored stopped never ran: it goes.
		if st, serr := runtime.State(ctx, rt, e.Container); serr == nil && st == "running" && !rt.Caps().RestoreStopped {
			if err := a.journal.Set(e.ID, journal.Committed); err != nil {
				a.Log.Error("journal", "migration", e.ID, "error", err)
				continue
			}
			a.keepNetwork(e)
			a.Log.Info("kept a restored copy that ran on across a restart; its source removes its own", "migration", e.ID, "container", e.Container)
			continue
		}
		if err := a.drop(ctx, rt, c, e); err == nil {
			a.Log.Info("dropped an uncommitted copy restored before a restart", "migration", e.ID, "container", e.Container)
		}
	}
}

// startCommitted starts a committed copy: the restart may have come
// between the commit and its start (a copy that runs already is not
// affected). Its network is readied first (keepNetwork).
func (a *Agent) startCommitted(ctx context.Context, rt runtime.Runtime, c *runtime.Container, e journal.Entry) error {
	a.keepNetwork(e)
	if cont, ok := rt.(runtime.Continuer); ok {
		return cont.Continue(ctx, c)
	}
	return nil
}

// keepNetwork readies the network of a copy this host keeps after a
// restart: its agent may have died holding the copy's packets, and a hold
// nobody reads drops them all (engine.TakeOverNetwork).
func (a *Agent) keepNetwork(e journal.Entry) {
	if err := engine.TakeOverNetwork(e.NetNS); err != nil {
		a.Log.Error("the network of a copy kept after a restart could not be readied: it may not be reachable", "migration", e.ID, "container", e.Container, "netns", e.NetNS, "error", err)
	}
}

// drop removes a restored copy, and the network namespace rebuilt for it
// (which may hold the container's address, taken at the freeze, behind a
// hold nobody reads any more), and records it gone.
func (a *Agent) drop(ctx context.Context, rt runtime.Runtime, c *runtime.Container, e journal.Entry) error {
	if err := engine.SilenceNetwork(e.NetNS); err != nil {
		a.Log.Warn("the network of a copy about to be dropped could not be silenced", "migration", e.ID, "container", e.Container, "netns", e.NetNS, "error", err)
	}
	if err := rt.Remove(ctx, c); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		a.Log.Error("a copy from before a restart could not be dropped", "migration", e.ID, "container", e.Container, "error", err)
		return err
	}
	if err := engine.DropNetwork(e.NetNS); err != nil {
		a.Log.Error("the network namespace of a dropped copy could not be deleted", "migration", e.ID, "container", e.Container, "netns", e.NetNS, "error", err)
		return err
	}
	if err := a.journal.Set(e.ID, journal.Dropped); err != nil {
		a.Log.Error("journal", "migration", e.ID, "error", err)
		return err
	}
	return nil
}

// resolveSources settles, in the background, every migration this host
// left frozen as a source (before a restart, or in doubt).
func (a *Agent) resolveSources(ctx context.Context) {
	pend, err := a.journal.Pending()
	if err != nil {
		a.Log.Error("journal unreadable: frozen source copies of earlier migrations are not checked", "error", err)
		return
	}
	for _, e := range pend {
		switch {
		case e.Role == journal.Source && e.State == journal.Copying:
			a.resumeCopying(ctx, e)
		case e.Role == journal.Source:
			go a.resolveSource(ctx, e.ID)
		}
	}
}

// resumeCopying ends a migration whose agent died during pre-copy's
// rounds, before any freeze: the container ran on here, and only the CPU
// throttle auto-converge set is left to put back.
func (a *Agent) resumeCopying(ctx context.Context, e journal.Entry) {
	rt, _, err := a.journaled(e)
	if err == nil && e.Throttled {
		err = engine.LiftThrottle(ctx, rt, e.Container)
	}
	if err != nil && !errors.Is(err, runtime.ErrNotFound) {
		a.Log.Error("the CPU throttle of a migration that ended with the agent could not be lifted", "migration", e.ID, "container", e.Container, "error", err)
		return
	}
	if err := a.journal.Set(e.ID, journal.Resumed); err != nil {
		a.Log.Error("journal", "migration", e.ID, "error", err)
		return
	}
	a.Log.Info("lifted the CPU throttle of a pre-copy that ended with the agent", "migration", e.ID, "container", e.Container)
}

// resolveSource asks the destination what became of its copy of a
// migration, until it can say, then removes the source copy (the
// destination committed) or resumes it (the destination has none).
func (a *Agent) resolveSource(ctx context.Context, id string) {
	for {
		done, err := a.resolveOnce(ctx, id)
		if done {
			return
		}
		if err != nil {
			a.Log.Info("a frozen source copy waits for its destination", "migration", id, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(resolveRetry):
		}
	}
}

// resolveOnce asks the destination once and settles what it can; done
// says nothing is left to do (the journal's state is final).
func (a *Agent) resolveOnce(ctx context.Context, id string) (done bool, err error) {
	a.settling.Lock() // the background retries and ferry resolve
	defer a.settling.Unlock()
	e, ok, err := a.journal.Get(id)
	if err != nil {
		return false, err
	}
	if !ok || e.Role != journal.Source {
		return true, fmt.Errorf("no migration %s left this host", id)
	}
	if journal.Final(e.State) {
		return true, nil
	}
	state, err := a.ask(ctx, e.Peer, id)
	if err != nil {
		return false, fmt.Errorf("the destination %s cannot say what became of its copy: %w", e.Peer, err)
	}
	if state == journal.Pulling && engine.KeptPull(e) {
		// An earlier run served this pull; its page keeper holds CRIU's
		// page server still, and the destination's copy waits for it.
		if state, err = a.serveKeptPull(ctx, e); err != nil {
			return false, err
		}
	}
	final, err := a.settle(ctx, e, state)
	if final == "" {
		if err == nil {
			err = fmt.Errorf("the destination %s is still deciding (its copy: %s)", e.Peer, state)
		}
		return false, err
	}
	a.recordSettled(e, final, err)
	return true, nil
}

// recordSettled writes a settled outcome where operators look: the
// journal (settle did), the migration's report (ferry ps --all, ferry
// wait) and the metrics.
func (a *Agent) recordSettled(e journal.Entry, final string, why error) {
	note := settledNotes[final]
	if why != nil {
		note += ": " + why.Error()
	}
	e.State = final
	if err := a.jobs.settle(e, note); err != nil {
		a.Log.Warn("the settled migration's report could not be updated", "migration", e.ID, "error", err)
	}
	a.metrics.settled(e.Runtime, final)
}

// settledNotes say, in the report, how a migration left in doubt ended.
var settledNotes = map[string]string{
	journal.Removed:  "settled later: the destination had committed and runs the container; the frozen source copy was removed",
	journal.Resumed:  "settled later: the destination had no copy; the source copy was resumed",
	journal.Lost:     "settled later: the destination had no copy and the source copy was gone (its processes died, or it was removed by hand): the container runs nowhere",
	journal.Diverged: "settled later: the destination had committed, but the source copy had been resumed by hand meanwhile: both hosts ran the container, and neither copy was removed",
}

// serveKeptPull serves the destination the rest of a pull an earlier run
// of this agent served, from the page keeper that outlived it, and
// returns the destination's state once the pull ended.
func (a *Agent) serveKeptPull(ctx context.Context, e journal.Entry) (string, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	sess, err := a.dialPeer(dctx, e.Peer)
	cancel()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	done, dropped, err := engine.ServeKeptPull(ctx, sess, e)
	switch {
	case dropped:
		a.Log.Warn("the destination dropped the copy whose pull this agent went on with", "migration", e.ID, "error", done.Error)
		return journal.Dropped, nil
	case err != nil:
		return "", fmt.Errorf("going on with the pull an earlier run served: %w", err)
	}
	a.Log.Info("the pull an earlier run served went on to its end", "migration", e.ID, "container", e.Container, "faulted", done.Faulted)
	return journal.Committed, nil
}

// settle acts on the destination's answer. It returns the final state it
// recorded, "" while the destination is still deciding.
func (a *Agent) settle(ctx context.Context, e journal.Entry, state string) (final string, err error) {
	rt, c, err := a.journaled(e)
	if err != nil {
		return "", err
	}
	if state == journal.Committed || state == journal.Dropped || state == "unknown" {
		// What is left of a pull this host served (its page keeper,
		// CRIU's dump) lets go of the copy before it is resumed or removed.
		if err := engine.EndKeptPull(e, a.KeepWork, a.Log); err != nil {
			a.Log.Warn("what a served pull left stays", "migration", e.ID, "error", err)
		}
	}
	st, serr := runtime.State(ctx, rt, e.Container)
	switch state {
	case journal.Committed:
		if serr == nil && st == "running" {
			// Someone resumed the frozen copy by hand: it took writes the
			// destination's copy never saw. Removing it would lose them, and
			// which copy is right is for a person to say.
			a.Log.Error("the destination committed, but the source copy runs (resumed by hand while in doubt): the container ran on both hosts; neither copy is removed", "migration", e.ID, "container", e.Container, "destination", e.Peer)
			return a.final(e, journal.Diverged)
		}
		if err := rt.Remove(ctx, c); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			return "", err
		}
		if err := engine.DropNetwork(e.NetNS); err != nil {
			a.Log.Warn("the removed source copy's network namespace stays", "migration", e.ID, "netns", e.NetNS, "error", err)
		}
		a.Log.Info("the destination owns the container: source copy removed", "migration", e.ID, "container", e.Container)
		return a.final(e, journal.Removed)
	case journal.Dropped, "unknown":
		if errors.Is(serr, runtime.ErrNotFound) {
			a.Log.Error("the destination has no copy, and the source copy is gone (removed by hand?): the container runs nowhere", "migration", e.ID, "container", e.Container, "runtime", e.Runtime)
			return a.final(e, journal.Lost)
		}
		if rt.Caps().Freeze {
			_ = rt.Thaw(ctx, c) // a container the freeze never reached runs already
		}
		st, err := runtime.State(ctx, rt, e.Container)
		if err != nil {
			return "", err
		}
		if st == "stopped" {
			// Its processes died (a CRIU killed while its code ran inside
			// them), and the destination has no copy: nothing to resume.
			a.Log.Error("the source copy's processes died, and the destination has no copy: the container runs nowhere; start it again with its runtime", "migration", e.ID, "container", e.Container, "runtime", e.Runtime)
			return a.final(e, journal.Lost)
		}
		if st != "running" {
			return "", fmt.Errorf("thawed, yet the runtime says %s", st)
		}
		// The migration silenced the copy's network before the freeze
		// ended in doubt: it answers again, and claims its address back
		// from the destination that took it.
		if e.Throttled {
			if err := engine.LiftThrottle(ctx, rt, e.Container); err != nil {
				a.Log.Error("the resumed source copy keeps auto-converge's CPU throttle", "migration", e.ID, "container", e.Container, "error", err)
			}
		}
		if err := engine.WakeNetwork(e.NetNS); err != nil {
			a.Log.Error("the resumed source copy's network could not be turned back on", "migration", e.ID, "container", e.Container, "netns", e.NetNS, "error", err)
		}
		if err := engine.WakeLinks(e.Links, e.LinkBridges); err != nil {
			a.Log.Error("the resumed source copy's links could not be brought back up", "migration", e.ID, "container", e.Container, "netns", e.Links, "error", err)
		}
		a.Log.Info("the destination has no copy: source copy resumed", "migration", e.ID, "container", e.Container)
		return a.final(e, journal.Resumed)
	}
	return "", nil // the destination is still deciding (restoring)
}

// final records a settled migration's final state.
func (a *Agent) final(e journal.Entry, state string) (string, error) {
	if err := a.journal.Set(e.ID, state); err != nil {
		return "", err
	}
	return state, nil
}

// journaled finds the runtime and container a journal entry names.
func (a *Agent) journaled(e journal.Entry) (runtime.Runtime, *runtime.Container, error) {
	set, err := a.runtimes(e.RuntimeOptions())
	if err != nil {
		return nil, nil, err
	}
	rt, err := set.Get(e.Runtime)
	if err != nil {
		return nil, nil, err
	}
	return rt, engine.JournaledContainer(e), nil
}

// ask opens a session to the destination and asks about one migration.
func (a *Agent) ask(ctx context.Context, addr, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sess, err := a.dialPeer(ctx, addr)
	if err != nil {
		return "", err
	}
	defer sess.Close()
	ch, err := sess.Open(engine.ChanQuery)
	if err != nil {
		return "", err
	}
	defer ch.Close()
	if err := ch.Send(engine.Query{ID: id}); err != nil {
		return "", err
	}
	var ans engine.QueryAnswer
	if err := ch.Recv(&ans); err != nil {
		return "", err
	}
	return ans.State, nil
}

// resolve settles a migration left in doubt now, for ferry resolve: it
// asks the destination once and does what its answer calls for; a
// destination that cannot answer leaves the copy frozen, and says why.
func (a *Agent) resolve(ctx context.Context, id string) (engine.Resolution, error) {
	if !engine.ValidID(id) {
		return engine.Resolution{}, fmt.Errorf("bad migration ID %q", id)
	}
	_, err := a.resolveOnce(ctx, id)
	e, ok, jerr := a.journal.Get(id)
	if jerr != nil {
		return engine.Resolution{}, jerr
	}
	if !ok || e.Role != journal.Source {
		return engine.Resolution{}, fmt.Errorf("no migration %s left this host (ferry ps --all lists those that did)", id)
	}
	r := engine.Resolution{ID: id, Container: e.Container, State: e.State, Settled: journal.Final(e.State), Note: settledNotes[e.State]}
	if err != nil && !r.Settled {
		r.Note = err.Error() + "; the source copy stays frozen, and this agent keeps asking"
	}
	return r, nil
}

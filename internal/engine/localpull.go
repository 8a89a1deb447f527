package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/units"
)

// A restore from the destination's own images: pre-copy's rebuild, and
// cold's (coldRebuild). Once the images are completed from the pages the
// rounds brought, every page is on this host. A plain restore writes all of that memory into the new process
// while the container is frozen (260 ms for 256 MiB here, a second for 1
// GiB). Restored lazily instead, the process is mapped without its
// memory, and a lazy-pages daemon reading these images copies it in
// after the copy already runs, serving its faults first: the downtime no
// longer grows with memory. The price is that daemon. It must be let
// finish (the journal names it, so that a restarted agent spares it);
// while it runs this agent holds the copy's faults, so that a daemon that
// dies leaves them waiting, not filled with zeros; and the source keeps
// its frozen copy until the pull ended, so that such a death costs the
// container only the time since the freeze, as in hybrid.

// restoresFromOwnImages says this migration's restore is such a lazy one:
// a rebuild switchover (pre-copy's, cold's), on a runtime that restores
// lazily.
func (in *incoming) restoresFromOwnImages() bool {
	return in.tech.rebuild && in.rt.Caps().LazyRestore
}

// lazyImages is where the images are completed for the daemon; the
// restore reads the dump as it came, which holds no lazy page: a runtime
// whose restore copies its images (Docker's, twice) copies only those.
func (in *incoming) lazyImages() string { return filepath.Join(in.work, "lazy-images") }

// startLocalPull starts the daemon for the completed images and waits
// until a restore can connect to it.
func (in *incoming) startLocalPull() (*criu.LazyPages, error) {
	daemon, err := criu.StartLocalLazyPages(in.lazyImages(), in.work)
	if err != nil {
		return nil, err
	}
	if err := daemon.Listening(); err != nil {
		daemon.Stop()
		return nil, err
	}
	return daemon, nil
}

// holdLocalFaults takes this agent's copies of the daemon's userfaultfds
// once the restore handed it every one.
func holdLocalFaults(daemon *criu.LazyPages, log *slog.Logger) {
	if _, err := daemon.HoldFaults(); err != nil {
		log.Warn("pre-copy: some of the restored copy's faults are held by the lazy-pages daemon alone", "error", err)
	}
}

// finishLocalPull waits until the daemon has copied every page in (the
// copy runs meanwhile; the source keeps its frozen one until it hears how
// this ended). A daemon that fails leaves pages missing: the copy is
// frozen while its faults are still held, and dropped, and the source
// resumes its own, as in hybrid.
func (in *incoming) finishLocalPull(ctx context.Context, daemon *criu.LazyPages) LazyDone {
	r := daemon.Wait()
	done := LazyDone{Ms: units.Millis(r.Elapsed), Faulted: r.Faulted, Local: r.Faulted + r.Pushed}
	if r.Err == nil {
		daemon.ReleaseFaults()
		in.recordFinal(in.peer, journal.Started)
		return done
	}
	done.Error = fmt.Sprintf("the copy's memory did not all arrive from its own images: %v", r.Err)
	c := &runtime.Container{Runtime: in.rt.Kind(), Name: in.offer.Container, ID: in.offer.Container}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := in.rt.Freeze(fctx, c); err != nil {
		in.d.log().Warn("pre-copy: a copy whose pull failed could not be frozen first", "migration", in.offer.ID, "error", err)
	}
	cancel()
	if err := in.target.Discard(ctx); err != nil {
		done.Error += fmt.Sprintf(", and the copy could not be discarded: %v", err)
		return done
	}
	daemon.ReleaseFaults()
	in.recordFinal(in.peer, journal.Dropped)
	return done
}

// AdoptLocalPull lets a local pull an earlier run of this agent started
// finish: its daemon needs nothing from anyone, only to be spared. Once it
// has exited the copy is recorded started and the images go; a daemon
// whose log says it failed leaves pages missing, and the copy is frozen
// and dropped (its source, which keeps its frozen copy until it hears the
// end, resumes its own).
func (d *Destination) AdoptLocalPull(e journal.Entry, rt runtime.Runtime) error {
	if e.Pull == nil || !e.Pull.Local {
		return errors.New("the journal names no local pull")
	}
	daemon, err := criu.AttachLazyPages(e.Pull.Daemon, e.Pull.Dir)
	if err == nil {
		holdLocalFaults(daemon, d.log())
	}
	go func() {
		if daemon != nil {
			daemon.Wait()
		}
		state := journal.Started
		if done, why := criu.LazyPagesFinished(e.Pull.Dir); !done {
			if why == "" {
				why = "it ended before every page was in"
			}
			state = journal.Dropped
			c := JournaledContainer(e)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
			_ = rt.Freeze(fctx, c)
			fcancel()
			if err := rt.Remove(ctx, c); err != nil && !errors.Is(err, runtime.ErrNotFound) {
				cancel()
				d.log().Error("pre-copy: a copy whose pull failed could not be dropped; it stays frozen", "migration", e.ID, "container", e.Container, "error", err)
				return // its faults stay held
			}
			cancel()
			d.log().Warn("pre-copy: dropped a copy whose memory did not all arrive from its own images; its source resumes its own", "migration", e.ID, "container", e.Container, "why", why)
		}
		if daemon != nil {
			daemon.ReleaseFaults()
		}
		d.endPull(e, state)
	}()
	return nil
}

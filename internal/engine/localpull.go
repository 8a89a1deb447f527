package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/zeebo/xxh3"

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

// rebuildArrival is the restore of the techniques that complete a
// memory-less dump's images (receiveRebuild): plain, or from this host's
// images where the runtime restores lazily.
type rebuildArrival struct{ in *incoming }

func arriveRebuild(in *incoming, _ context.Context, _ receivers, _ <-chan error) arrival {
	return rebuildArrival{in}
}

func (rebuildArrival) abandon() {}

// ready completes the images, and starts the daemon that will read them
// where the restore leaves the memory to it.
func (a rebuildArrival) ready(ctx context.Context, rx receivers) (readied, error) {
	in := a.in
	var r readied
	var err error
	if r.filled, err = in.fillImages(ctx, rx.sess, rx.router); err != nil {
		return readied{}, fmt.Errorf("completing the images on %s: %w", in.d.Host.Name, err)
	}
	if !in.restoresFromOwnImages() {
		return r, nil
	}
	daemon, err := in.startLocalPull()
	if err != nil {
		return readied{}, fmt.Errorf("restoring from the images on %s: %w", in.d.Host.Name, err)
	}
	r.pull, r.fromOwnImages = &localPull{in: in, daemon: daemon}, true
	return r, nil
}

// localPull is a restore's pull from this host's images (pulling).
type localPull struct {
	in     *incoming
	daemon *criu.LazyPages
}

func (p *localPull) restored() { holdLocalFaults(p.daemon, p.in.d.log()) }

func (p *localPull) journal() (string, *journal.Pull) {
	return journal.Pulling, &journal.Pull{Daemon: p.daemon.Pid(), Dir: p.in.work, Local: true}
}

func (p *localPull) end(committed bool) {
	if !committed {
		p.daemon.Stop()
		p.daemon.ReleaseFaults()
	}
}

// unheard: the source may not hear the commit, but the copy runs: all of
// its memory must arrive before anything here goes (the source, in
// doubt, asks the journal later).
func (p *localPull) unheard(ctx context.Context, _ *transport.Session, err error) (bool, error) {
	done := p.in.finishLocalPull(context.WithoutCancel(ctx), p.daemon)
	return done.Error == "", err
}

// finish: the copy runs; its memory goes on arriving from the images
// here, and the source keeps its frozen copy until it hears the end.
func (p *localPull) finish(ctx context.Context, _ *transport.Session, ctl *transport.Channel) (bool, error) {
	in := p.in
	in.faults.At(fault.Destination, fault.LazyPages)
	done := in.finishLocalPull(context.WithoutCancel(ctx), p.daemon)
	err := ctl.Send(done)
	in.faults.At(fault.Destination, fault.Cleanup)
	return done.Error == "", err
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

// filled is what completing a lazy dump's images took.
type filled struct {
	images.FillStats
	ms float64
}

// fillImages completes the source's memory-less dump with the pages the
// rounds brought, asking the source's CRIU page server for any they lack,
// then closes that page server so the source's dump ends. The close is not
// waited for: nothing here depends on it, and stock CRIU's reply sits in a
// corked socket for 200 ms (ferry's CRIU, patch 0008, sends it at once).
func (in *incoming) fillImages(ctx context.Context, sess *transport.Session, router *transport.Router) (filled, error) {
	start := time.Now()
	ch, err := router.Wait(ctx, sess, ChanLazy)
	if err != nil {
		return filled{}, err
	}
	client := pagestream.NewLazyClient(ch)
	if in.faults.Knob(fault.ForgetPages) {
		in.forgetPages() // tests: make the source's page server answer
	}
	src := images.PageSource{
		Local: func(pid uint32, addr uint64, dst []byte) bool {
			_, ok := in.store.ReadInto(pages.Key{PID: pid, Addr: addr}, dst)
			return ok
		},
		Fetch: client.Get,
	}
	dir, fill := in.images, images.FillLazy
	if in.restoresFromOwnImages() {
		// The restore reads the dump as it came, the daemon the completed
		// images beside it.
		dir, fill = in.lazyImages(), images.FillForLazyRestore
		if err := images.LinkDir(in.images, dir); err != nil {
			ch.Close()
			return filled{}, err
		}
	}
	if in.parent != nil && in.parent.Usable() {
		rel, err := filepath.Rel(dir, in.parent.Dir())
		if err == nil {
			err = os.Symlink(rel, filepath.Join(dir, "parent"))
		}
		if err == nil {
			src.ParentRun = in.parent.HeldRun
		}
	}
	st, err := fill(dir, src)
	if err != nil {
		ch.Close()
		return filled{}, err
	}
	go func() {
		defer ch.Close()
		if client.Close() == nil {
			_ = ch.CloseWrite()
		}
	}()
	return filled{st, units.Millis(time.Since(start))}, nil
}

// forgetPages drops every 16th page the rounds brought (from the store and
// the parent image): the switchover must fetch those from the source's
// CRIU page server. A test fault, to exercise that path.
func (in *incoming) forgetPages() {
	var drop []pages.Key
	i := 0
	in.store.Range(func(k pages.Key, _ xxh3.Uint128) bool {
		if i%16 == 0 {
			drop = append(drop, k)
		}
		i++
		return true
	})
	for _, k := range drop {
		in.store.Delete(k) // the observer forgets it in the parent image too
	}
}

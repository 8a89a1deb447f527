package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/images"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/memwarm"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// CommitWindow is the shortest time a destination keeps a restored,
// uncommitted container waiting for the source's commit before it drops
// it; commitWindow lengthens it to outlast the outage timeout.
const CommitWindow = 10 * time.Second

// commitWindow is the destination's commit window: past the outage
// timeout, so that a cut the session survives cannot drop the copy while
// the commit is on its way.
func commitWindow(outage time.Duration) time.Duration {
	return max(CommitWindow, outage+5*time.Second)
}

// Destination receives migrations into this host.
type Destination struct {
	Host host.Config
	// Log is where the destination's migrations log (nil: slog's default).
	Log *slog.Logger
	// Runtimes are the container runtimes on this host, by kind; an
	// incoming container is restored into the one its source named.
	Runtimes runtime.Set
	// CRIUVersion is what this host's CRIU reports; CRIUError, when set,
	// says why CRIU cannot restore here, and every offer is refused with it.
	CRIUVersion string
	CRIUError   error
	// CRIU is this host's CRIU as the agent found it, told to sources and
	// checked against each technique (criucheck.go); nil: not checked.
	CRIU *CRIUCaps
	// AllowFaults lets a request inject failures, for tests.
	AllowFaults bool
	// KeepWork keeps each migration's images and CRIU logs, for debugging.
	KeepWork bool
	// NoPrewarm skips warming memory before a restore (see prewarm.go).
	NoPrewarm bool
	// SegmentBridge is this host's bridge to the L2 segment containers with
	// addresses of their own live on ("" : such containers are refused).
	SegmentBridge string
	// Journal records each restored copy's state before acting on it
	// (nil: none, tests only).
	Journal *journal.Journal
	// Admission bounds what an offer may ask this host to prepare (the
	// runtimes check the container's own configuration).
	Admission admission.Policy
	// StallTimeout gives up a migration whose source sent nothing for
	// this long before asking for the restore (0: stallTimeout's rule).
	StallTimeout time.Duration
	// Room, when set, is this host's reservations (package reserve): an
	// offer takes the one made under its ID, or must fit beside them.
	Room Room
	// RelayExe is the ferry binary, which runs each post-copy pull's
	// relay so that the pull outlives this agent (resume.go); "": none,
	// and a pull ends with the agent.
	RelayExe string

	// pushWait, when set, is how long every background request waits for
	// post-copy's push (tests, on machines too loaded for pushWait).
	pushWait time.Duration

	// pulls are the post-copy pulls an earlier run of this agent left,
	// waiting for their sources to go on with them (resume.go).
	pullsMu sync.Mutex
	pulls   map[string]*strandedPull

	// arriving holds the container names (and migration IDs) of the
	// offers being received here, and the memory they announced: a second
	// offer for either is refused before it touches anything the first one
	// made, and the memory admission bounds is that of every offer at once.
	arrivingMu sync.Mutex
	arriving   map[string]string
	arrivingB  int64
}

// reserveArrival reserves a container name, a migration ID and the memory
// an offer announced for one incoming migration until the returned
// release; a name or ID already arriving is refused, and so is memory
// beyond what admission allows all arriving offers together.
func (d *Destination) reserveArrival(name, id string, memory int64) (release func(), err error) {
	d.arrivingMu.Lock()
	defer d.arrivingMu.Unlock()
	if d.arriving == nil {
		d.arriving = map[string]string{}
	}
	if other, ok := d.arriving["name/"+name]; ok {
		return nil, fmt.Errorf("%s is already receiving a container named %q (migration %s): one at a time", d.Host.Name, name, other)
	}
	if _, ok := d.arriving["id/"+id]; ok {
		return nil, fmt.Errorf("%s is already receiving migration %s", d.Host.Name, id)
	}
	if limit := d.Admission.MaxMemoryBytes; limit > 0 && d.arrivingB+memory > limit {
		return nil, &admission.Refused{Reasons: []string{fmt.Sprintf("announced memory %d bytes, with the %d bytes of the migrations arriving already, exceeds %d", memory, d.arrivingB, limit)}}
	}
	d.arriving["name/"+name], d.arriving["id/"+id] = id, id
	d.arrivingB += memory
	return func() {
		d.arrivingMu.Lock()
		defer d.arrivingMu.Unlock()
		delete(d.arriving, "name/"+name)
		delete(d.arriving, "id/"+id)
		d.arrivingB -= memory
	}, nil
}

// record writes this migration's state to the journal; peer is the
// source's host name as its certificate says.
func (in *incoming) record(peer, state string) error {
	return in.recordPull(peer, state, nil)
}

// recordPull records a state with the pull that goes on in it.
func (in *incoming) recordPull(peer, state string, pull *journal.Pull) error {
	if in.d.Journal == nil {
		return nil
	}
	return in.d.Journal.Record(in.entry(peer, state, pull))
}

// entry is this migration as the journal holds it.
func (in *incoming) entry(peer, state string, pull *journal.Pull) journal.Entry {
	return journal.Entry{ID: in.offer.ID, Role: journal.Destination, Peer: peer,
		Container: in.offer.Container, Runtime: in.rt.Kind(), State: state, Pull: pull, NetNS: in.netnsPath,
		Volumes: volumeNames(in.offer.Volumes)}
}

// recordFinal records a final state; a failure leaves the restarted
// agent to drop a copy that is gone already.
func (in *incoming) recordFinal(peer, state string) {
	if err := in.record(peer, state); err != nil {
		in.d.log().Warn("journal", "migration", in.offer.ID, "error", err)
	}
}

// Answer tells a source what became of one of its migrations here: the
// journal's state, "unknown" when nothing of it was ever restored here.
// Only the host that sent a migration may ask about it.
func (d *Destination) Answer(ch *transport.Channel, peer string) {
	defer ch.Close()
	var q Query
	if err := ch.Recv(&q); err != nil {
		return
	}
	if d.Journal == nil {
		_ = ch.Fail(errors.New("this agent keeps no journal"))
		return
	}
	e, ok, err := d.Journal.Get(q.ID)
	switch {
	case err != nil:
		_ = ch.Fail(err)
	case !ok || e.Role != journal.Destination:
		_ = ch.Send(QueryAnswer{State: "unknown"})
	case e.State == journal.Started && e.Peer == peer:
		_ = ch.Send(QueryAnswer{State: journal.Committed}) // the source needs no more
	case e.Peer != peer:
		_ = ch.Fail(fmt.Errorf("migration %s came from another host", q.ID))
	default:
		_ = ch.Send(QueryAnswer{State: e.State})
	}
}

// Stages of an incoming migration, for the stop-or-restore decision.
const (
	stageReceiving int32 = iota
	stageRestoring       // the source asked for the restore: it runs to its end
	stageAbandoned       // the agent stopped first: the source was told to resume
)

// incoming is the destination side's state for one migration.
type incoming struct {
	d      *Destination
	offer  Offer
	key    string // the technique (see techniques.go)
	tech   technique
	rt     runtime.Runtime
	target runtime.Target // the container being received, once prepared
	work   string
	images string
	store  *pages.Store // pre-copy: the pages received in rounds
	// parent is pre-copy's parent image (rebuild switchover), once started.
	parent *images.ParentImage
	// journaled: the journal holds this migration (from before the
	// runtime prepared anything), so its end is journaled too; restoring:
	// a copy may have been restored here. peer is the source as its
	// session names it.
	journaled, restoring bool
	peer                 string
	// release gives up the claim on the container's name (Destination.reserveArrival),
	// unroom the room it took (Destination.Room).
	release, unroom func()
	// trees are where the root filesystem and the volumes sync into.
	trees []*destTree
	// netnsPath is the container's network namespace rebuilt here; up:
	// its carrier is on (takeAddress, bringUpNetwork).
	netnsPath string
	up        bool
	// hold keeps the container's incoming packets from the namespace's
	// making until the commit (takeAddress).
	hold    *cnet.Hold
	holdErr string // why there is no hold, when one was wanted
	// push is post-copy's push filling store while the copy runs.
	push *pushed
	// lastWrites: hybrid's, the pages the last rounds brought.
	lastWrites *lastWrites
	// early is the restore begun before the images, where it was.
	early earlyRestore
	// stranded: the source was lost mid-pull, and the pull waits for it
	// (strand): its processes and directory outlive this migration's run.
	stranded bool
	// faults are the failures the offer injects here (tests).
	faults fault.Set
	// stage says whether the restore was asked for, or the migration
	// abandoned (the agent stopping) first: one decision, taken once.
	stage atomic.Int32
}

// Receive serves one migration offered on ctl. Until the source commits,
// everything it creates is removed again when anything fails.
// Room is what a destination has promised to migrations on their way.
type Room interface {
	// Take claims room for migration id of memory bytes; release gives
	// it back once the migration has ended.
	Take(id string, memory int64) (release func(), err error)
}

func (d *Destination) Receive(ctx context.Context, sess *transport.Session, router *transport.Router, ctl *transport.Channel) {
	ctx = withLogger(ctx, d.log())
	defer ctl.Close()
	in := &incoming{d: d, peer: sess.Peer.Name}
	if err := ctl.Recv(&in.offer); err != nil {
		return
	}
	defer func() {
		if in.release != nil {
			in.release() // after the cleanup: a committed copy holds its name in its runtime
		}
		if in.unroom != nil {
			in.unroom()
		}
	}()
	if err := in.prepare(ctx); err != nil {
		_ = ctl.Fail(err)
		in.cleanup(true)
		return
	}
	defer criu.WarmBreakpoints()() // CRIU's restore stops the restored tasks at breakpoints
	// A stopping agent abandons what the source can still take back: until
	// the source asks for the restore, cancelling ctx closes the session,
	// so every transfer fails at both ends and the source resumes. From
	// the restore on, the migration runs to its end (see run).
	stop := context.AfterFunc(ctx, func() {
		if in.stage.CompareAndSwap(stageReceiving, stageAbandoned) {
			_ = ctl.Fail(fmt.Errorf("%s is stopping: the migration was abandoned before the restore", d.Host.Name))
			sess.Close()
		}
	})
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if in.offer.Mode == ModeAuto {
		router.Expect(ChanProbe)
	} else {
		in.expect(router)
	}
	if err := ctl.Send(Accept{Host: d.Host.Name, CRIUVersion: d.CRIUVersion, CRIU: d.CRIU}); err != nil {
		in.cleanup(true)
		return
	}
	if in.offer.Mode == ModeAuto {
		// The source measures the link, then says which technique it runs.
		go func() {
			if ch, err := router.Wait(ctx, sess, ChanProbe); err == nil {
				ServeProbe(ch)
			}
		}()
		var step Step
		if err := ctl.Recv(&step); err != nil || step.Do != StepMode || validateMode(step.Mode) != nil || step.Mode == ModeAuto {
			in.cleanup(true)
			return
		}
		in.offer.Mode = step.Mode
		if step.Precopy != nil {
			in.offer.Precopy = *step.Precopy
		}
		if err := in.d.Admission.CheckOffer(admission.Offer{MemoryBytes: in.offer.MemoryBytes, MaxRounds: in.offer.Precopy.MaxRounds}); err != nil {
			_ = ctl.Fail(err)
			in.cleanup(true)
			return
		}
		if err := in.settleTechnique(); err != nil {
			_ = ctl.Fail(err)
			in.cleanup(true)
			return
		}
		// The source opens no channel before this reply.
		in.expect(router)
		if err := ctl.Send(Accept{Host: d.Host.Name, CRIUVersion: d.CRIUVersion, CRIU: d.CRIU}); err != nil {
			in.cleanup(true)
			return
		}
	}
	committed, err := in.run(ctx, sess, router, ctl, cancel)
	// Discard first: the source resumes its copy as soon as it hears of
	// the failure. A copy that could not be discarded may run: then the
	// source hears nothing it could take for a yes to resume.
	if derr := in.cleanup(!committed); derr != nil && !committed {
		d.log().Error("a failed migration's container could not be discarded; the source stays frozen", "container", in.offer.Container, "error", derr)
		return
	}
	if err != nil {
		_ = ctl.Fail(err)
	}
}

func (in *incoming) prepare(ctx context.Context) error {
	o := in.offer
	if in.d.CRIUError != nil {
		return fmt.Errorf("CRIU cannot restore on %s: %v", in.d.Host.Name, in.d.CRIUError)
	}
	// The ID names this migration's scratch directory and journal file:
	// a plain ID only, or a peer could point them anywhere.
	if !ValidID(o.ID) {
		return fmt.Errorf("bad migration ID %q", o.ID)
	}
	if err := validateMode(o.Mode); err != nil {
		return err
	}
	if err := checkVolumes(o.Volumes); err != nil {
		return err
	}
	if in.d.AllowFaults {
		var err error
		if in.faults, err = fault.ParseSet(o.Faults); err != nil {
			return err
		}
	}
	if o.Container == "" || filepath.Base(o.Container) != o.Container || o.Container == "." || o.Container == ".." {
		return fmt.Errorf("bad container name %q", o.Container)
	}
	if err := in.d.Admission.CheckOffer(admission.Offer{MemoryBytes: o.MemoryBytes, MaxRounds: o.Precopy.MaxRounds}); err != nil {
		return err
	}
	if in.d.Room != nil {
		unroom, err := in.d.Room.Take(o.ID, o.MemoryBytes)
		if err != nil {
			return fmt.Errorf("%s has no room for it: %w", in.d.Host.Name, err)
		}
		in.unroom = unroom
	}
	kind := o.Runtime
	if kind == "" {
		kind = "runc" // sources before the runtime interface
	}
	rt, err := in.d.Runtimes.Get(kind)
	if err != nil {
		return fmt.Errorf("%s cannot receive this container: %w", in.d.Host.Name, err)
	}
	in.rt = rt
	// Nothing here is touched before the name is this migration's: not
	// taken by a container of this host, nor by another offer arriving.
	if in.release, err = in.d.reserveArrival(o.Container, o.ID, o.MemoryBytes); err != nil {
		return err
	}
	if _, err := rt.Inspect(ctx, o.Container); err == nil {
		return fmt.Errorf("%s on %s already has a container named %q: remove or rename it before moving this one here", kind, in.d.Host.Name, o.Container)
	} else if !errors.Is(err, runtime.ErrNotFound) {
		return fmt.Errorf("%s on %s: looking for a container named %q: %w", kind, in.d.Host.Name, o.Container, err)
	}
	if o.Mode != ModeAuto {
		if err := in.settleTechnique(); err != nil {
			return err
		}
	}
	in.work = in.d.Host.WorkDir(o.ID)
	in.images = filepath.Join(in.work, "images")
	if err := os.MkdirAll(in.images, 0o700); err != nil {
		return err
	}
	if err := in.prepareNetwork(); err != nil {
		return err
	}
	for _, d := range o.Shared {
		// Never a look at a path this host does not let containers
		// mount: what exists here is not the peer's to learn.
		if p := in.d.Admission; !p.Privileged && !p.BindAllowed(d.Source) {
			return fmt.Errorf("bind mount %s (at %s in the container): not under a directory this host allows (agent --allow-bind)", d.Source, d.Path)
		}
		if err := shareddir.Check(d); err != nil {
			return err
		}
	}
	c := &runtime.Container{Runtime: kind, Name: o.Container, ID: o.Container, Spec: o.Spec, Image: o.Image, Meta: o.Meta,
		Volumes: o.Volumes, Networks: o.Networks, Shared: o.Shared}
	t, err := rt.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: in.work, NetNS: in.netnsPath})
	if err != nil {
		return fmt.Errorf("%s on %s: %w", kind, in.d.Host.Name, err)
	}
	in.target = t
	// Recorded once the runtime made it (and never before: a name taken
	// here is someone else's), so that an agent that dies before the
	// restore removes it when it starts again.
	if err := in.record(in.peer, journal.Prepared); err != nil {
		return err
	}
	in.journaled = true
	if err := in.makeTrees(); err != nil {
		return fmt.Errorf("%s on %s: %w", kind, in.d.Host.Name, err)
	}
	return in.checkSpace()
}

// settleTechnique finds the offer's technique and checks this host's
// runtime can receive it.
func (in *incoming) settleTechnique() error {
	var err error
	if in.key, in.tech, err = techniqueFor(in.offer.Mode, in.offer.Precopy, in.rt); err != nil {
		return fmt.Errorf("%s: %w", in.d.Host.Name, err)
	}
	return criuRefusal(in.key, criu.Destination, in.d.Host.Name, in.d.CRIU, in.offer.SourceHost, in.offer.SourceCRIU, in.rt.Caps().LazyRestore)
}

// run receives the state, restores on request and waits for the commit.
// What differs between techniques is theirs (techniques.go): receive
// starts their receivers, arrive what the restore needs beside them, and
// the arrival readies the restore and pulls the memory after the commit.
func (in *incoming) run(rctx context.Context, sess *transport.Session, router *transport.Router, ctl *transport.Channel, cancel func()) (committed bool, err error) {
	recv := &receiving{failed: make(chan error, 1)}
	rx := receivers{sess: sess, router: router, g: recv}
	release := in.prewarm()
	defer release()
	in.receiveTrees(rctx, sess, router, recv, in.beginRestore)
	in.tech.receive(in, rctx, rx)
	imagesIn := in.receiveCheckedImages(rctx, rx)
	var arr arrival = plainArrival{}
	if in.tech.arrive != nil {
		arr = in.tech.arrive(in, rctx, rx, imagesIn)
	}
	abandon := func() {
		cancel()
		_ = recv.Wait()
		arr.abandon()
	}
	if err := in.awaitRestore(rctx, sess, ctl, recv); err != nil {
		abandon()
		return false, err
	}
	asked := time.Now()
	if !in.stage.CompareAndSwap(stageReceiving, stageRestoring) {
		// The agent is stopping and told the source so: it resumes.
		abandon()
		return false, fmt.Errorf("%s is stopping: the migration was abandoned before the restore", in.d.Host.Name)
	}
	// From here the source cannot resume on its own: what follows runs to
	// its end even if this agent is asked to stop (it drains).
	ctx := context.WithoutCancel(rctx)
	if err := recv.Wait(); err != nil {
		return false, fmt.Errorf("receiving state on %s: %w", in.d.Host.Name, err)
	}
	if !in.restoresFromOwnImages() {
		release() // before the restore writes the memory
	}
	r, err := arr.ready(ctx, rx)
	if r.pull != nil {
		defer func() { r.pull.end(committed) }()
	}
	if err != nil {
		return false, err
	}
	if err := in.restoreCopy(ctx, ctl, r, asked, release); err != nil {
		return false, err
	}
	if err := in.awaitCommit(sess, ctl); err != nil {
		return false, err
	}
	return in.commit(ctx, sess, ctl, r.pull)
}

// prewarm warms the memory the restore will write while the state
// arrives, and returns what gives it back to be written (see memwarm).
func (in *incoming) prewarm() (release func()) {
	warm := make(chan func(), 1)
	lazy, rebuild := in.tech.lazy, in.tech.rebuild
	switch {
	case in.d.NoPrewarm || lazy:
		warm <- func() {} // a lazy restore fills memory page by page
	case rebuild && in.restoresFromOwnImages():
		// The rounds' store is as big as the container's memory, touched
		// as the pages came, and no longer read once the images are
		// complete: given back after the restore, it is the warm memory
		// the lazy-pages daemon writes the container's pages into. (A
		// closure: the technique's receive, after this, makes the store.)
		warm <- func() { in.store.Release() }
	default:
		size := in.offer.MemoryBytes
		if rebuild {
			size *= 2 // the completed pages image, then the restored memory
		}
		go func() { warm <- memwarm.Warm(size) }()
	}
	return sync.OnceFunc(func() { (<-warm)() })
}

// receiveCheckedImages receives the CRIU images among rx's receivers and
// checks them; the channel returned says once they are in and checked.
func (in *incoming) receiveCheckedImages(ctx context.Context, rx receivers) <-chan error {
	imagesIn := make(chan error, 1)
	rx.g.Go(func() error {
		err := in.receiveImages(ctx, rx.sess, rx.router)
		if err == nil {
			// CRIU restores the tasks' credentials from the images, not
			// from the configuration admission checked.
			if ic, ok := in.target.(runtime.ImagesChecker); ok {
				err = ic.CheckImages(in.images)
			} else {
				err = in.d.Admission.CheckImages(in.images, in.offer.Spec)
			}
			if err != nil {
				err = fmt.Errorf("the container's CRIU images: %w", err)
			}
		}
		imagesIn <- err
		return err
	})
	return imagesIn
}

// awaitRestore answers the source's address step until it asks for the
// restore. A receiver that fails or a source that stalls aborts the
// migration: the source is told why, and the session closes under every
// transfer. The caller abandons what was received on any error.
func (in *incoming) awaitRestore(rctx context.Context, sess *transport.Session, ctl *transport.Channel, recv *receiving) error {
	var step Step
	var err error
	stepc := make(chan error, 1)
	go func() { stepc <- ctl.Recv(&step) }()
	stallCtx, stopWatch := context.WithCancel(rctx)
	stalled := watchStall(stallCtx, sess, in.d.stallTimeout(sess.OutageTimeout()))
	var abort error
	for {
		select {
		case err = <-stepc:
		case ferr := <-recv.failed:
			abort = fmt.Errorf("receiving state on %s: %w", in.d.Host.Name, ferr)
		case abort = <-stalled:
		}
		if abort != nil || err != nil || step.Do != StepAddress {
			break
		}
		taken, terr := in.takeAddress()
		if terr != nil {
			abort = fmt.Errorf("taking the container's address on %s: %w", in.d.Host.Name, terr)
			break
		}
		// The source froze; this host announced the address and may die
		// before it answers.
		in.faults.At(fault.Destination, fault.Freeze)
		if err = ctl.Send(AddressTaken{Taken: taken}); err != nil {
			break
		}
		go func() { stepc <- ctl.Recv(&step) }()
	}
	stopWatch()
	if abort != nil {
		// The source may be blocked sending what this side no longer
		// reads (a page server that died, a full disk), or silent while
		// it holds a slot: it is told why, then the session closes under
		// every transfer.
		_ = ctl.Fail(abort)
		time.AfterFunc(200*time.Millisecond, func() { sess.Close() }) // the reason goes out first
		return abort
	}
	if err != nil || step.Do != StepRestore {
		if err == nil {
			err = fmt.Errorf("source asked to %q before restore", step.Do)
		}
		return fmt.Errorf("migration abandoned by the source: %w", err)
	}
	return nil
}

// restoreCopy restores the copy as r readied it and tells the source it
// runs; release gives back the warmed memory (see prewarm).
func (in *incoming) restoreCopy(ctx context.Context, ctl *transport.Channel, r readied, asked time.Time, release func()) error {
	start := time.Now()
	// Recorded first: an agent that dies with a copy restored here drops
	// it when it starts again, unless the journal says it was committed.
	if err := in.record(in.peer, journal.Restoring); err != nil {
		return err
	}
	in.journaled, in.restoring = true, true
	pid, err := in.restore(ctx, r.pull != nil)
	if in.restoresFromOwnImages() {
		// Its memory is written after the copy runs, by the lazy-pages
		// daemon, into the warmed pages given back now (without them, 1 GiB
		// took that daemon 3.2-3.4 s here instead of 0.5 s), beside the
		// copy's first steps: unmapping 1 GiB before the restore took ~150
		// ms of the downtime.
		go release()
	}
	if err != nil {
		return err
	}
	if r.pull != nil {
		r.pull.restored()
	}
	if in.offer.Precopy.AutoConverge {
		if err := liftThrottle(pid, in.offer.Spec); err != nil {
			in.d.log().Warn("the CPU throttle auto-converge left stays", "migration", in.offer.ID, "container", in.offer.Container, "error", err)
		}
	}
	filled, lastw := r.filled, r.lastWrites
	return ctl.Send(Restored{Pid: pid, WaitMs: units.Millis(start.Sub(asked)), RestoreMs: units.Millis(time.Since(start)),
		FillMs: filled.ms, PagesLocal: filled.Local + filled.Parent, PagesFetched: filled.Fetched,
		MemoryBytes: int64(filled.Local+filled.Parent+filled.Fetched+filled.Dumped) * pageSize, FromOwnImages: r.fromOwnImages,
		LastWrites: lastw.Local, LastWritesMs: lastw.ms})
}

// awaitCommit waits for the source's commit: the source owns the
// container until it commits.
func (in *incoming) awaitCommit(sess *transport.Session, ctl *transport.Channel) error {
	var step Step
	var err error
	stepc := make(chan error, 1)
	go func() { stepc <- ctl.Recv(&step) }()
	select {
	case err = <-stepc:
	case <-time.After(commitWindow(sess.OutageTimeout())):
		err = errors.New("no commit from the source in time")
	}
	if err != nil || step.Do != StepCommit {
		if err == nil {
			err = fmt.Errorf("source sent %q instead of commit", step.Do)
		}
		return fmt.Errorf("migration not committed, restored copy dropped: %w", err)
	}
	return nil
}

// commit journals the commit, starts the copy and acknowledges it; a copy
// with a pull then waits for its memory (p, nil: it has all of it).
func (in *incoming) commit(ctx context.Context, sess *transport.Session, ctl *transport.Channel, p pulling) (bool, error) {
	// A lazy copy is not this host's alone until its memory is here.
	owns, pull := journal.Committed, (*journal.Pull)(nil)
	if p != nil {
		owns, pull = p.journal()
	}
	if err := in.recordPull(sess.Peer.Name, owns, pull); err != nil {
		return false, fmt.Errorf("migration not committed, restored copy dropped: %w", err)
	}
	in.faults.At(fault.Destination, fault.Commit)
	// Only now does the copy run (where the runtime restored it stopped):
	// a copy dropped before the commit never ran.
	if err := in.target.Start(ctx); err != nil {
		return true, fmt.Errorf("start the committed copy on %s: %w", in.d.Host.Name, err)
	}
	held := in.releaseHeld()
	if p == nil {
		in.recordFinal(in.peer, journal.Started)
	}
	err := ctl.Send(Committed{HeldPackets: held, HoldError: in.holdErr})
	in.closeHold()
	if err != nil && p != nil {
		return p.unheard(ctx, sess, err)
	}
	if err != nil {
		return true, err
	}
	if p != nil {
		return p.finish(ctx, sess, ctl)
	}
	in.faults.At(fault.Destination, fault.Cleanup)
	return true, nil
}

// stallTimeout is how long a destination waits for a silent source
// before the restore: a source that only answers keepalives would hold
// one of its incoming slots forever. Past the session's outage timeout,
// so that a cut the session survives is not taken for a stall.
func (d *Destination) stallTimeout(outage time.Duration) time.Duration {
	if d.StallTimeout > 0 {
		return d.StallTimeout
	}
	return max(2*time.Minute, 2*outage)
}

// watchStall reports (once) when the session has received nothing for
// after, until ctx ends. Keepalives (a 12-byte ping every few seconds)
// are not something: progress is a kibibyte or more between two looks.
func watchStall(ctx context.Context, sess *transport.Session, after time.Duration) <-chan error {
	out := make(chan error, 1)
	go func() {
		t := time.NewTicker(min(after/4, 5*time.Second))
		defer t.Stop()
		last, since := sess.BytesReceived(), time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				if b := sess.BytesReceived(); b-last >= 1024 {
					last, since = b, now
				} else if now.Sub(since) >= after {
					out <- fmt.Errorf("the source sent nothing for %v before asking for the restore: migration given up", after.Round(time.Second))
					return
				}
			}
		}
	}()
	return out
}

// receiving runs a migration's receivers; the first to fail is heard at
// once, not when the others end (they may wait for a source that is
// itself blocked).
type receiving struct {
	g      errgroup.Group
	failed chan error // holds the first receiver's error
}

func (r *receiving) Go(f func() error) {
	r.g.Go(func() error {
		err := f()
		if err != nil {
			select {
			case r.failed <- err:
			default:
			}
		}
		return err
	})
}

func (r *receiving) Wait() error { return r.g.Wait() }

// expect registers the channels the offer's technique uses.
func (in *incoming) expect(router *transport.Router) {
	for _, k := range append(channelsFor(in.key, in.offer.Precopy), volumeChannels(in.offer.Volumes)...) {
		router.Expect(k)
	}
}

// receiveFinalPages runs CRIU's page server for the final dump, linked to
// its parent pre-dump when it has one, putting pre-copy's references back
// when store is set.
func (in *incoming) receiveFinalPages(ctx context.Context, sess *transport.Session, router *transport.Router, store *pages.Store) error {
	ch, err := router.Wait(ctx, sess, ChanPages)
	if err != nil {
		return err
	}
	in.faults.At(fault.Destination, fault.Dump)
	defer ch.Close()
	var info PageStreamInfo
	if err := ch.Recv(&info); err != nil {
		return err
	}
	if err := linkParent(in.images, info.Parent); err != nil {
		return err
	}
	if store != nil {
		return runExpandingPageServer(ctx, ch, store, in.images, in.work)
	}
	return runPageServer(ctx, ch, in.images, in.work)
}

func (in *incoming) receiveImages(ctx context.Context, sess *transport.Session, router *transport.Router) error {
	ch, err := router.Wait(ctx, sess, ChanImages)
	if err != nil {
		return err
	}
	defer ch.Close()
	var r io.Reader = ch
	if in.tech.lazy {
		// A lazy dump sends no pages, and no CRIU runs here meanwhile:
		// its images coming are its dump here (the source opens their
		// channel long before).
		r = &firstRead{Reader: ch, then: func() { in.faults.Agent(fault.Destination, fault.Dump) }}
	}
	if _, err := images.ReceiveDir(r, in.images); err != nil {
		return err
	}
	// A tar cut off between two files, or before the first (the channel
	// is open from the start), reads as whole: the source's end of the
	// stream says it is.
	if _, err := io.Copy(io.Discard, ch); err != nil {
		return err
	}
	if !ch.Ended() {
		return errors.New("the images stopped coming before their end")
	}
	return nil
}

// firstRead runs then once its first read returned data.
type firstRead struct {
	io.Reader
	then func()
	done bool
}

func (f *firstRead) Read(p []byte) (int, error) {
	n, err := f.Reader.Read(p)
	if n > 0 && !f.done {
		f.done = true
		f.then()
	}
	return n, err
}

// criuDirs are where the restore's CRIU keeps files open: the work
// directory, and the runtime's own where it has CRIU work there.
func (in *incoming) criuDirs() []string {
	dirs := []string{in.work}
	if e, ok := in.target.(runtime.CRIUElsewhere); ok {
		dirs = append(dirs, e.CRIUDirs()...)
	}
	return dirs
}

func (in *incoming) restore(ctx context.Context, lazy bool) (int, error) {
	if in.faults.Has(fault.RestoreFails, fault.Restore) {
		// A real failure, not a simulated one: CRIU cannot restore without
		// the process tree image.
		_ = os.Remove(filepath.Join(in.images, "pstree.img"))
	}
	in.faults.CRIU(fault.Destination, fault.Restore)
	var pid int
	var err error
	o := in.restoreOptions(lazy)
	if in.work != "" {
		// A CRIU killed mid-restore leaves the tasks it forked holding
		// its runtime's socket: the runtime would wait on them for ever.
		stop := criu.WatchAbandoned(250*time.Millisecond, func(pid int) {
			in.d.log().Warn("killed what a dead restore's CRIU left behind", "migration", in.offer.ID, "pid", pid)
		}, in.criuDirs()...)
		defer stop()
	}
	if early := in.early.take(o); early != nil {
		pid, err = early.Go(ctx)
	} else {
		pid, err = in.target.Restore(ctx, o)
	}
	if err != nil {
		// The source reports it as "restore on <this host>: ..." already.
		return 0, err
	}
	// The agent dies (or stops) with the container restored, before it
	// could tell the source.
	in.faults.Agent(fault.Destination, fault.Restore)
	// Only now: up earlier, this host's kernel would have answered the
	// container's peers with resets before its sockets were back.
	if err := in.bringUpNetwork(); err != nil {
		return 0, fmt.Errorf("network on %s: %w", in.d.Host.Name, err)
	}
	in.announceRuntimeNetworks(pid)
	return pid, nil
}

// cleanup removes the migration's scratch space and, when the migration did
// not commit, every trace of the container here.
// It returns the error of a container it could not drop.
func (in *incoming) cleanup(dropContainer bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in.dropHold() // never left holding, whatever the outcome
	in.early.cancel()
	var err error
	if in.stranded {
		// Its daemon, relay and directory wait for the source (resume.go).
		if in.store != nil {
			in.store.Release()
		}
		return nil
	}
	if in.work != "" {
		// A restore or lazy-pages daemon stuck on a source that is gone
		// would hold the container's cgroups and mounts.
		if pids, _ := criu.KillWorkingIn(in.work); len(pids) > 0 {
			in.d.log().Warn("killed CRIU processes still working for an ended migration", "migration", in.offer.ID, "pids", pids)
		}
	}
	if dropContainer && in.target != nil {
		in.silenceNetwork()
		err = in.target.Discard(ctx)
	}
	if dropContainer && err == nil {
		in.dropNetwork() // made before the runtime's prepare, which may have refused
	}
	if dropContainer && err == nil && in.journaled {
		in.recordFinal(in.peer, journal.Dropped)
	}
	if in.store != nil {
		in.store.Release()
	}
	// What the migration held (the store's copy of the memory, the
	// session's buffers of whatever crossed) goes back to the host now,
	// not when the Go runtime's scavenger gets to it, minutes later on
	// an idle agent.
	defer debug.FreeOSMemory()
	if in.parent != nil {
		_ = in.parent.Close()
	}
	if in.work != "" && dropContainer {
		if dir, err := keepLogs(in.work, in.d.Host.LogsDir(), in.offer.ID); err != nil {
			in.d.log().Warn("logs of a failed migration not all kept", "migration", in.offer.ID, "dir", dir, "error", err)
		} else if dir != "" {
			in.d.log().Info("kept the logs of a failed migration", "migration", in.offer.ID, "dir", dir)
		}
	}
	if in.work != "" && !in.d.KeepWork {
		// A CRIU killed mid-restore leaves its cgroup yard mounted here.
		if err := mounts.RemoveAll(in.work); err != nil {
			in.d.log().Warn("scratch left behind", "dir", in.work, "error", err)
		}
	}
	return err
}

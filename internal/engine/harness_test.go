package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/images"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/rootfs"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/transport/transporttest"
)

// A harness for the destination's control flow without root, CRIU or a
// lab: a Destination whose only runtime is fakeRuntime, over a session on
// net.Pipe whose source end the test drives by hand.

// fakePid is what a fake restore returns: no process has it (above
// Linux's largest pid_max), so nothing that looks a pid up (auto-converge's
// throttle) can touch a real process.
const fakePid = 1 << 30

// fakeRuntime is a runtime.Runtime that creates nothing but a directory
// per prepared container and records what the engine asks of it.
type fakeRuntime struct {
	caps runtime.Caps
	root string // where prepared containers' root filesystems go
	// prepareErr refuses every Prepare (a name taken, an image missing);
	// restoreErr fails every restore.
	prepareErr, restoreErr error
	// afterRestore and afterStart, when set, run once a restore or a
	// start succeeded (the destination's agent dying there).
	afterRestore, afterStart func()
	// early makes targets that begin their restore before the images
	// (runtime.EarlyTarget).
	early bool
	// taken names a container this host runs already.
	taken string

	mu       sync.Mutex
	prepared []*runtime.Container
	targets  []*fakeTarget
	freezes  int
}

func (f *fakeRuntime) List(context.Context) ([]runtime.Container, error) { return nil, nil }
func (f *fakeRuntime) Kind() string                                      { return "fake" }
func (f *fakeRuntime) Caps() runtime.Caps                                { return f.caps }

func (f *fakeRuntime) Inspect(_ context.Context, name string) (*runtime.Container, error) {
	if name != "" && name == f.taken {
		return &runtime.Container{Name: name, ID: name, Status: "running"}, nil
	}
	return nil, runtime.ErrNotFound
}

func (f *fakeRuntime) Freeze(context.Context, *runtime.Container) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.freezes++
	return nil
}

func (f *fakeRuntime) Thaw(context.Context, *runtime.Container) error { return nil }

func (f *fakeRuntime) Checkpoint(context.Context, *runtime.Container, runtime.CheckpointOptions) (runtime.Dump, error) {
	return nil, errors.New("fake runtime: no checkpoint at a destination")
}

func (f *fakeRuntime) Remove(context.Context, *runtime.Container) error {
	return errors.New("fake runtime: no remove at a destination")
}

func (f *fakeRuntime) Prepare(_ context.Context, c *runtime.Container, o runtime.PrepareOptions) (runtime.Target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prepared = append(f.prepared, c)
	if f.prepareErr != nil {
		return nil, f.prepareErr
	}
	dir, err := os.MkdirTemp(f.root, "rootfs-")
	if err != nil {
		return nil, err
	}
	t := &fakeTarget{dir: dir, restoreErr: f.restoreErr, afterRestore: f.afterRestore, afterStart: f.afterStart, opts: o}
	f.targets = append(f.targets, t)
	if f.early {
		return earlyFakeTarget{t}, nil
	}
	return t, nil
}

// counts says how many containers were prepared and what became of them.
type counts struct{ prepared, restored, started, discarded int }

func (f *fakeRuntime) counts() counts {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := counts{prepared: len(f.prepared)}
	for _, t := range f.targets {
		t.mu.Lock()
		c.restored += len(t.restores)
		c.started += t.starts
		c.discarded += t.discards
		t.mu.Unlock()
	}
	return c
}

func (f *fakeRuntime) target(t *testing.T) *fakeTarget {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.targets) != 1 {
		t.Fatalf("%d containers prepared, want 1", len(f.targets))
	}
	return f.targets[0]
}

// fakeTarget is a prepared container: a directory, and what was asked of it.
type fakeTarget struct {
	dir          string
	restoreErr   error
	afterRestore func()
	afterStart   func()
	opts         runtime.PrepareOptions

	mu       sync.Mutex
	restores []runtime.RestoreOptions
	pages    string // the page server's output at the restore
	starts   int
	discards int
	// begun, went and cancelled count early restores begun, and their
	// Go and Cancel.
	begun, went, cancelled int
}

// earlyFakeTarget is a fakeTarget whose restore begins early: Go restores
// as Restore does.
type earlyFakeTarget struct{ *fakeTarget }

func (t earlyFakeTarget) StartRestore(o runtime.RestoreOptions) (runtime.Restoring, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.begun++
	return &fakeRestoring{t: t.fakeTarget, o: o}, nil
}

type fakeRestoring struct {
	t *fakeTarget
	o runtime.RestoreOptions
}

func (r *fakeRestoring) Go(ctx context.Context) (int, error) {
	r.t.mu.Lock()
	r.t.went++
	r.t.mu.Unlock()
	return r.t.Restore(ctx, r.o)
}

func (r *fakeRestoring) Cancel() {
	r.t.mu.Lock()
	r.t.cancelled++
	r.t.mu.Unlock()
}

func (t *fakeTarget) RootfsDir() string { return t.dir }

// VolumeDir is a directory beside the root filesystem's.
func (t *fakeTarget) VolumeDir(name string) (string, error) {
	dir := t.dir + ".volume-" + name
	return dir, os.MkdirAll(dir, 0o755)
}

func (t *fakeTarget) Restore(_ context.Context, o runtime.RestoreOptions) (int, error) {
	t.mu.Lock()
	t.restores = append(t.restores, o)
	// What a page server wrote (see fakeCRIU in source_test.go).
	if b, err := os.ReadFile(filepath.Join(o.ImagesDir, fakePagesFile)); err == nil {
		t.pages = string(b)
	}
	err := t.restoreErr
	t.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if o.Lazy {
		if err := lazyRestore(o.WorkDir, fakePid); err != nil {
			return 0, err
		}
	}
	if t.afterRestore != nil {
		t.afterRestore()
	}
	return fakePid, nil
}

func (t *fakeTarget) Start(context.Context) error {
	t.mu.Lock()
	t.starts++
	t.mu.Unlock()
	if t.afterStart != nil {
		t.afterStart()
	}
	return nil
}

func (t *fakeTarget) Discard(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.discards++
	return os.RemoveAll(t.dir)
}

// allCaps is a runtime that can run every technique.
var allCaps = runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true, PreDump: true, RestoreStopped: true}

// harness is one destination and the source end of a session to it.
type harness struct {
	t  *testing.T
	d  *Destination
	rt *fakeRuntime
	j  *journal.Journal

	src *transport.Session // the source's end
	dst *transport.Session // the destination's
	ctl *transport.Channel // the source's control channel, once open
	// cancel cancels the destination's context: its agent stopping.
	cancel context.CancelFunc
	// started is set when Receive starts, done closed when it returns.
	started atomic.Bool
	done    chan struct{}
	// oneWay is the session's latency each way (0: none).
	oneWay time.Duration
}

// newHarness makes a destination "h2" with the fake runtime (runc-like
// caps: no lazy restore, no pre-dump), a journal and a state directory of
// its own, CRIU present, no segment bridge, admission up to 1 GiB, no
// memory prewarming. change adjusts it before the session starts.
func newHarness(t *testing.T, change ...func(*harness)) *harness {
	t.Helper()
	base := t.TempDir()
	state := filepath.Join(base, "state")
	j, err := journal.Open(filepath.Join(state, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{caps: runtime.Caps{Freeze: true, LazyDump: true, RestoreStopped: true}, root: filepath.Join(base, "containers")}
	if err := os.MkdirAll(rt.root, 0o700); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, rt: rt, j: j, done: make(chan struct{}),
		d: &Destination{
			Host:        host.Config{Name: "h2", StateDir: state},
			Runtimes:    runtime.Set{"fake": rt},
			CRIUVersion: "4.1",
			Journal:     j,
			NoPrewarm:   true,
			Admission:   admission.Policy{MaxMemoryBytes: 1 << 30},
			// What the push brings is asked of no one else, however
			// loaded the machine (-race).
			pushWait: 2 * time.Second,
		}}
	for _, c := range change {
		c(h)
	}
	h.connect()
	return h
}

// connect starts the session: the destination serves it as an agent does
// (a Router, Receive for an incoming channel).
func (h *harness) connect() {
	t := h.t
	var src, dst *transport.Session
	if h.oneWay > 0 {
		src, dst = transporttest.Delayed(t, "h1", "h2", h.oneWay)
	} else {
		src, dst = transporttest.Conn(t, "h1", "h2")
	}
	h.src, h.dst = src, dst
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	router := transport.NewRouter()
	go router.Serve(dst, func(ch *transport.Channel) {
		if ch.Kind != ChanIncoming {
			ch.Close()
			return
		}
		h.started.Store(true)
		defer close(h.done)
		h.d.Receive(ctx, dst, router, ch)
	})
	// Before the temporary directories go: the session closed, Receive
	// returns (a test that failed early may have left it waiting).
	t.Cleanup(func() {
		src.Close()
		dst.Close()
		cancel()
		if h.started.Load() {
			select {
			case <-h.done:
			case <-time.After(5 * time.Second):
				t.Error("Receive did not return within 5 s of the session closing")
			}
		}
	})
}

// open opens the control channel.
func (h *harness) open() *transport.Channel {
	h.t.Helper()
	ch, err := h.src.Open(ChanIncoming)
	if err != nil {
		h.t.Fatal(err)
	}
	h.ctl = ch
	return ch
}

// offer opens the control channel and sends o; it returns the
// destination's answer.
func (h *harness) offer(o Offer) (Accept, error) {
	h.t.Helper()
	ctl := h.open()
	if err := ctl.Send(o); err != nil {
		h.t.Fatal(err)
	}
	var a Accept
	err := ctl.Recv(&a)
	return a, err
}

// accepted offers o and fails the test unless the destination accepts.
func (h *harness) accepted(o Offer) {
	h.t.Helper()
	a, err := h.offer(o)
	if err != nil {
		h.t.Fatalf("offer refused: %v", err)
	}
	if a.Host != "h2" || a.CRIUVersion != "4.1" {
		h.t.Fatalf("accept %+v", a)
	}
}

// returned waits until Receive has returned.
func (h *harness) returned() {
	h.t.Helper()
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		h.t.Fatal("Receive did not return within 5 s")
	}
}

// failure reads the control channel, where the destination must report
// a failure saying one of wants.
func (h *harness) failure(wants ...string) {
	h.t.Helper()
	var v any
	err := h.ctl.Recv(&v)
	if transport.IsRemote(err) {
		for _, w := range wants {
			if strings.Contains(err.Error(), w) {
				return
			}
		}
	}
	h.t.Fatalf("the source heard %v (%v), want a failure saying one of %q", err, v, wants)
}

// sessionClosed fails the test unless the destination closed the session.
func (h *harness) sessionClosed() {
	h.t.Helper()
	select {
	case <-h.src.Done():
	case <-time.After(5 * time.Second):
		h.t.Fatal("the session stayed open")
	}
}

// journaled returns the journal's entry for id ("" state: none).
func (h *harness) journaled(id string) journal.Entry {
	h.t.Helper()
	e, ok, err := h.j.Get(id)
	if err != nil {
		h.t.Fatal(err)
	}
	if !ok {
		return journal.Entry{}
	}
	return e
}

// allDropped fails the test if the journal holds anything but dropped
// copies: what the runtime prepared is recorded, and recorded gone.
func (h *harness) allDropped() {
	h.t.Helper()
	all, err := h.j.All()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range all {
		if e.State != journal.Dropped {
			h.t.Errorf("journal holds %+v, want dropped copies only", all)
			return
		}
	}
}

// scratchGone fails the test if the migration's scratch directory is left.
func (h *harness) scratchGone(id string) {
	h.t.Helper()
	if _, err := os.Stat(h.d.Host.WorkDir(id)); !errors.Is(err, os.ErrNotExist) {
		h.t.Errorf("scratch %s left behind (%v)", h.d.Host.WorkDir(id), err)
	}
}

func (h *harness) want(c counts) {
	h.t.Helper()
	if got := h.rt.counts(); got != c {
		h.t.Errorf("the runtime saw %+v, want %+v", got, c)
	}
}

const testID = "0123456789ab"

// testOffer is a valid offer of container "web" in mode.
func testOffer(mode string) Offer {
	return Offer{ID: testID, Container: "web", Mode: mode, SourceHost: "h1", Runtime: "fake", MemoryBytes: 1 << 20}
}

// rebuildOffer is pre-copy with the rebuild switchover: of the techniques
// the one whose destination half runs no CRIU process (its images are
// completed in-process and the fake runtime restores them), so the whole
// protocol runs here.
func rebuildOffer() Offer {
	o := testOffer(ModePrecopy)
	o.Precopy = PrecopyOptions{Engine: PrecopyContent, Switchover: SwitchoverRebuild, MaxRounds: 4}
	return o
}

// --- the source's half, by hand ---

// syncRootfs plays the source's side of one rootfs channel: it sends what
// the destination's copy lacks of root.
func (h *harness) syncRootfs(kind, root string) error {
	ch, err := h.src.Open(kind)
	if err != nil {
		return err
	}
	defer ch.Close()
	var have RootfsHave
	if err := ch.Recv(&have); err != nil {
		return err
	}
	want, err := rootfs.Scan(root)
	if err != nil {
		return err
	}
	base := have.Manifest
	if have.AsLive {
		base = want // nothing changed here since the live sync
	}
	if _, err := rootfs.SendDelta(ch, root, rootfs.Diff(base, want), nil); err != nil {
		return err
	}
	if err := ch.CloseWrite(); err != nil {
		return err
	}
	attrs, err := rootfs.ReadRootAttrs(root)
	if err != nil {
		return err
	}
	if err := ch.Send(attrs); err != nil {
		return err
	}
	var done RootfsDone
	return ch.Recv(&done)
}

// sendRounds sends one pre-copy round of one page and ends the stream.
func (h *harness) sendRounds() error {
	ch, err := h.src.Open(ChanRounds)
	if err != nil {
		return err
	}
	enc, err := pages.NewEncoder(ch, false)
	if err != nil {
		return err
	}
	page := make([]byte, pages.PageSize)
	copy(page, "a page of the container's memory")
	if err := enc.Page(pages.Key{PID: 1, Addr: 0x10000}, page); err != nil {
		return err
	}
	if err := enc.EndRound(0); err != nil {
		return err
	}
	var ack RoundAck
	if err := ch.Recv(&ack); err != nil {
		return err
	}
	if ack.Index != 0 || ack.Pages != 1 {
		return fmt.Errorf("round acknowledged as %+v", ack)
	}
	if err := enc.Close(); err != nil {
		return err
	}
	if err := ch.CloseWrite(); err != nil {
		return err
	}
	return ch.Send(StalePages{Keys: []pages.Key{}})
}

// sendImages sends an images directory of one small file.
func (h *harness) sendImages() error {
	dir := filepath.Join(h.t.TempDir(), "images")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "inventory.img"), []byte("not a real image"), 0o600); err != nil {
		return err
	}
	ch, err := h.src.Open(ChanImages)
	if err != nil {
		return err
	}
	if _, err := images.SendDir(ch, dir, nil); err != nil {
		return err
	}
	return ch.CloseWrite()
}

// serveLazy opens the lazy channel the rebuild switchover closes the
// source's CRIU page server through, and answers its close.
func (h *harness) serveLazy() error {
	ch, err := h.src.Open(ChanLazy)
	if err != nil {
		return err
	}
	go func() {
		defer ch.Close()
		var req [32]byte // a page_server_iov: the close command
		if _, err := io.ReadFull(ch, req[:]); err != nil {
			return
		}
		_, _ = ch.Write([]byte{0, 0, 0, 0})
		_ = ch.CloseWrite()
	}()
	return nil
}

// sourceRoot is a small root filesystem to move.
func sourceRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("web\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// sendState sends everything pre-copy's rebuild switchover needs before
// the restore, as its source does: the live rootfs sync, the rounds, the
// frozen rootfs sync and the images, then the lazy channel.
func (h *harness) sendState(root string) {
	h.t.Helper()
	if err := h.syncRootfs(ChanRootfsLive, root); err != nil {
		h.t.Fatalf("live rootfs sync: %v", err)
	}
	if err := h.sendRounds(); err != nil {
		h.t.Fatalf("rounds: %v", err)
	}
	if err := h.syncRootfs(ChanRootfsFinal, root); err != nil {
		h.t.Fatalf("frozen rootfs sync: %v", err)
	}
	if err := h.sendImages(); err != nil {
		h.t.Fatalf("images: %v", err)
	}
	if err := h.serveLazy(); err != nil {
		h.t.Fatalf("lazy channel: %v", err)
	}
}

// restored asks for the restore and returns the destination's answer.
func (h *harness) restored() (Restored, error) {
	h.t.Helper()
	if err := h.ctl.Send(Step{Do: "restore"}); err != nil {
		h.t.Fatal(err)
	}
	var r Restored
	err := h.ctl.Recv(&r)
	return r, err
}

// commit sends the commit and returns the destination's answer.
func (h *harness) commit() Committed {
	h.t.Helper()
	if err := h.ctl.Send(Step{Do: "commit"}); err != nil {
		h.t.Fatal(err)
	}
	var c Committed
	if err := h.ctl.Recv(&c); err != nil {
		h.t.Fatalf("commit: %v", err)
	}
	return c
}

// abandoned checks how a migration given up before the restore ends:
// Receive returned, the target was prepared and discarded once, nothing
// was journaled, no scratch is left.
func (h *harness) abandoned() {
	h.t.Helper()
	h.returned()
	h.want(counts{prepared: 1, discarded: 1})
	h.allDropped()
	h.scratchGone(testID)
}

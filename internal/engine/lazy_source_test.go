package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// The source half of post-copy and hybrid, end to end without root: the
// fake source's lazy dump leaves its memory with a page server (a
// goroutine listening where the engine says, on the host's loopback: the
// container shares this process's network namespace), the destination
// harness runs `criu lazy-pages` (the test binary, fakecriu_test.go), and
// the daemon's requests ride the session to that page server, or are
// answered from the destination's copy (post-copy's push, hybrid's rounds).

// lazySource is what a fakeSource's lazy dump holds and what became of
// its page server.
type lazySource struct {
	// breakAfter, above 0, has the page server hang up instead of
	// answering its request number breakAfter+1 (CRIU's page server dying).
	breakAfter int

	mu      sync.Mutex
	regions []lazyRegion // the memory left here, in the daemon's order
	served  int          // GET requests answered
	closed  bool         // the session ended on PS_IOV_CLOSE
	ended   bool         // the page server ended (CRIU's dump exited)
	// end ends the page server (as when the dump is stopped).
	end context.CancelFunc
}

// stop ends the page server, if one runs.
func (s *lazySource) stop() {
	s.mu.Lock()
	end := s.end
	s.mu.Unlock()
	if end != nil {
		end()
	}
}

// lazyCaps is a runtime that can dump and restore lazily (runc's, where
// CRIU's lazy pages work).
var lazyCaps = runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true, RestoreStopped: true}

// lazyCheckpoint is a lazy dump of the frozen container: the images
// (with the plan the fake daemon follows) and a page server holding two
// runs of memory: four pages of the real process, which the destination's
// copy holds by the time the daemon asks (pushed, or read in rounds), and
// two made up below mmap_min_addr, which no round or push can read, so
// they cross from this page server, asked for as faults.
func (f *fakeSource) lazyCheckpoint(ctx context.Context, o runtime.CheckpointOptions) (runtime.Dump, error) {
	// A container in this process's network namespace: the engine must
	// run the page server on the host's loopback (pageServerNet).
	if o.PageNet != nil {
		return nil, errors.New("fake lazy dump: given a private network namespace for a container that shares the host's")
	}
	id, addr, data, err := processPages(f.ctr.PID, 4)
	if err != nil {
		return nil, err
	}
	var madeUp []byte
	for i := 0; i < 2; i++ {
		madeUp = append(madeUp, bytes.Repeat([]byte{byte('A' + i)}, pageSize)...)
	}
	regions := []lazyRegion{
		{fault: true, pid: uint32(id), addr: 0x1000, data: madeUp},
		{pid: uint32(id), addr: addr, data: data},
	}
	if err := os.MkdirAll(o.ImagesDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.ImagesDir, "inventory.img"), []byte("not a real image"), 0o600); err != nil {
		return nil, err
	}
	if err := writeLazyPlan(filepath.Join(o.ImagesDir, lazyPlanFile), regions); err != nil {
		return nil, err
	}
	if f.imageBytes > 0 {
		// What a real dump writes besides: the pages CRIU cannot leave lazy.
		if err := os.WriteFile(filepath.Join(o.ImagesDir, "pages-1.img"), make([]byte, f.imageBytes), 0o600); err != nil {
			return nil, err
		}
	}
	l, err := net.Listen("tcp", o.PageServer)
	if err != nil {
		return nil, err
	}
	ctx, end := context.WithCancel(ctx)
	f.lazy.mu.Lock()
	f.lazy.regions, f.lazy.end = regions, end
	f.lazy.mu.Unlock()
	d := &fakeLazyDump{fakeDump: fakeDump{f}, done: make(chan struct{})}
	go func() {
		d.err = f.lazy.serve(ctx, l)
		f.lazy.mu.Lock()
		f.lazy.ended = true
		f.lazy.mu.Unlock()
		close(d.done)
	}()
	return d, nil
}

// fakeLazyDump is a lazy dump whose CRIU exits when its page server ends.
type fakeLazyDump struct {
	fakeDump
	done chan struct{}
	err  error
}

func (d *fakeLazyDump) Wait() error {
	<-d.done
	return d.err
}

// serve plays CRIU's lazy page server on l: one session, GET requests
// answered from the regions held, until PS_IOV_CLOSE (or ctx ends: the
// dump stopped).
func (s *lazySource) serve(ctx context.Context, l net.Listener) error {
	stopListen := context.AfterFunc(ctx, func() { l.Close() })
	conn, err := l.Accept()
	stopListen()
	l.Close()
	if err != nil {
		return fmt.Errorf("fake page server: %w", err)
	}
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	in := bufio.NewReader(conn)
	hdr := make([]byte, psHeaderSize)
	for {
		if _, err := io.ReadFull(in, hdr); err != nil {
			return fmt.Errorf("fake page server: the session ended without a close: %w", err)
		}
		cmd, n, vaddr, id := parsePSHeader(hdr)
		switch cmd & 0xffff {
		case psIOVGetCmd:
			data, err := s.answer(n, vaddr, id)
			if err != nil {
				return err
			}
			if _, err := conn.Write(append(psHeader(psPEPresent<<16|psIOVAddFCmd, n, vaddr, id), data...)); err != nil {
				return err
			}
		case psIOVCloseCmd, psIOVForceClose:
			_, err := conn.Write(make([]byte, 4))
			s.mu.Lock()
			s.closed = true
			s.mu.Unlock()
			return err
		default:
			return fmt.Errorf("fake page server: command %#x", cmd)
		}
	}
}

// answer returns the n pages of pid from vaddr, counting the request.
func (s *lazySource) answer(n, vaddr, pid uint64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.breakAfter > 0 && s.served >= s.breakAfter {
		return nil, errors.New("fake page server: broke off")
	}
	for _, r := range s.regions {
		if uint64(r.pid) == pid && vaddr >= r.addr && vaddr+n*pageSize <= r.addr+uint64(len(r.data)) {
			s.served++
			off := vaddr - r.addr
			return r.data[off : off+n*pageSize], nil
		}
	}
	return nil, fmt.Errorf("fake page server: asked for %d pages of %d at %#x, which it does not hold", n, pid, vaddr)
}

// held is the memory the lazy dump left here, in the order the daemon
// asks for it; faults and background are its pages by how they are asked.
func (s *lazySource) held() (data []byte, faults, background int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.regions {
		data = append(data, r.data...)
		if r.fault {
			faults += r.pages()
		} else {
			background += r.pages()
		}
	}
	return data, faults, background
}

func (s *lazySource) outcome() (served int, closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served, s.closed
}

func (s *lazySource) over() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// thawChecks has the source's thaw note whether the destination had
// discarded its copy and the lazy dump had ended by then.
func (r *sourceRun) thawChecks() (discarded, dumpEnded *bool) {
	discarded, dumpEnded = new(bool), new(bool)
	r.src.beforeThaw = func() {
		*discarded = r.rt.counts().discarded > 0
		*dumpEnded = r.src.lazy.over()
	}
	return discarded, dumpEnded
}

// lazyRun is a sourceRun of a container with real memory whose runtimes,
// at both ends, dump and restore lazily, with the fake daemon.
type lazyRun struct {
	*sourceRun
	pulled string // where the fake daemon leaves what it pulled
}

// newLazyRun makes a lazyRun whose daemon exits 1 after failAfter pages
// (never for 0).
func newLazyRun(t *testing.T, failAfter int, change ...func(*sourceRun)) *lazyRun {
	t.Helper()
	pid := sleeper(t)
	// The daemon's socket is in the destination's scratch directory: a
	// short one, for a socket path t.TempDir's long names could overflow.
	scratch, err := os.MkdirTemp("", "ferry-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	pulled := fakeLazyDaemon(t, failAfter) // killed, if need be, before the scratch goes
	setup := func(r *sourceRun) {
		r.src.ctr.PID = pid
		r.src.caps = lazyCaps
		r.rt.caps = lazyCaps
		r.d.Host.ScratchDir = scratch
	}
	r := &lazyRun{sourceRun: newSourceRun(t, append([]func(*sourceRun){setup}, change...)...), pulled: pulled}
	t.Cleanup(r.src.lazy.stop)
	return r
}

// migrateLazily moves "web" to h2 in mode (hybrid: two live rounds). A
// migration still running after 20 s fails the test, saying where it
// waits; its page server is then ended, which lets a source waiting for
// its dump go on.
func (r *lazyRun) migrateLazily(mode string) Report {
	r.t.Helper()
	done := make(chan Report, 1)
	go func() { done <- r.migrate(mode, PrecopyOptions{MaxRounds: 2}) }()
	select {
	case rep := <-done:
		return rep
	case <-time.After(20 * time.Second):
	}
	r.t.Errorf("the migration has not ended in 20 s:\n%s", migrationStacks())
	r.src.lazy.stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	r.t.FailNow()
	return Report{}
}

// migrationStacks is the stacks of the goroutines running a migration.
func migrationStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:goruntime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "engine.(*migration)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// pulledFirst fails the test unless the daemon pulled the first n bytes
// of what the source held (all of it for n < 0), byte for byte.
func (r *lazyRun) pulledFirst(n int) {
	r.t.Helper()
	want, _, _ := r.src.lazy.held()
	if n >= 0 {
		want = want[:n]
	}
	got, err := os.ReadFile(r.pulled)
	if err != nil {
		r.t.Fatalf("the daemon left no pages: %v", err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		r.t.Errorf("the daemon pulled %d bytes, the source held %d: they differ from byte %d (page %d)", len(got), len(want), i, i/pageSize)
	}
}

// frozen is how often the destination froze its copy.
func (f *fakeRuntime) frozen() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.freezes
}

// Post-copy and hybrid that commit: the destination restores lazily, its
// daemon pulls every page (the faults from the source's page server, the
// background request from the destination's own copy) and closes the page
// server, and only then does the source remove its copy.
func TestSourceLazyCommits(t *testing.T) {
	for _, mode := range []string{ModePostcopy, ModeHybrid} {
		t.Run(mode, func(t *testing.T) {
			r := newLazyRun(t, 0)
			rep := r.migrateLazily(mode)
			if !rep.OK {
				t.Fatalf("migration failed at %s: %s", rep.FailedAt, rep.Error)
			}
			// The page server was on the host's loopback (the container
			// shares its network namespace), and the dump ended cleanly.
			if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "listened on the host's loopback") {
				t.Errorf("report warnings %q, want only the one about the host's loopback", rep.Warnings)
			}
			// The dump's CRIU ended before the container went.
			r.calls("freeze", "checkpoint", "release(kill)", "remove")
			if rep.SourceState != "removed" || r.src.state() != "" {
				t.Errorf("report says the source copy is %q, the runtime holds it %q; want removed", rep.SourceState, r.src.state())
			}
			r.returned()
			r.want(counts{prepared: 1, restored: 1, started: 1})
			if ro := r.rt.target(t).restores; len(ro) != 1 || !ro[0].Lazy {
				t.Errorf("restores %+v, want one lazy", ro)
			}
			r.pulledFirst(-1)
			_, faults, background := r.src.lazy.held()
			if rep.PagesFaulted != uint64(faults) || rep.PagesPushed != uint64(background) {
				t.Errorf("report: %d pages faulted, %d pushed; the daemon faulted %d and fetched %d in the background",
					rep.PagesFaulted, rep.PagesPushed, faults, background)
			}
			// Each fault was answered by the source's page server, which
			// the daemon's close ended; the background request from the
			// destination's copy, or, when it came before the push had
			// begun (a loaded machine), by the source too: a request does
			// not wait for a push that has not started (pushed.await).
			served, closed := r.src.lazy.outcome()
			fromCopy := rep.PagesReferenced == uint64(background) && served == faults
			fromSource := rep.PagesReferenced == 0 && served == faults+1
			if !closed || !fromCopy && !fromSource {
				t.Errorf("%d pages came from the destination's copy and the source's page server answered %d requests (closed: %v): want the %d background pages from one and the %d faults from the source, then a close",
					rep.PagesReferenced, served, closed, background, faults)
			}
			if st := r.sourceJournaled(rep); st != journal.Removed {
				t.Errorf("source journal says %q, want %q", st, journal.Removed)
			}
			if st := r.journaled(rep.ID).State; st != journal.Started {
				t.Errorf("destination journal says %q, want %q", st, journal.Started)
			}
			if mode == ModeHybrid && (len(rep.Rounds) < 2 || !rep.Rounds[len(rep.Rounds)-1].Final) {
				t.Errorf("hybrid's rounds end without a frozen one: %+v", rep.Rounds)
			}
			daemonGone(t, r.pulled)
		})
	}
}

// The pull breaks after the commit: the destination's copy runs without
// the memory it lacks, so it is frozen, dropped, and only then is the
// source told; its copy, complete as at the freeze, resumes.
func TestSourceLazyResumesWhenThePullFails(t *testing.T) {
	for _, c := range []struct {
		name      string
		failAfter int // the daemon exits 1 after this many pages
		// breakAfter: the source's page server hangs up after this many
		// requests.
		breakAfter int
		// pulled is how many of the held pages the daemon has, in order.
		pulled int
	}{
		{name: "daemon exits", failAfter: 1, pulled: 1},
		{name: "source page server hangs up", breakAfter: 1, pulled: 1},
	} {
		for _, mode := range []string{ModePostcopy, ModeHybrid} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				var discardedFirst, dumpEndedFirst *bool
				r := newLazyRun(t, c.failAfter, func(r *sourceRun) {
					r.src.lazy.breakAfter = c.breakAfter
					discardedFirst, dumpEndedFirst = r.thawChecks()
				})
				rep := r.migrateLazily(mode)
				if rep.OK || rep.FailedAt != "lazy pages on h2" || !strings.Contains(rep.Error, "the source copy resumes") {
					t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
				}
				r.calls("freeze", "checkpoint", "release", "thaw")
				if rep.SourceState != "resumed" || r.src.state() != "running" {
					t.Errorf("report says %q, the runtime holds it %q; want resumed and running", rep.SourceState, r.src.state())
				}
				if !*discardedFirst || !*dumpEndedFirst {
					t.Errorf("at the source's thaw, the destination's copy was discarded: %v; the dump had ended: %v; want both", *discardedFirst, *dumpEndedFirst)
				}
				r.returned()
				// Discarded (once or more: runtimes' Discard takes a copy
				// already gone as removed).
				if got := r.rt.counts(); got.discarded == 0 || got != (counts{prepared: 1, restored: 1, started: 1, discarded: got.discarded}) {
					t.Errorf("the runtime saw %+v, want the copy prepared, restored, started and discarded", got)
				}
				// Frozen before the daemon let go of its faults.
				if n := r.rt.frozen(); n != 1 {
					t.Errorf("the destination froze its copy %d times, want once", n)
				}
				r.pulledFirst(c.pulled * pageSize)
				if st := r.journaled(rep.ID).State; st != journal.Dropped {
					t.Errorf("destination journal says %q, want %q", st, journal.Dropped)
				}
				if st := r.sourceJournaled(rep); st != journal.Resumed {
					t.Errorf("source journal says %q, want %q", st, journal.Resumed)
				}
				daemonGone(t, r.pulled)
			})
		}
	}
}

// Failures before the commit: a destination that refuses leaves the
// container as it was, never frozen; a lazy dump that fails thaws it; a
// restore that fails thaws it once the destination dropped its copy and
// stopped its daemon and the dump's page server was closed (CRIU must be
// gone before the container thaws).
func TestSourceLazyFailsBeforeTheCommit(t *testing.T) {
	for _, c := range []struct {
		name     string
		change   func(*sourceRun)
		failedAt string // a prefix
		says     string
		calls    []string
		state    string // the report's source state
		dest     counts
		// daemon: the destination started its lazy-pages daemon and
		// attempted the restore.
		daemon bool
	}{
		{
			name:     "destination cannot restore lazily",
			change:   func(r *sourceRun) { r.rt.caps = runtime.Caps{Freeze: true, LazyDump: true, RestoreStopped: true} },
			failedAt: "destination h2 refused", says: "needs a lazy restore",
		},
		{
			name:     "destination refuses",
			change:   func(r *sourceRun) { r.rt.prepareErr = errors.New("a container named web exists here") },
			failedAt: "destination h2 refused", says: "exists here",
			dest: counts{prepared: 1},
		},
		{
			name:     "lazy dump fails",
			change:   func(r *sourceRun) { r.src.checkpointErr = errors.New("criu dump: lazy pages: userfaultfd unavailable") },
			failedAt: "dump on h1", says: "userfaultfd unavailable",
			calls: []string{"freeze", "checkpoint", "thaw"}, state: "resumed",
			dest: counts{prepared: 1, discarded: 1},
		},
		{
			name:     "restore fails",
			change:   func(r *sourceRun) { r.rt.restoreErr = errors.New("criu restore: can't open lazy-pages socket") },
			failedAt: "restore on h2", says: "lazy-pages socket",
			calls: []string{"freeze", "checkpoint", "release", "thaw"}, state: "resumed",
			dest: counts{prepared: 1, restored: 1, discarded: 1}, daemon: true,
		},
	} {
		for _, mode := range []string{ModePostcopy, ModeHybrid} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				var discardedFirst, dumpEndedFirst *bool
				r := newLazyRun(t, 0, c.change, func(r *sourceRun) { discardedFirst, dumpEndedFirst = r.thawChecks() })
				rep := r.migrateLazily(mode)
				if rep.OK || !strings.HasPrefix(rep.FailedAt, c.failedAt) || !strings.Contains(rep.Error, c.says) {
					t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
				}
				r.calls(c.calls...)
				if rep.SourceState != c.state || r.src.state() != "running" {
					t.Errorf("report says %q, the runtime holds it %q; want %q and running", rep.SourceState, r.src.state(), c.state)
				}
				r.returned()
				r.want(c.dest)
				r.allDropped()
				wantJournal := ""
				if c.state == "resumed" {
					wantJournal = journal.Resumed
				}
				if st := r.sourceJournaled(rep); st != wantJournal {
					t.Errorf("source journal says %q, want %q", st, wantJournal)
				}
				if c.daemon {
					// A copy that may have been restored is gone before the
					// source is told.
					if !*discardedFirst || !*dumpEndedFirst {
						t.Errorf("at the source's thaw, the destination's copy was discarded: %v; the dump had ended: %v; want both", *discardedFirst, *dumpEndedFirst)
					}
					daemonGone(t, r.pulled)
					if served, _ := r.src.lazy.outcome(); served != 0 {
						t.Errorf("the source's page server answered %d requests for a copy never restored", served)
					}
				} else if _, err := os.Stat(r.pulled + ".pid"); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a lazy-pages daemon ran for a migration that never restored (%v)", err)
				}
			})
		}
	}
}

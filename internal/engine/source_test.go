package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/procs/procstest"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/transport/transporttest"
	"github.com/ferry-migrate/ferry/internal/vmas"
)

// The source's control flow, end to end without a lab: Source.Migrate
// with a fake runtime holding one container, over an in-memory session to
// the destination harness (harness_test.go). The page stream takes its
// real path: the source's tunnel admits only a CRIU process of its own,
// then the session, then a page server at the destination. A script named
// criu plays CRIU on both ends, so the tunnel's check of who connected
// runs as it does for the real one.

// fakePagesFile is where the fake page server writes what it received.
const fakePagesFile = "pages.fake"

// criuPageStream is what CRIU's page client sends for a dump of pages
// (see internal/pagestream): one PS_IOV_ADD_F header with PE_PRESENT for
// the pages of pagemap id pid from addr, then the pages.
func criuPageStream(pid int, addr uint64, data []byte) []byte {
	const psIOVAddF, pePresent, psTypePID = 6, 1 << 2, 1
	b := make([]byte, 32, 32+len(data))
	binary.LittleEndian.PutUint32(b[0:], pePresent<<16|psIOVAddF)
	binary.LittleEndian.PutUint64(b[8:], uint64(len(data)/pageSize))
	binary.LittleEndian.PutUint64(b[16:], addr)
	binary.LittleEndian.PutUint64(b[24:], uint64(pid)<<8|psTypePID)
	return append(b, data...)
}

// processPages reads the first n pages CRIU would dump of pid (private
// anonymous memory, as pre-copy's rounds read it): contiguous, from one
// address, with the pagemap id they go under.
func processPages(pid, n int) (id int, addr uint64, data []byte, err error) {
	r, err := pages.NewReader([]int{pid})
	if err != nil {
		return 0, 0, nil, err
	}
	errEnough := errors.New("enough")
	_, err = r.Scan(func(p pages.Page) error {
		if len(data) > 0 && p.Key.Addr != addr+uint64(len(data)) {
			data = data[:0] // not contiguous: start again here
		}
		if len(data) == 0 {
			id, addr = int(p.Key.PID), p.Key.Addr
		}
		data = append(data, p.Data...)
		if len(data) == n*pageSize {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		return 0, 0, nil, fmt.Errorf("no %d contiguous pages to dump in pid %d (%v)", n, pid, err)
	}
	return id, addr, data, nil
}

// fakeCRIUScript plays `criu page-server` (it stores the stream) and the
// page client of a dump (it sends FILE and waits briefly for an answer).
// Both end on a builtin: bash would exec an external last command and
// take its name, which the tunnel's check would not recognise. For a
// test that asks (fakeLazyDaemon), the test binary plays `criu lazy-pages`.
const fakeCRIUScript = `#!/bin/bash
case "$1" in
page-server) # page-server --images-dir DIR ... --ps-socket 3 ...
	cat <&3 >"$3/` + fakePagesFile + `"
	exit 0 ;;
lazy-pages) # the test binary plays the daemon (fakecriu_test.go)
	[ -n "$` + lazyDaemonEnv + `" ] && exec "$` + lazyDaemonEnv + `" "$@" ;;
page-client) # page-client HOST PORT FILE
	exec 3<>"/dev/tcp/$2/$3"
	cat "$4" >&3
	read -r -t 0.5 -u 3 || true
	exec 3>&-
	exit 0 ;;
esac
echo "fake criu: unknown command $1" >&2
exit 1
`

// fakeCRIU installs the script as the criu this test's processes find
// first in PATH, and returns its path.
func fakeCRIU(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash (it plays CRIU)")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "criu")
	if err := os.WriteFile(path, []byte(fakeCRIUScript), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv(criu.BinaryEnv, path) // over the host's own CRIU
	return path
}

// fakeSource is a runtime.Runtime at the source holding one running
// container. It records what the engine asks of it, in order, and keeps
// the container's status as a runtime would, so that the engine's check
// of what it reports (resumed, removed) reads the truth.
type fakeSource struct {
	criu string
	// pages is the file the dump's page client sends.
	pages string
	ctr   runtime.Container
	caps  runtime.Caps
	// Errors the runtime's calls return.
	freezeErr, checkpointErr, thawErr error
	// beforeFreeze, when set, runs as the freeze begins: the container's
	// last writes.
	beforeFreeze func()
	// beforeThaw, when set, runs as a thaw begins.
	beforeThaw func()
	// lazy is what a lazy dump leaves here (lazy_source_test.go), and
	// imageBytes how much its images hold besides (0: next to nothing).
	lazy       lazySource
	imageBytes int
	// smaps is what the dump found in its smaps snapshot directory: the
	// PIDs snapshot.
	smaps []string

	mu     sync.Mutex
	status string // "" once removed
	calls  []string
	// removed is what Remove was given.
	removed *runtime.Container
}

func newFakeSource(t *testing.T) *fakeSource {
	return &fakeSource{
		criu:   fakeCRIU(t),
		pages:  filepath.Join(t.TempDir(), "pages.criu"),
		caps:   runtime.Caps{Freeze: true, RestoreStopped: true},
		ctr:    runtime.Container{Runtime: "fake", Name: "web", ID: "web", PID: fakePid, Rootfs: sourceRoot(t)},
		status: "running",
	}
}

func (f *fakeSource) List(context.Context) ([]runtime.Container, error) { return nil, nil }
func (f *fakeSource) Kind() string                                      { return "fake" }
func (f *fakeSource) Caps() runtime.Caps                                { return f.caps }

func (f *fakeSource) called(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeSource) Inspect(_ context.Context, name string) (*runtime.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name != f.ctr.Name || f.status == "" {
		return nil, runtime.ErrNotFound
	}
	c := f.ctr
	c.Status = f.status
	return &c, nil
}

func (f *fakeSource) Freeze(context.Context, *runtime.Container) error {
	f.called("freeze")
	if f.beforeFreeze != nil {
		f.beforeFreeze()
	}
	if f.freezeErr != nil {
		return f.freezeErr
	}
	f.setStatus("paused")
	return nil
}

func (f *fakeSource) Thaw(context.Context, *runtime.Container) error {
	f.called("thaw")
	if f.beforeThaw != nil {
		f.beforeThaw()
	}
	if f.thawErr != nil {
		return f.thawErr
	}
	f.setStatus("running")
	return nil
}

func (f *fakeSource) setStatus(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status = s
}

// Checkpoint is a dump of the frozen container: its pages go to the page
// server CRIU is told of, the rest of the images into ImagesDir.
func (f *fakeSource) Checkpoint(ctx context.Context, _ *runtime.Container, o runtime.CheckpointOptions) (runtime.Dump, error) {
	f.called("checkpoint")
	if f.checkpointErr != nil {
		return nil, f.checkpointErr
	}
	if o.SmapsSnapshot != "" {
		ents, _ := os.ReadDir(o.SmapsSnapshot)
		for _, e := range ents {
			f.smaps = append(f.smaps, e.Name())
		}
	}
	if o.Lazy {
		return f.lazyCheckpoint(ctx, o)
	}
	host, port, err := net.SplitHostPort(o.PageServer)
	if err != nil {
		return nil, err
	}
	// A real process's pages (pre-copy's rounds read them too), or made-up
	// ones for a container with no process.
	id, addr, data := 1, uint64(0x7f0000000000), bytes.Repeat([]byte("page"), 4*pageSize/4)
	if f.ctr.PID != fakePid {
		if id, addr, data, err = processPages(f.ctr.PID, 4); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(f.pages, criuPageStream(id, addr, data), 0o600); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, f.criu, "page-client", host, port, f.pages).CombinedOutput(); err != nil {
		return nil, errors.New("fake criu: " + err.Error() + ": " + string(out))
	}
	if err := os.MkdirAll(o.ImagesDir, 0o700); err != nil {
		return nil, err
	}
	return fakeDump{f}, os.WriteFile(filepath.Join(o.ImagesDir, "inventory.img"), []byte("not a real image"), 0o600)
}

func (f *fakeSource) Remove(_ context.Context, c *runtime.Container) error {
	f.called("remove")
	f.setStatus("")
	f.mu.Lock()
	f.removed = c
	f.mu.Unlock()
	return nil
}

func (f *fakeSource) Prepare(context.Context, *runtime.Container, runtime.PrepareOptions) (runtime.Target, error) {
	return nil, errors.New("fake source: nothing is received here")
}

func (f *fakeSource) record() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeSource) state() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

// fakeDump is a dump that has ended; the container stays frozen (the
// runtime froze it, Caps.Freeze).
type fakeDump struct{ f *fakeSource }

func (d fakeDump) Wait() error { return nil }
func (d fakeDump) Release(_ context.Context, kill bool) error {
	if kill {
		d.f.called("release(kill)")
	} else {
		d.f.called("release")
	}
	return nil
}

// sleeper starts a process whose memory stays as it is (a container's
// process, for the fakes that read memory) and returns its pid. It skips
// the test where this user may not read a child's memory.
func sleeper(t *testing.T) int {
	t.Helper()
	proc := exec.Command("sleep", "60")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })
	if _, _, _, err := processPages(proc.Process.Pid, 1); errors.Is(err, os.ErrPermission) {
		t.Skipf("this user may not read a child's memory (Yama's ptrace_scope?): %v", err)
	}
	return proc.Process.Pid
}

// sourceRun is one migration from a fakeSource at "h1" to the harness's
// destination "h2".
type sourceRun struct {
	*harness
	src *fakeSource
	s   *Source
	sj  *journal.Journal
	// faults are injected into the migration (at both ends, which allow
	// them); progress hears its progress.
	faults   []string
	progress func(Progress)
}

func newSourceRun(t *testing.T, change ...func(*sourceRun)) *sourceRun {
	t.Helper()
	r := &sourceRun{harness: newHarness(t), src: newFakeSource(t)}
	state := filepath.Join(t.TempDir(), "state")
	sj, err := journal.Open(filepath.Join(state, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	r.sj = sj
	r.s = &Source{
		Host:     host.Config{Name: "h1", StateDir: state},
		Runtimes: runtime.Set{"fake": r.src},
		Journal:  sj,
		Dial: func(context.Context, string) (*transport.Session, error) {
			return r.harness.src, nil
		},
	}
	for _, c := range change {
		c(r)
	}
	return r
}

// migrate moves "web" to h2 in mode; precopy, if given, are its options.
func (r *sourceRun) migrate(mode string, precopy ...PrecopyOptions) Report {
	r.t.Helper()
	req := Request{Container: "web", To: "h2@127.0.0.1:1", Mode: mode, Runtime: "fake", Faults: r.faults}
	if len(precopy) > 0 {
		req.Precopy = precopy[0]
	}
	r.s.AllowFaults, r.d.AllowFaults = len(r.faults) > 0, len(r.faults) > 0
	return r.s.Migrate(context.Background(), req, r.progress)
}

// pagesArrived fails the test unless the destination's page server got
// what the source's CRIU sent, byte for byte.
func (r *sourceRun) pagesArrived() {
	r.t.Helper()
	want, err := os.ReadFile(r.src.pages)
	if err != nil {
		r.t.Fatal(err)
	}
	if got := r.rt.target(r.t).pages; got != string(want) {
		r.t.Errorf("the destination's page server got %d bytes, not the %d the dump sent", len(got), len(want))
	}
}

// calls fails the test unless the source's runtime saw exactly want.
func (r *sourceRun) calls(want ...string) {
	r.t.Helper()
	if got := r.src.record(); !slices.Equal(got, want) {
		r.t.Errorf("the source's runtime saw %q, want %q", got, want)
	}
}

// sourceJournaled returns the source journal's last state for the run.
func (r *sourceRun) sourceJournaled(rep Report) string {
	r.t.Helper()
	e, ok, err := r.sj.Get(rep.ID)
	if err != nil {
		r.t.Fatal(err)
	}
	if !ok {
		return ""
	}
	return e.State
}

func TestSourceColdCommits(t *testing.T) {
	r := newSourceRun(t)
	// Written after the live sync: the frozen sync finds it by the watch.
	r.src.beforeFreeze = func() {
		if err := os.WriteFile(filepath.Join(r.src.ctr.Rootfs, "etc", "written-late"), []byte("late\n"), 0o644); err != nil {
			t.Error(err)
		}
	}
	rep := r.migrate(ModeCold)
	if !rep.OK {
		t.Fatalf("migration failed at %s: %s", rep.FailedAt, rep.Error)
	}
	r.calls("freeze", "checkpoint", "release(kill)", "remove")
	if rep.SourceState != "removed" || r.src.state() != "" {
		t.Errorf("report says the source copy is %q, the runtime holds it %q; want removed", rep.SourceState, r.src.state())
	}
	r.returned()
	r.want(counts{prepared: 1, restored: 1, started: 1})
	r.pagesArrived()
	for file, want := range map[string]string{"hostname": "web\n", "written-late": "late\n"} {
		if b, err := os.ReadFile(filepath.Join(r.rt.target(t).dir, "etc", file)); err != nil || string(b) != want {
			t.Errorf("the destination's etc/%s: %q, %v; want %q", file, b, err, want)
		}
	}
	if rep.FrozenRootfsScan != "2 changed paths" { // etc/written-late, and etc's mtime
		t.Errorf("frozen rootfs scan: %q, want the two changed paths", rep.FrozenRootfsScan)
	}
	// The live sync sent the tree (etc and etc/hostname at least), the
	// frozen pass the late file: a tar stream of 512-byte blocks each.
	if rep.RootfsEntries < 2 || rep.RootfsBytes < 1024 || rep.FrozenRootfsBytes < 1024 {
		t.Errorf("root filesystem deltas: live %d entries, %d bytes; frozen %d bytes", rep.RootfsEntries, rep.RootfsBytes, rep.FrozenRootfsBytes)
	}
	if st := r.sourceJournaled(rep); st != journal.Removed {
		t.Errorf("source journal says %q, want %q", st, journal.Removed)
	}
	// Restored stopped (Caps.RestoreStopped), started at the commit.
	if st := r.journaled(rep.ID).State; st != journal.Started {
		t.Errorf("destination journal says %q, want %q", st, journal.Started)
	}
	if rep.DowntimeMs <= 0 || !slices.ContainsFunc(rep.Phases, func(p PhaseSpan) bool { return p.Name == "dump" }) {
		t.Errorf("report without downtime or dump phase: %+v", rep)
	}
}

// A restore that fails at the destination: the destination discards its
// copy and says so, then the source thaws its own and reports it resumed,
// having checked.
func TestSourceResumesWhenRestoreFails(t *testing.T) {
	r := newSourceRun(t, func(r *sourceRun) { r.rt.restoreErr = errors.New("criu restore: no space left on device") })
	rep := r.migrate(ModeCold)
	if rep.OK || !strings.Contains(rep.Error, "no space left") || !strings.HasPrefix(rep.FailedAt, "restore on h2") {
		t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
	}
	r.calls("freeze", "checkpoint", "release", "thaw")
	if rep.SourceState != "resumed" || r.src.state() != "running" {
		t.Errorf("report says %q, the runtime holds it %q; want resumed and running", rep.SourceState, r.src.state())
	}
	r.returned()
	r.want(counts{prepared: 1, restored: 1, discarded: 1})
	r.allDropped()
	if st := r.sourceJournaled(rep); st != journal.Resumed {
		t.Errorf("source journal says %q, want %q", st, journal.Resumed)
	}
}

// A thaw that does not take: the report must not say resumed.
func TestSourceReportsAThawThatFailed(t *testing.T) {
	r := newSourceRun(t, func(r *sourceRun) {
		r.rt.restoreErr = errors.New("restore failed")
		r.src.thawErr = errors.New("runc resume: cgroup frozen")
	})
	rep := r.migrate(ModeCold)
	if rep.OK || rep.SourceState != "frozen" || !strings.Contains(rep.Error, "did not resume") || !strings.Contains(rep.Error, "thaw the fake container") {
		t.Fatalf("report: ok %v, source %q: %s", rep.OK, rep.SourceState, rep.Error)
	}
	r.returned()
}

// The dump fails: the destination drops what it prepared, the source thaws.
func TestSourceResumesWhenDumpFails(t *testing.T) {
	r := newSourceRun(t, func(r *sourceRun) { r.src.checkpointErr = errors.New("criu dump: can't dump ghost file") })
	rep := r.migrate(ModeCold)
	if rep.OK || !strings.Contains(rep.Error, "ghost file") || rep.FailedAt != "dump on h1" {
		t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
	}
	r.calls("freeze", "checkpoint", "thaw")
	if rep.SourceState != "resumed" || r.src.state() != "running" {
		t.Errorf("report says %q, the runtime holds it %q", rep.SourceState, r.src.state())
	}
	r.returned()
	r.want(counts{prepared: 1, discarded: 1})
	r.allDropped()
}

// The dump fails and the container's processes died with it (a CRIU
// killed while its code ran inside them): the source cannot resume, and
// the report and the journal say lost, not resumed, nor frozen with a
// hint to thaw it. The runtime says so (stopped), or still calls the
// container running while its init dies (a zombie here: a core being
// written looks the same to it).
func TestSourceReportsACopyThatDied(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, r *sourceRun)
	}{
		{"stopped", func(_ *testing.T, r *sourceRun) {
			r.src.beforeThaw = func() { r.src.setStatus("stopped") }
			r.src.thawErr = errors.New("runc resume: container not paused")
		}},
		{"dying", func(t *testing.T, r *sourceRun) {
			r.src.ctr.PID = procstest.Zombie(t)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newSourceRun(t, func(r *sourceRun) {
				r.src.checkpointErr = errors.New("runc checkpoint: criu failed: signal: killed")
				c.setup(t, r)
			})
			rep := r.migrate(ModeCold)
			if rep.OK || rep.SourceState != "lost" || !strings.Contains(rep.Error, "runs nowhere") || !strings.Contains(rep.Error, "start the fake container") || strings.Contains(rep.Error, "thaw") {
				t.Fatalf("report: ok %v, source %q: %s", rep.OK, rep.SourceState, rep.Error)
			}
			r.returned()
			r.want(counts{prepared: 1, discarded: 1})
			r.allDropped()
			if st := r.sourceJournaled(rep); st != journal.Lost {
				t.Errorf("source journal says %q, want %q", st, journal.Lost)
			}
		})
	}
}

// A destination that refuses: nothing is frozen.
func TestSourceRefusedBeforeFreeze(t *testing.T) {
	r := newSourceRun(t, func(r *sourceRun) { r.rt.prepareErr = errors.New("a container named web exists here") })
	rep := r.migrate(ModeCold)
	if rep.OK || !strings.Contains(rep.Error, "exists here") || !strings.HasPrefix(rep.FailedAt, "destination h2 refused") {
		t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
	}
	r.calls()
	if rep.SourceState != "" || r.src.state() != "running" {
		t.Errorf("report says %q, the runtime holds it %q; want untouched and running", rep.SourceState, r.src.state())
	}
	if st := r.sourceJournaled(rep); st != "" {
		t.Errorf("source journal holds %q for a migration that froze nothing", st)
	}
}

// A freeze that fails: no dump, no thaw, the container as it was.
func TestSourceFreezeFails(t *testing.T) {
	r := newSourceRun(t, func(r *sourceRun) { r.src.freezeErr = errors.New("freezer: device busy") })
	rep := r.migrate(ModeCold)
	if rep.OK || rep.FailedAt != "freeze on h1" {
		t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
	}
	r.calls("freeze")
	r.returned()
	r.want(counts{prepared: 1, discarded: 1})
}

// A technique the runtime cannot do is refused before anything is frozen
// or sent: no session is even opened.
func TestSourceRefusesWhatTheRuntimeCannotDo(t *testing.T) {
	dialled := false
	r := newSourceRun(t, func(r *sourceRun) {
		r.s.Dial = func(context.Context, string) (*transport.Session, error) {
			dialled = true
			return nil, errors.New("not to be dialled")
		}
	})
	for _, mode := range []string{ModePostcopy, ModeHybrid} {
		rep := r.migrate(mode)
		if rep.OK || !strings.HasPrefix(rep.FailedAt, "prepare on h1") {
			t.Errorf("%s: report ok %v at %q: %s", mode, rep.OK, rep.FailedAt, rep.Error)
		}
	}
	if dialled {
		t.Error("the source dialled the destination for a technique it had to refuse")
	}
	r.calls()
}

// The destination goes silent after it restored the container (its agent
// killed there): the source cannot know whether the container runs there,
// so it must not thaw its own; the report and the journal say in doubt.
func TestSourceStaysFrozenWhenTheDestinationGoesSilent(t *testing.T) {
	r := newSourceRun(t)
	r.rt.afterRestore = func() { r.harness.src.Close() }
	rep := r.migrate(ModeCold)
	if rep.OK || rep.SourceState != "frozen" || rep.InDoubtID != rep.ID || !strings.Contains(rep.Error, "may run the container") {
		t.Fatalf("report: ok %v, source %q, in doubt %q: %s", rep.OK, rep.SourceState, rep.InDoubtID, rep.Error)
	}
	r.calls("freeze", "checkpoint")
	if r.src.state() != "paused" {
		t.Errorf("the source copy is %q, want paused", r.src.state())
	}
	if st := r.sourceJournaled(rep); st != journal.InDoubt {
		t.Errorf("source journal says %q, want %q", st, journal.InDoubt)
	}
}

// The destination goes silent after the commit reached it (it started
// the container, then its agent died): the container runs there, so the
// source must neither thaw nor remove its copy on its own; it stays
// frozen in doubt until the destination says what it holds.
func TestSourceStaysFrozenWhenTheCommitGoesUnanswered(t *testing.T) {
	r := newSourceRun(t)
	r.rt.afterStart = func() { r.harness.src.Close() }
	rep := r.migrate(ModeCold)
	if rep.OK || rep.SourceState != "frozen" || rep.FailedAt != "commit" || rep.InDoubtID != rep.ID {
		t.Fatalf("report: ok %v at %q, source %q, in doubt %q: %s", rep.OK, rep.FailedAt, rep.SourceState, rep.InDoubtID, rep.Error)
	}
	r.calls("freeze", "checkpoint")
	if st := r.sourceJournaled(rep); st != journal.InDoubt {
		t.Errorf("source journal says %q, want %q", st, journal.InDoubt)
	}
}

// Pre-copy with the dump switchover: rounds read a real process's memory
// while it runs, the final dump's page stream is deduplicated against
// them and expanded back at the destination, where CRIU's page server
// must see exactly what the dump sent.
func TestSourcePrecopyCommits(t *testing.T) {
	pid := sleeper(t)
	r := newSourceRun(t, func(r *sourceRun) { r.src.ctr.PID = pid })
	rep := r.migrate(ModePrecopy, PrecopyOptions{Engine: PrecopyContent, MaxRounds: 2})
	if !rep.OK {
		t.Fatalf("migration failed at %s: %s", rep.FailedAt, rep.Error)
	}
	if len(rep.Rounds) == 0 || rep.Rounds[0].Pages == 0 {
		t.Errorf("no live round read the process's memory: %+v", rep.Rounds)
	}
	// Where the kernel tracks writes, the second round read almost
	// nothing: the sleeper writes nothing.
	if err := dirty.Available(); err != nil {
		t.Logf("no write tracking here (%v): the rounds hashed all memory", err)
	} else {
		if !strings.HasPrefix(rep.WriteTracking, "userfaultfd write protection (1 of 1") {
			t.Errorf("write tracking: %q", rep.WriteTracking)
		}
		// (Waking it to make the userfaultfd may write a page of its stack.)
		if len(rep.Rounds) != 2 || rep.Rounds[1].UnchangedPages+2 < rep.Rounds[0].Pages {
			t.Errorf("round 1 read pages the kernel saw unwritten: %+v", rep.Rounds)
		}
	}
	// The dump's pages were all read by the rounds, unchanged: each goes
	// by reference, and the destination puts it back from its copy.
	if rep.PagesReferenced != 4 {
		t.Errorf("%d of the dump's 4 pages went by reference, want all", rep.PagesReferenced)
	}
	r.calls("freeze", "checkpoint", "release(kill)", "remove")
	r.returned()
	r.want(counts{prepared: 1, restored: 1, started: 1})
	r.pagesArrived()
}

// A migration waiting in its line (a drain's) freezes nothing while it
// waits: cancelled there, it leaves the container untouched and the
// destination's prepared copy gone; let through, it commits, its wait a
// phase of its own. Each case is a session of its own.
func TestSourceWaitsInLine(t *testing.T) {
	spec := &LineSpec{Name: "drain-1"}
	req := Request{Container: "web", To: "h2@127.0.0.1:1", Mode: ModeCold, Runtime: "fake", Line: spec}

	t.Run("cancelled", func(t *testing.T) {
		r := newSourceRun(t, func(r *sourceRun) { r.s.Lines = &Lines{} })
		ahead := r.s.Lines.join(spec) // a migration before it, never done
		defer ahead.leave()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		rep := r.s.Migrate(ctx, req, func(p Progress) {
			if p.Phase == "queued" {
				cancel() // the request withdrawn while it waits
			}
		})
		if rep.OK || rep.FailedAt != "queued" || !strings.Contains(rep.Error, "cancelled") {
			t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
		}
		r.calls()
		if rep.SourceState != "" || r.src.state() != "running" || rep.FrozenMs != 0 {
			t.Errorf("report says %q (frozen %.0f ms), the runtime holds it %q; want untouched and running", rep.SourceState, rep.FrozenMs, r.src.state())
		}
		if st := r.sourceJournaled(rep); st != "" {
			t.Errorf("source journal holds %q for a migration that froze nothing", st)
		}
		r.returned()
		r.want(counts{prepared: 1, discarded: 1})
	})

	t.Run("let through", func(t *testing.T) {
		r := newSourceRun(t, func(r *sourceRun) { r.s.Lines = &Lines{} })
		ahead := r.s.Lines.join(spec)
		done := make(chan Report, 1)
		go func() { done <- r.s.Migrate(context.Background(), req, nil) }()
		select {
		case rep := <-done:
			t.Fatalf("ran past the migration ahead of it: %+v", rep)
		case <-time.After(300 * time.Millisecond):
		}
		r.calls() // nothing frozen while it waits
		ahead.leave()
		var rep Report
		select {
		case rep = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("never got its turn")
		}
		if !rep.OK {
			t.Fatalf("migration failed at %s: %s", rep.FailedAt, rep.Error)
		}
		r.calls("freeze", "checkpoint", "release(kill)", "remove")
		i := slices.IndexFunc(rep.Phases, func(p PhaseSpan) bool { return p.Name == "queued" })
		j := slices.IndexFunc(rep.Phases, func(p PhaseSpan) bool { return p.Name == "freeze" })
		if i < 0 || j < i || rep.Phases[i].EndMs-rep.Phases[i].StartMs < 250 {
			t.Errorf("phases %+v: want a queued phase of about 300 ms before the freeze", rep.Phases)
		}
		if len(r.s.Lines.m) != 0 {
			t.Errorf("lines left behind: %v", r.s.Lines.m)
		}
	})
}

// Where the runtime's dump reads a snapshot of the container's smaps, one
// is taken before the freeze and checked before the commit: unchanged, the
// migration commits; a flag changed over a whole mapping between the
// snapshot and the freeze (which the dump could not see) makes the
// migration fail before the commit, the source resumed.
func TestSourceChecksTheSmapsSnapshot(t *testing.T) {
	for _, changed := range []bool{false, true} {
		t.Run(fmt.Sprintf("changed=%v", changed), func(t *testing.T) {
			pid, ask := procstest.StartMapper(t)
			reader, err := vmas.NewReader()
			if err != nil {
				t.Skipf("no BPF task_vma iterator here: %v", err)
			}
			defer reader.Close()
			r := newSourceRun(t, func(r *sourceRun) {
				r.s.VMAs = reader
				r.src.caps.SmapsSnapshot = true
				r.src.ctr.PID = pid
				if changed {
					r.src.beforeFreeze = func() { ask("dontdump") }
				}
			})
			rep := r.migrate(ModeCold)
			if !slices.Equal(r.src.smaps, []string{strconv.Itoa(pid)}) {
				t.Errorf("the dump found snapshots of %q, want the container's process %d", r.src.smaps, pid)
			}
			r.returned()
			if !changed {
				if !rep.OK {
					t.Fatalf("migration failed at %s: %s", rep.FailedAt, rep.Error)
				}
				r.calls("freeze", "checkpoint", "release(kill)", "remove")
				return
			}
			if rep.OK || rep.FailedAt != "dump on h1" || !strings.Contains(rep.Error, "changed the flags") {
				t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
			}
			r.calls("freeze", "checkpoint", "release", "thaw")
			if rep.SourceState != "resumed" || r.src.state() != "running" {
				t.Errorf("report says %q, the runtime holds it %q; want resumed and running", rep.SourceState, r.src.state())
			}
			r.want(counts{prepared: 1, restored: 1, discarded: 1})
			r.allDropped()
		})
	}
}

// The switchover asks for the restore without waiting for the
// destination's word on what it sent frozen beside the memory-less dump
// (pendingAcks). A destination that refuses that state (here its frozen
// root filesystem sync) never restores; the source hears why and
// resumes. Over a far link too, where the restore request is on its way
// before the refusal comes back.
func TestSourceResumesWhenTheFrozenStateIsRefused(t *testing.T) {
	for _, c := range switchoverModes {
		for _, oneWay := range []time.Duration{0, 20 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/rtt=%v", c.name, 2*oneWay), func(t *testing.T) {
				r := newLazyRun(t, 0, c.set, func(r *sourceRun) {
					r.faults = []string{fault.RootfsFinal}
					r.reconnect(oneWay)
				})
				rep := r.migrateLazily(c.mode)
				if rep.OK || !strings.HasPrefix(rep.FailedAt, "rootfs sync (frozen)") || !strings.Contains(rep.Error, "frozen rootfs sync refused") {
					t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
				}
				r.calls("freeze", "checkpoint", "release", "thaw")
				if rep.SourceState != "resumed" || r.src.state() != "running" {
					t.Errorf("report says %q, the runtime holds it %q; want resumed and running", rep.SourceState, r.src.state())
				}
				r.returned()
				r.want(counts{prepared: 1, discarded: 1})
				r.allDropped()
				if st := r.sourceJournaled(rep); st != journal.Resumed {
					t.Errorf("source journal says %q, want %q", st, journal.Resumed)
				}
			})
		}
	}
}

// The frozen root filesystem sync sends its delta at once, from what the
// live sync left at the destination, without waiting for the destination
// to describe its copy: what changed after the live sync (a file written,
// one removed) arrives as it is at the freeze, in every mode, over a near
// link and a far one.
func TestSourceFrozenRootfsArrives(t *testing.T) {
	for _, c := range switchoverModes {
		for _, oneWay := range []time.Duration{0, 20 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/rtt=%v", c.name, 2*oneWay), func(t *testing.T) {
				r := newLazyRun(t, 0, c.set, func(r *sourceRun) { r.reconnect(oneWay) })
				etc := filepath.Join(r.src.ctr.Rootfs, "etc")
				r.src.beforeFreeze = func() {
					if err := os.WriteFile(filepath.Join(etc, "written-late"), []byte("late\n"), 0o644); err != nil {
						t.Error(err)
					}
					if err := os.Remove(filepath.Join(etc, "hostname")); err != nil {
						t.Error(err)
					}
				}
				rep := r.migrateLazily(c.mode)
				if !rep.OK {
					t.Fatalf("migration failed at %s: %s", rep.FailedAt, rep.Error)
				}
				r.returned()
				there := filepath.Join(r.rt.target(t).dir, "etc")
				if b, err := os.ReadFile(filepath.Join(there, "written-late")); err != nil || string(b) != "late\n" {
					t.Errorf("the destination's etc/written-late: %q, %v", b, err)
				}
				if _, err := os.Stat(filepath.Join(there, "hostname")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("etc/hostname, removed before the freeze, is at the destination (%v)", err)
				}
				if rep.FrozenRootfsBytes == 0 || !strings.HasSuffix(rep.FrozenRootfsScan, "changed paths") {
					t.Errorf("frozen rootfs sync: %d bytes, scan %q", rep.FrozenRootfsBytes, rep.FrozenRootfsScan)
				}
			})
		}
	}
}

// The commit still follows the destination's answer to the restore
// request, now sent right behind the frozen state: a restore that fails
// there is never committed (the copy never started), and the source
// resumes once the destination dropped its copy. Over a far link, where
// the acknowledgements of that state are still on their way as the
// restore is asked for.
func TestSourceNeverCommitsAFailedRestore(t *testing.T) {
	for _, c := range switchoverModes {
		t.Run(c.name, func(t *testing.T) {
			var discardedFirst *bool
			r := newLazyRun(t, 0, c.set, func(r *sourceRun) {
				r.rt.restoreErr = errors.New("criu restore: no space left on device")
				discardedFirst, _ = r.thawChecks()
				r.reconnect(20 * time.Millisecond)
			})
			rep := r.migrateLazily(c.mode)
			if rep.OK || !strings.HasPrefix(rep.FailedAt, "restore on h2") || !strings.Contains(rep.Error, "no space left") {
				t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
			}
			r.calls("freeze", "checkpoint", "release", "thaw")
			if rep.SourceState != "resumed" || r.src.state() != "running" || !*discardedFirst {
				t.Errorf("report says %q, the runtime holds it %q, the destination's copy discarded before the thaw: %v; want resumed, running, true", rep.SourceState, r.src.state(), *discardedFirst)
			}
			r.returned()
			r.want(counts{prepared: 1, restored: 1, discarded: 1})
			r.allDropped()
			if st := r.sourceJournaled(rep); st != journal.Resumed {
				t.Errorf("source journal says %q, want %q (never %q)", st, journal.Resumed, journal.CommitSent)
			}
		})
	}
}

// The destination dies (its session gone) once the source asked for the
// restore, before the state sent frozen reached it: where the source no
// longer waits for that state's acknowledgement first. Asked to restore,
// the destination may have restored as far as the source knows, so the
// source stays frozen, in doubt, never thawed nor removed; the destination
// restored nothing and dropped its copy, which is what it answers the
// source's question (Destination.Answer): the source's agent then resumes
// its copy (agent.settle).
func TestSourceInDoubtWhenTheDestinationDiesAsTheRestoreIsAsked(t *testing.T) {
	for _, c := range switchoverModes {
		t.Run(c.name, func(t *testing.T) {
			var once sync.Once
			r := newLazyRun(t, 0, c.set, func(r *sourceRun) {
				r.reconnect(100 * time.Millisecond) // the frozen state is on its way for 100 ms
				r.progress = func(p Progress) {
					if p.Phase == string(phaseRestore) {
						once.Do(func() { r.harness.dst.Close() })
					}
				}
			})
			rep := r.migrateLazily(c.mode)
			if rep.OK || rep.SourceState != "frozen" || rep.InDoubtID != rep.ID || !strings.HasPrefix(rep.FailedAt, "restore") {
				t.Fatalf("report: ok %v at %q, source %q, in doubt %q: %s", rep.OK, rep.FailedAt, rep.SourceState, rep.InDoubtID, rep.Error)
			}
			r.calls("freeze", "checkpoint")
			if r.src.state() != "paused" {
				t.Errorf("the source copy is %q, want paused", r.src.state())
			}
			if st := r.sourceJournaled(rep); st != journal.InDoubt {
				t.Errorf("source journal says %q, want %q", st, journal.InDoubt)
			}
			r.returned()
			r.want(counts{prepared: 1, discarded: 1})
			if got := r.askDestination(rep.ID); got != journal.Dropped {
				t.Errorf("the destination answers the source's question with %q, want %q (the source resumes on it)", got, journal.Dropped)
			}
		})
	}
}

// askDestination asks the destination what became of migration id, as
// the source's agent does to settle one in doubt, over a session of its
// own.
func (r *sourceRun) askDestination(id string) string {
	r.t.Helper()
	src, dst := transporttest.Pipe(r.t, "h1", "h2")
	go func() {
		if ch, err := dst.Accept(); err == nil {
			r.d.Answer(ch, "h1")
		}
	}()
	ch, err := src.Open(ChanQuery)
	if err != nil {
		r.t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Send(Query{ID: id}); err != nil {
		r.t.Fatal(err)
	}
	var a QueryAnswer
	if err := ch.Recv(&a); err != nil {
		r.t.Fatalf("the destination's answer: %v", err)
	}
	return a.State
}

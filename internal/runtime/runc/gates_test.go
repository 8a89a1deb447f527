package runc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	driver "github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// The gate's FIFO as CRIU meets it: a reader that opens the file by path
// and reads lines to the end (CRIU's parse_config: fopen, getline).
func readLikeCRIU(path string) <-chan string {
	out := make(chan string, 1)
	go func() {
		b, _ := os.ReadFile(path)
		out <- string(b)
	}()
	return out
}

// Whatever ends the gate but Go leaves CRIU the line naming an images
// directory that does not exist, first: closed before the reader came, the
// gate's leftover is failed by failLeftGate, and the path is a plain file
// again.
func TestGateFailsUnlessOpened(t *testing.T) {
	dir := t.TempDir()
	path, never := filepath.Join(dir, "criu.conf"), filepath.Join(dir, "gate-closed")
	if err := driver.LeaveStopped(path); err != nil {
		t.Fatal(err)
	}
	f, err := openGate(path, never)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("criu.conf is not the gate: %v, %v", st, err)
	}
	got := readLikeCRIU(path)
	if !drained(f, nil, 5*time.Second) {
		t.Fatal("the reader never took the gate's first line")
	}
	f.Close() // the agent dies
	if s := <-got; s != "images-dir "+never+"\n" {
		t.Fatalf("CRIU read %q", s)
	}

	// An agent that died before CRIU opened the gate: CRIU waits for a
	// writer, which failLeftGate is.
	f, err = openGate(path, never)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	got = readLikeCRIU(path)
	time.Sleep(20 * time.Millisecond) // the reader waits in open
	failLeftGate(path, never)
	select {
	case s := <-got:
		if s != "images-dir "+never+"\n" {
			t.Fatalf("CRIU read %q from a left gate", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a reader waiting at a left gate was never answered")
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "leave-stopped\n" {
		t.Fatalf("after failLeftGate criu.conf holds %q, %v", b, err)
	}
	failLeftGate(path, never) // a plain file: left as it is
	if b, _ := os.ReadFile(path); string(b) != "leave-stopped\n" {
		t.Fatalf("failLeftGate changed a plain file: %q", b)
	}
}

func TestSameStdio(t *testing.T) {
	null := []byte(`["/dev/null","/dev/null","/dev/null"]`)
	for _, c := range []struct {
		b    string
		same bool
	}{
		{`["/dev/null", "/dev/null", "/dev/null"]`, true},
		{`["/dev/null","pipe:[7]","/dev/null"]`, false},
		{`["/dev/null","/dev/null"]`, false},
		{``, false},
	} {
		if got := sameStdio(null, []byte(c.b)); got != c.same {
			t.Errorf("sameStdio(%s) = %v", c.b, got)
		}
	}
}

// gateHosts is a source and a destination runc runtime, each with its own
// runc root and cgroup parent, and a container at the source whose init
// counts in /c.
type gateHosts struct {
	src, dst *Runtime
	srcCg    string
	rootfs   string // the source container's root, copied to targets
	c        *runtime.Container
}

func requireRuncCRIU(t *testing.T) {
	t.Helper()
	testroot.Require(t, "skipped: needs root (runc, CRIU)")
	for _, tool := range []string{"runc", "criu"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipped: %s not found (make setup)", tool)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("skipped: needs /bin/busybox (busybox-static)")
	}
}

func newGateHosts(t *testing.T) *gateHosts {
	return newGateHostsRunning(t, countScript)
}

// countScript counts into /c, 20 times a second.
const countScript = "i=0; while true; do i=$((i+1)); echo $i > /c.new; mv /c.new /c; sleep 0.05; done"

// newGateHostsRunning is newGateHosts with the container running script,
// which must count into /c as countScript does.
func newGateHostsRunning(t *testing.T, script string) *gateHosts {
	requireRuncCRIU(t)
	dir := t.TempDir()
	tag := fmt.Sprintf("ferry-gatetest-%d", os.Getpid())
	h := &gateHosts{
		src:   &Runtime{Host: driver.Host{Root: filepath.Join(dir, "src-root")}},
		dst:   &Runtime{Host: driver.Host{Root: filepath.Join(dir, "dst-root")}, BundleRoot: filepath.Join(dir, "bundles"), CgroupParent: tag + "-dst"},
		srcCg: "/" + tag + "-src/gated",
	}
	bundle := filepath.Join(dir, "src-bundle")
	h.rootfs = filepath.Join(bundle, "rootfs")
	busyboxRoot(t, h.rootfs, "/bin/busybox")
	spec := driver.NewSpec(driver.SpecOptions{CgroupsPath: h.srcCg, Args: []string{"/bin/busybox", "sh", "-c", script}})
	if err := driver.WriteSpec(bundle, spec); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		_ = h.src.Delete(ctx, "gated")
		_ = h.dst.Delete(ctx, "gated")
		_ = cgroups.Destroy(cgroups.Root, h.srcCg)
		_ = cgroups.Destroy(cgroups.Root, "/"+h.dst.CgroupParent+"/gated")
		for _, p := range []string{filepath.Dir(h.srcCg), "/" + h.dst.CgroupParent} {
			_ = cgroups.Destroy(cgroups.Root, p)
		}
	})
	if err := h.src.Run(ctx, "gated", bundle, filepath.Join(dir, "src.log")); err != nil {
		t.Fatal(err)
	}
	// Counting before a test dumps it: a copy frozen before its first
	// write has no /c for the destination's root (prepare).
	if err := waitFor(func() bool { _, err := os.Stat(filepath.Join(h.rootfs, "c")); return err == nil }); err != nil {
		t.Fatal("the container never counted into /c")
	}
	c, err := h.src.Inspect(ctx, "gated")
	if err != nil {
		t.Fatal(err)
	}
	if c.Meta[stdioMeta] == nil {
		t.Fatal("Inspect did not record the container's standard descriptors")
	}
	h.c = c
	return h
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// dump freezes the source container and dumps it below dir, leaving it
// frozen, and returns the images directory.
func (h *gateHosts) dump(t *testing.T, dir string) string {
	t.Helper()
	ctx := context.Background()
	if err := h.src.Freeze(ctx, h.c); err != nil {
		t.Fatal(err)
	}
	o := dumpDirs(t, dir)
	d, err := h.src.Checkpoint(ctx, h.c, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(); err != nil {
		t.Fatal(err)
	}
	return o.ImagesDir
}

// prepare makes a target at the destination with the source's root, and
// the options of a restore with work as its work directory.
func (h *gateHosts) prepare(t *testing.T, work string) (*target, runtime.RestoreOptions) {
	t.Helper()
	tg, err := h.dst.Prepare(context.Background(), h.c, runtime.PrepareOptions{WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	root := tg.RootfsDir()
	if err := os.Chmod(root, 0o755); err != nil { // as the root's sync leaves it
		t.Fatal(err)
	}
	busyboxRoot(t, root, filepath.Join(h.rootfs, "bin", "busybox"))
	copyFile(t, filepath.Join(h.rootfs, "c"), filepath.Join(root, "c"))
	o := runtime.RestoreOptions{ImagesDir: filepath.Join(work, "images"), WorkDir: work}
	if err := os.MkdirAll(o.ImagesDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return tg.(*target), o
}

// busyboxRoot lays out a container root with busybox (copied from
// busybox) and the mount points its spec needs.
func busyboxRoot(t *testing.T, root, busybox string) {
	t.Helper()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, busybox, filepath.Join(root, "bin", "busybox"))
}

// dumpDirs makes a dump's images and work directories below dir.
func dumpDirs(t *testing.T, dir string) runtime.CheckpointOptions {
	t.Helper()
	o := runtime.CheckpointOptions{ImagesDir: filepath.Join(dir, "images"), WorkDir: filepath.Join(dir, "work")}
	for _, d := range []string{o.ImagesDir, o.WorkDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// copyImages puts the dump's images into the directory the early restore
// waits on, as they arrive from the source.
func copyImages(t *testing.T, from, to string) {
	t.Helper()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			copyFile(t, filepath.Join(from, e.Name()), filepath.Join(to, e.Name()))
		}
	}
}

// atGate waits until CRIU holds the gate open, having read its first line.
func atGate(t *testing.T, r runtime.Restoring) *restoreGate {
	t.Helper()
	g := r.(*restoreGate)
	if !drained(g.fifo, g.done, 20*time.Second) {
		t.Fatalf("CRIU never came to the gate (runc exited: %v)", g.err)
	}
	return g
}

// restoring says what of the restore exists: the CRIU processes below
// this test's (runc's), and whether runc knows the container.
func restoring(t *testing.T, rt *Runtime) (criuPids []int, known bool) {
	t.Helper()
	_, err := rt.State(context.Background(), "gated")
	return procs.Descendants(os.Getpid(), "criu"), err == nil
}

// noneLeft checks the target holds nothing: no container in runc's root,
// no mount below its bundle, criu.conf a plain file.
func noneLeft(t *testing.T, tg *target) {
	t.Helper()
	if _, err := tg.r.State(context.Background(), "gated"); err == nil {
		t.Error("runc knows the container after a failed restore")
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(tg.r.Root)) {
		t.Errorf("mounts left below runc's root %s", tg.r.Root)
	}
	if st, err := os.Lstat(tg.criuConf()); err != nil || !st.Mode().IsRegular() {
		t.Errorf("criu.conf after the gate: %v, %v", st, err)
	}
}

// The early restore waits at its gate: CRIU has started, runc knows no
// container, nothing runs; Go restores it stopped from the images that
// arrived meanwhile, and Start lets it count on from where it was.
func TestEarlyRestore(t *testing.T) {
	h := newGateHosts(t)
	dir := t.TempDir()
	dump := h.dump(t, filepath.Join(dir, "dump"))
	was, _ := os.ReadFile(filepath.Join(h.rootfs, "c"))
	work := filepath.Join(dir, "work")
	tg, o := h.prepare(t, work)
	r, err := tg.StartRestore(o)
	if err != nil {
		t.Fatal(err)
	}
	atGate(t, r)
	if pids, known := restoring(t, h.dst); len(pids) == 0 || known {
		t.Fatalf("at the gate: CRIU processes %v (want one), runc knows the container: %v", pids, known)
	}
	if _, err := os.Stat(filepath.Join(work, "restore.log")); err == nil {
		t.Fatal("CRIU began its log before the gate opened")
	}
	copyImages(t, dump, o.ImagesDir)
	pid, err := r.Go(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r.Cancel() // after Go: nothing
	if st, ok := procs.State(pid); !ok || st != 'T' {
		t.Fatalf("restored init %d is %q (found: %v), want stopped until Start", pid, st, ok)
	}
	if b, _ := os.ReadFile(tg.criuConf()); len(b) != 0 {
		t.Errorf("criu.conf after the restore holds %q: a later dump would be left stopped", b)
	}
	if err := tg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	counted(t, filepath.Join(tg.RootfsDir(), "c"), was)
	if err := tg.Discard(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// counted waits for the restored copy to count past where the source was.
func counted(t *testing.T, path string, was []byte) {
	t.Helper()
	n0, _ := strconv.Atoi(strings.TrimSpace(string(was)))
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > n0 {
			return
		}
	}
	b, _ := os.ReadFile(path)
	t.Fatalf("the restored copy does not count on: /c is %q, the source stopped at %q", b, was)
}

// Cancel, the agent's death at the gate (its end of the FIFO closed) and
// its death before CRIU came to the gate each end the restore with nothing
// restored and nothing left; the target restores afterwards as if nothing
// had been begun.
func TestEarlyRestoreEnds(t *testing.T) {
	h := newGateHosts(t)
	dir := t.TempDir()
	dump := h.dump(t, filepath.Join(dir, "dump"))
	for _, end := range []string{"cancel", "agent dies at the gate", "agent dies before the gate"} {
		t.Run(end, func(t *testing.T) {
			work := filepath.Join(dir, strings.ReplaceAll(end, " ", "-"))
			tg, o := h.prepare(t, work)
			r, err := tg.StartRestore(o)
			if err != nil {
				t.Fatal(err)
			}
			g := r.(*restoreGate)
			if end == "agent dies before the gate" {
				// runc takes tens of milliseconds to start CRIU: closed
				// now, the gate has no writer when CRIU comes to it.
				if n, err := unread(g.fifo); err != nil || n == 0 {
					t.Fatalf("CRIU took the gate's line at once (%d bytes unread, %v)", n, err)
				}
				g.fifo.Close() // the line written is lost with the last writer
			}
			// Complete images: a CRIU let through would restore them.
			copyImages(t, dump, o.ImagesDir)
			switch end {
			case "cancel":
				atGate(t, r)
				r.Cancel()
			case "agent dies at the gate":
				atGate(t, r)
				g.fifo.Close()
			case "agent dies before the gate":
				started := func() bool {
					select {
					case <-g.done:
						return true
					default:
					}
					p, _ := restoring(t, h.dst)
					return len(p) > 0
				}
				if err := waitFor(started); err != nil {
					t.Fatal("CRIU never started")
				}
				time.Sleep(100 * time.Millisecond) // at the gate, waiting for a writer
				select {
				case <-g.done:
					t.Fatalf("runc ended without a writer at the gate: %v", g.err)
				default:
				}
				failLeftGate(tg.criuConf(), tg.gateClosed()) // the next agent's Discard
			}
			select {
			case <-g.done:
			case <-time.After(20 * time.Second):
				t.Fatal("runc restore did not end")
			}
			if g.err == nil {
				t.Fatal("the restore succeeded through a closed gate")
			}
			if _, err := os.Stat(filepath.Join(work, "restore.log")); err == nil {
				t.Errorf("the restore failed past the gate (CRIU began its log): %v", g.err)
			}
			if end != "cancel" {
				failLeftGate(tg.criuConf(), tg.gateClosed())
			}
			noneLeft(t, tg)
			if pids, _ := restoring(t, h.dst); len(pids) > 0 {
				t.Fatalf("CRIU processes %v left", pids)
			}
			if _, err := tg.Restore(context.Background(), o); err != nil {
				t.Fatalf("restore after the gate: %v", err)
			}
			if err := tg.Discard(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Where the images' descriptors.json is not what runc read at the gate
// (the container's stdio changed after the source looked), Go restores
// anew from the images.
func TestEarlyRestoreOtherStdio(t *testing.T) {
	h := newGateHosts(t)
	dir := t.TempDir()
	dump := h.dump(t, filepath.Join(dir, "dump"))
	h.c.Meta[stdioMeta] = []byte(`["/dev/null","/dev/zero","/dev/null"]`)
	tg, o := h.prepare(t, filepath.Join(dir, "work"))
	r, err := tg.StartRestore(o)
	if err != nil {
		t.Fatal(err)
	}
	g := atGate(t, r)
	copyImages(t, dump, o.ImagesDir)
	pid, err := r.Go(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if g.err == nil {
		t.Error("the gated restore was not cancelled")
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("restored init %d: %v", pid, err)
	}
	if err := tg.Discard(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func waitFor(ok func() bool) error {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return nil
		}
	}
	return io.ErrNoProgress
}

// Freeze and Thaw work the freezer runc made for the container, without
// runc: runc sees the container paused, then running.
func TestFreezeIsRuncPause(t *testing.T) {
	h := newGateHosts(t)
	ctx := context.Background()
	if _, err := h.src.FreezerDir("gated"); err != nil {
		t.Fatalf("no freezer in runc's record: %v", err)
	}
	for _, step := range []struct {
		do   func(context.Context, *runtime.Container) error
		want string
	}{{h.src.Freeze, "paused"}, {h.src.Thaw, "running"}} {
		if err := step.do(ctx, h.c); err != nil {
			t.Fatal(err)
		}
		if st, err := h.src.State(ctx, "gated"); err != nil || st.Status != step.want {
			t.Fatalf("runc says %q (%v), want %s", st.Status, err, step.want)
		}
	}
}

// The dump begun early waits at its gate with the container running and
// untouched; frozen, Go dumps it; the source stays frozen and resumable.
func TestEarlyDump(t *testing.T) {
	h := newGateHosts(t)
	ctx := context.Background()
	o := dumpDirs(t, t.TempDir())
	e, err := h.src.StartCheckpoint(ctx, h.c, o)
	if err != nil {
		t.Fatal(err)
	}
	if pids := procs.Descendants(os.Getpid(), "criu"); len(pids) == 0 {
		t.Fatal("no CRIU waits at the gate")
	}
	if st, err := h.src.State(ctx, "gated"); err != nil || st.Status != "running" {
		t.Fatalf("at the gate the container is %q (%v), want running", st.Status, err)
	}
	if _, err := os.Stat(filepath.Join(o.ImagesDir, "inventory.img")); err == nil {
		t.Fatal("CRIU wrote images before the gate opened")
	}
	if err := h.src.Freeze(ctx, h.c); err != nil {
		t.Fatal(err)
	}
	d, err := e.Go()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(); err != nil {
		t.Fatal(err)
	}
	e.Cancel() // after Go: nothing
	if _, err := os.Stat(filepath.Join(o.ImagesDir, "pstree.img")); err != nil {
		t.Fatalf("the dump wrote no process tree: %v", err)
	}
	if st, err := h.src.State(ctx, "gated"); err != nil || st.Status != "paused" {
		t.Fatalf("after the dump the container is %q (%v), want still paused", st.Status, err)
	}
	// The gate's script ran before the dump and at no other action.
	log, err := os.ReadFile(filepath.Join(o.WorkDir, "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "dump-gate]"); n != 1 {
		t.Errorf("CRIU ran the gate's script %d times, want once (pre-dump)", n)
	}
}

// Cancel, and the agent's death (its lock on the word gone, the word
// still "wait"), make CRIU give up at the gate: no image, the container
// running on, no CRIU left.
func TestEarlyDumpEnds(t *testing.T) {
	h := newGateHosts(t)
	ctx := context.Background()
	for _, end := range []string{"cancel", "agent dies"} {
		t.Run(end, func(t *testing.T) {
			o := dumpDirs(t, t.TempDir())
			c, err := h.src.StartCheckpoint(ctx, h.c, o)
			if err != nil {
				t.Fatal(err)
			}
			e := c.(*earlyDump)
			if end == "cancel" {
				e.Cancel()
			} else {
				e.gate.word.Close()
				select {
				case <-e.d.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("runc checkpoint did not end")
				}
			}
			if e.d.Err() == nil {
				t.Fatal("the dump went on through a shut gate")
			}
			if _, err := os.Stat(filepath.Join(o.ImagesDir, "inventory.img")); err == nil {
				t.Error("CRIU wrote images")
			}
			if st, err := h.src.State(ctx, "gated"); err != nil || st.Status != "running" {
				t.Errorf("the container is %q (%v), want running", st.Status, err)
			}
			if pids := procs.Descendants(os.Getpid(), "criu"); len(pids) > 0 {
				t.Errorf("CRIU processes %v left", pids)
			}
		})
	}
}

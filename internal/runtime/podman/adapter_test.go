package podman

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/probe"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// The adapter tests run two Podman instances ("hosts") on this machine,
// each in its own network namespace, and move a container holding state in
// memory (memhog, plus a shell counting in a variable) from one to the
// other through a real CRIU page server.

const (
	memhogPort = 7002
	// FERRY_PODMAN_TEST_MEMORY sizes memhog's buffer (default 32M), to
	// time the adapter at a larger size.
	memoryEnv = "FERRY_PODMAN_TEST_MEMORY"
)

// workload: memhog in the background; the shell counts in a variable and
// logs each count, so the log shows whether the count went on or started
// over. SIGTERM ends the shell (PID 1 ignores it otherwise).
func workload() []string {
	return []string{"/bin/sh", "-c", fmt.Sprintf(`trap 'exit 0' TERM; echo shm-kept > /dev/shm/ferry
/bin/memhog --memory %s --dirty-rate 500 --port %d &
i=0; while true; do i=$((i+1)); echo "tick $i"; sleep 0.1; done`, memory(), memhogPort)}
}

func memory() string {
	if m := os.Getenv(memoryEnv); m != "" {
		return m
	}
	return "32M"
}

// buildMemhog compiles the workload, statically.
func buildMemhog(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
		if _, err := os.Stat(goBin); err != nil {
			t.Skip("no go toolchain to build memhog with")
		}
	}
	out := filepath.Join(t.TempDir(), "memhog")
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/ferry-migrate/ferry/workloads/memhog")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building memhog: %v\n%s", err, b)
	}
	return out
}

// pair is two Podman hosts holding the same image.
type pair struct {
	a, b     Host
	nsA, nsB string
	image    string
	work     string
	rtA, rtB *Runtime
}

// newPair makes hosts a and b, each in a network namespace of its own,
// and loads the workload's image into a (and b unless onlyA), checking
// that both give it the same ID. Everything goes at the test's end.
func newPair(t *testing.T, tag string, onlyA bool) *pair {
	t.Helper()
	requireTools(t)
	memhog := buildMemhog(t)
	keepMachineTidy(t)
	if _, err := os.Stat("/run/runc"); errors.Is(err, os.ErrNotExist) {
		// runc's default root, which Podman's containers use; empty again
		// at the end unless someone else's containers are in it.
		t.Cleanup(func() { _ = syscall.Rmdir("/run/runc") })
	}
	p := &pair{nsA: tag + "-a", nsB: tag + "-b", image: tag, work: t.TempDir()}
	addNetNS(t, p.nsA)
	addNetNS(t, p.nsB)
	rootfs := busyboxRootfs(t)
	if err := copyFile(context.Background(), memhog, filepath.Join(rootfs, "bin", "memhog")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(rootfs, "bin", "memhog"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Podman refuses a run root longer than 50 characters: t.TempDir()'s
	// names, made from the test's name, are too long.
	base, err := os.MkdirTemp("", "fpad-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) }) // after the hosts' cleanup
	p.a = Host{Dir: filepath.Join(base, "a"), NetNS: p.nsA}
	p.b = Host{Dir: filepath.Join(base, "b"), NetNS: p.nsB}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, h := range []Host{p.b, p.a} {
			if err := h.Cleanup(ctx); err != nil {
				t.Errorf("cleanup %s: %v", h.Dir, err)
			}
		}
		f, err := os.Open("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if left, _ := mounts.Parse(f, base); len(left) > 0 {
			t.Errorf("mounts left behind: %v", left)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hosts := []Host{p.a, p.b}
	if onlyA {
		hosts = hosts[:1]
	}
	var ids []string
	for _, h := range hosts {
		if err := h.ImportRootfs(ctx, rootfs, p.image); err != nil {
			t.Fatal(err)
		}
		out, err := h.podman(ctx, "image", "inspect", "--format", "{{.Id}}", qualify(p.image))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	if len(ids) == 2 && ids[0] != ids[1] {
		t.Fatalf("image IDs differ between hosts: %s vs %s", ids[0], ids[1])
	}
	p.rtA, p.rtB = New(p.a), New(p.b)
	return p
}

// run starts the workload on h under name, with Podman's default logging.
func (p *pair) run(ctx context.Context, t *testing.T, h Host, name string) {
	t.Helper()
	args := []string{"run", "--detach", "--name", name, "--network", "host",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pull", "never", qualify(p.image)}
	if _, err := h.podman(ctx, append(args, workload()...)...); err != nil {
		t.Fatal(err)
	}
}

// udpIn opens a UDP socket connected to 127.0.0.1:port inside network
// namespace ns: a socket stays in the namespace it was made in.
func udpIn(ns string, port int) (*net.UDPConn, error) {
	type result struct {
		c   *net.UDPConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{err: err}
			return // the thread ends with the goroutine (still locked)
		}
		defer orig.Close()
		target, err := os.Open(filepath.Join("/var/run/netns", ns))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: err}
			return
		}
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// query asks memhog in ns once.
func query(ns, req string) (probe.Stat, error) {
	c, err := udpIn(ns, memhogPort)
	if err != nil {
		return probe.Stat{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		return probe.Stat{}, err
	}
	buf := make([]byte, 64<<10)
	n, err := c.Read(buf)
	if err != nil {
		return probe.Stat{}, err
	}
	var s probe.Stat
	return s, json.Unmarshal(buf[:n], &s)
}

// ready waits until memhog in ns has filled its memory.
func ready(t *testing.T, ns string) probe.Stat {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := query(ns, probe.ReqStat)
		if err == nil && s.Ready {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("memhog in %s never became ready: %+v %v", ns, s, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func verify(t *testing.T, ns string) probe.Stat {
	t.Helper()
	var s probe.Stat
	var err error
	for i := 0; i < 5; i++ {
		if s, err = query(ns, probe.ReqVerify); err == nil {
			return s
		}
	}
	t.Fatalf("VERIFY in %s: %v", ns, err)
	return s
}

// ticks returns the counts the workload logged, in order.
func ticks(ctx context.Context, t *testing.T, h Host, name string) []int {
	t.Helper()
	out, err := h.podman(ctx, "logs", name)
	if err != nil {
		t.Fatal(err)
	}
	var n []int
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "tick "); ok {
			if i, err := strconv.Atoi(v); err == nil {
				n = append(n, i)
			}
		}
	}
	return n
}

// names lists the host's containers (all with -a) as NAME:STATE.
func names(ctx context.Context, t *testing.T, h Host, all bool) string {
	t.Helper()
	args := []string{"ps", "--format", "json"}
	if all {
		args = append(args, "--all")
	}
	out, err := h.podman(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	var ps []struct {
		Names []string
		State string
	}
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatalf("podman ps: %v: %s", err, out)
	}
	var l []string
	for _, c := range ps {
		l = append(l, strings.Join(c.Names, ",")+":"+c.State)
	}
	return strings.Join(l, " ")
}

// pageServer runs `criu page-server` writing into dir, listening on
// loopback in network namespace ns; it returns once the server listens and
// a function waiting for it to end (it ends after one dump).
func pageServer(t *testing.T, ns, dir string, port int) func() error {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer statusR.Close()
	cmd := exec.Command("nsenter", "--net=/var/run/netns/"+ns, "--", "criu", "page-server",
		"--images-dir", dir, "--address", "127.0.0.1", "--port", strconv.Itoa(port),
		"--status-fd", "3", "-o", filepath.Join(filepath.Dir(dir), "page-server.log"), "-v4")
	cmd.ExtraFiles = []*os.File{statusW}
	if err := cmd.Start(); err != nil {
		statusW.Close()
		t.Fatal(err)
	}
	statusW.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill() // by PID
			<-done
		}
	})
	var b [1]byte
	if n, _ := statusR.Read(b[:]); n != 1 {
		t.Fatalf("criu page-server did not start: %v", <-done)
	}
	return func() error {
		select {
		case err := <-done:
			done <- err
			return err
		case <-time.After(30 * time.Second):
			return errors.New("criu page-server still running 30 s after the dump")
		}
	}
}

// copyTree copies the source's writable layer into the destination's,
// keeping modes, owners and overlay whiteouts (0/0 character devices).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		switch m := info.Mode(); {
		case m.IsDir():
			if err := os.MkdirAll(to, m.Perm()); err != nil {
				return err
			}
		case m.IsRegular():
			if err := copyFile(context.Background(), p, to); err != nil {
				return err
			}
		case m&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			_ = os.Remove(to)
			if err := os.Symlink(l, to); err != nil {
				return err
			}
			return os.Lchown(to, int(st.Uid), int(st.Gid))
		case m&fs.ModeCharDevice != 0:
			_ = os.Remove(to)
			if err := unix.Mknod(to, unix.S_IFCHR|uint32(m.Perm()), int(st.Rdev)); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected %v", p, m.Type())
		}
		if err := os.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		return os.Chmod(to, info.Mode().Perm())
	})
}

// copyImages copies the CRIU images the dump wrote (all but the pages,
// which the page server holds) as ferry's engine sends them.
func copyImages(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasSuffix(e.Name(), ".log") {
			if err := copyFile(context.Background(), filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// TestAdapterMigratesAcrossHosts moves a running Podman container from
// host a to host b through the adapter, as the engine would: inspect at
// a, prepare at b, freeze and dump at a with the pages streaming to a CRIU
// page server writing into b's images directory, the writable layer and
// the other images copied over, restore at b, then remove at a.
func TestAdapterMigratesAcrossHosts(t *testing.T) {
	p := newPair(t, "ferry-padm", false)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "ferry-padm-ctr"
	p.run(ctx, t, p.a, name)
	ready(t, p.nsA)

	// Something in the writable layer, written by the container.
	if _, err := p.a.Exec(ctx, name, "/bin/sh", "-c", "echo moved > /etc/ferry-marker"); err != nil {
		t.Fatal(err)
	}

	c, err := p.rtA.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if c.Runtime != "podman" || c.Name != name || c.Status != "running" || !alive(c.PID) || len(c.ID) != 64 {
		t.Fatalf("inspect: %+v", c)
	}
	if _, err := os.Stat(filepath.Join(c.Rootfs, "etc", "ferry-marker")); err != nil {
		t.Fatalf("Rootfs %s is not the writable layer: %v", c.Rootfs, err)
	}
	cfg, err := parseConfig(c.Meta[MetaConfig])
	if err != nil || cfg.ID != c.ID || cfg.ImageID != c.Image {
		t.Fatalf("config.dump %+v: %v", cfg, err)
	}
	// A Podman that keeps the exit command it made at create hands it to
	// conmon, which runs it here: admission takes Podman's own for such.
	// (4.3, Debian 12's, keeps none: it makes one at each start.)
	if len(cfg.ExitCommand) > 0 {
		if why := admission.CheckPodmanExitCommand(cfg.ExitCommand, podmanPath()); why != "" {
			t.Errorf("Podman's own exit command refused: %s", why)
		}
	}
	if !json.Valid(c.Spec) || string(c.Spec) != string(c.Meta[MetaSpec]) {
		t.Fatal("spec.dump missing or malformed")
	}
	if _, err := os.Stat(filepath.Join(c.Rootfs, "..", "..", "..", "overlay-containers", c.ID, "userdata", "config.dump")); err == nil {
		t.Error("config.dump left in the source's bundle")
	}

	srcImages, srcWork := filepath.Join(p.work, "a", "images"), filepath.Join(p.work, "a")
	dstImages, dstWork := filepath.Join(p.work, "b", "images"), filepath.Join(p.work, "b")
	start := time.Now()
	tgt, err := p.rtB.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: dstWork})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("prepare at b: %v", time.Since(start).Round(time.Millisecond))
	if got := names(ctx, t, p.b, true); got != name+":created" {
		t.Fatalf("b after prepare: %q, want %s created", got, name)
	}
	if st, err := os.Stat(tgt.RootfsDir()); err != nil || !st.IsDir() {
		t.Fatalf("RootfsDir %s: %v", tgt.RootfsDir(), err)
	}

	const psPort = 27171
	pagesDone := pageServer(t, p.nsA, dstImages, psPort)
	before := ready(t, p.nsA)

	start = time.Now()
	if err := p.rtA.Freeze(ctx, c); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	d, err := p.rtA.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: srcImages, WorkDir: srcWork,
		PageServer: fmt.Sprintf("127.0.0.1:%d", psPort)})
	if err != nil {
		t.Fatal(err)
	}
	dumped := time.Now()
	if err := d.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := pagesDone(); err != nil {
		t.Fatalf("page server: %v", err)
	}
	if pages, _ := filepath.Glob(filepath.Join(srcImages, "pages-*.img")); len(pages) > 0 {
		t.Fatalf("pages written at the source: %v", pages)
	}
	if pages, _ := filepath.Glob(filepath.Join(dstImages, "pages-*.img")); len(pages) == 0 {
		t.Fatal("the page server received no pages")
	}
	if s, err := p.rtA.Inspect(ctx, name); err != nil || s.Status != "paused" {
		t.Fatalf("source after the dump: %+v %v", s, err)
	}
	if err := copyTree(c.Rootfs, tgt.RootfsDir()); err != nil {
		t.Fatal(err)
	}
	copyImages(t, srcImages, dstImages)
	if _, err := os.Stat(filepath.Join(dstImages, devShmTar)); err != nil {
		t.Errorf("/dev/shm not saved with the images: %v", err)
	}
	lastA := ticks(ctx, t, p.a, name)

	restoreStart := time.Now()
	pid, err := tgt.Restore(ctx, runtime.RestoreOptions{ImagesDir: dstImages, WorkDir: dstWork})
	if err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	// Restored stopped: until the commit (Start) none of it runs, though
	// Podman says running.
	if got := names(ctx, t, p.b, false); got != name+":running" {
		t.Fatalf("podman ps at b before Start: %q", got)
	}
	tree := append([]int{pid}, procs.Descendants(pid, "")...)
	for _, q := range tree {
		if st, ok := procs.State(q); ok && st != 'T' {
			t.Errorf("process %d of the restored copy is in state %c before Start, want T (stopped)", q, st)
		}
	}
	if err := tgt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range tree {
		if st, ok := procs.State(q); ok && st == 'T' {
			t.Errorf("process %d of the restored copy still stopped after Start", q)
		}
	}
	if err := tgt.Start(ctx); err != nil {
		t.Errorf("Start again: %v", err)
	}
	t.Logf("memory %s: freeze %v, dump %v, restore %v (freeze to running at b: %v)", memory(),
		frozen.Sub(start).Round(time.Millisecond), dumped.Sub(frozen).Round(time.Millisecond),
		restored.Sub(restoreStart).Round(time.Millisecond), restored.Sub(start).Round(time.Millisecond))

	// b: Podman owns it, running under the same name, with its PID.
	if got := names(ctx, t, p.b, false); got != name+":running" {
		t.Fatalf("podman ps at b: %q", got)
	}
	cb, err := p.rtB.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if cb.PID != pid || cb.Status != "running" || cb.ID == c.ID {
		t.Fatalf("b: %+v, Restore said pid %d", cb, pid)
	}
	// Its memory went on where it stopped.
	after := verify(t, p.nsB)
	if !after.VerifyOK || after.Boot != before.Boot || after.Counter < before.Counter {
		t.Fatalf("memhog at b: %+v, before the move: %+v", after, before)
	}
	for _, f := range []struct{ path, want string }{{"/etc/ferry-marker", "moved"}, {"/dev/shm/ferry", "shm-kept"}} {
		out, err := p.b.Exec(ctx, name, "/bin/cat", f.path)
		if err != nil || strings.TrimSpace(out) != f.want {
			t.Errorf("%s at b: %q %v, want %q", f.path, out, err, f.want)
		}
	}
	// The shell's count goes on in b's log from where a's log stopped.
	var lastB []int
	for deadline := time.Now().Add(5 * time.Second); len(lastB) == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		lastB = ticks(ctx, t, p.b, name)
	}
	if len(lastA) == 0 || len(lastB) == 0 || lastB[0] != lastA[len(lastA)-1]+1 {
		t.Fatalf("count at a ended %v, at b began %v", lastA[max(0, len(lastA)-3):], lastB[:min(3, len(lastB))])
	}

	// a: still paused until the commit, then gone.
	if s, err := p.rtA.Inspect(ctx, name); err != nil || s.Status != "paused" {
		t.Fatalf("source before the commit: %+v %v", s, err)
	}
	if err := d.Release(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := p.rtA.Remove(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := names(ctx, t, p.a, true); got != "" {
		t.Fatalf("a still lists %q", got)
	}
	if _, err := p.rtA.Inspect(ctx, name); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("inspect at a after remove: %v", err)
	}
	if alive(c.PID) {
		t.Errorf("source process %d still alive", c.PID)
	}

	// b: the usual commands work on it.
	if _, err := p.b.podman(ctx, "stop", "--time", "5", name); err != nil {
		t.Fatal(err)
	}
	if st, err := p.b.Inspect(ctx, name, "{{.State.Status}}"); err != nil || st != "exited" {
		t.Fatalf("after stop at b: %q %v", st, err)
	}
	if len(ticks(ctx, t, p.b, name)) == 0 {
		t.Error("podman logs at b lost the count after stop")
	}
	if _, err := p.b.podman(ctx, "rm", name); err != nil {
		t.Fatal(err)
	}
	if got := names(ctx, t, p.b, true); got != "" {
		t.Fatalf("b still lists %q", got)
	}
	if alive(pid) {
		t.Errorf("restored process %d still alive", pid)
	}
}

// TestAdapterFailedRestoreLeavesSourceRunning: the restore at b fails (the
// pages went elsewhere); b drops its copy and a, thawed, runs on with its
// state and stops normally.
func TestAdapterFailedRestoreLeavesSourceRunning(t *testing.T) {
	p := newPair(t, "ferry-padf", false)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "ferry-padf-ctr"
	p.run(ctx, t, p.a, name)
	ready(t, p.nsA)
	c, err := p.rtA.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := p.rtB.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: filepath.Join(p.work, "b")})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(p.work, "elsewhere", "images")
	const psPort = 27172
	pagesDone := pageServer(t, p.nsA, elsewhere, psPort)
	before := ready(t, p.nsA)
	if err := p.rtA.Freeze(ctx, c); err != nil {
		t.Fatal(err)
	}
	srcImages := filepath.Join(p.work, "a", "images")
	d, err := p.rtA.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: srcImages, WorkDir: filepath.Join(p.work, "a"),
		PageServer: fmt.Sprintf("127.0.0.1:%d", psPort)})
	if err != nil {
		t.Fatal(err)
	}
	if err := pagesDone(); err != nil {
		t.Fatal(err)
	}
	dstImages := filepath.Join(p.work, "b", "images")
	if err := os.MkdirAll(dstImages, 0o700); err != nil {
		t.Fatal(err)
	}
	copyImages(t, srcImages, dstImages) // without the pages

	_, err = tgt.Restore(ctx, runtime.RestoreOptions{ImagesDir: dstImages, WorkDir: filepath.Join(p.work, "b")})
	if err == nil {
		t.Fatal("restore without the pages succeeded")
	}
	t.Logf("restore failed as it should: %v", err)
	if !strings.Contains(err.Error(), "No pagemap") {
		t.Errorf("the error does not quote CRIU's reason: %v", err)
	}
	if err := tgt.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	if got := names(ctx, t, p.b, true); got != "" {
		t.Fatalf("b still lists %q after discard", got)
	}

	// The engine's abort: release the dump, thaw.
	if err := d.Release(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := p.rtA.Thaw(ctx, c); err != nil {
		t.Fatal(err)
	}
	if st, err := runtime.State(ctx, p.rtA, name); err != nil || st != "running" {
		t.Fatalf("source after the abort: %q %v", st, err)
	}
	if st, err := p.a.Inspect(ctx, name, "{{.State.Status}} {{.State.Pid}}"); err != nil || st != fmt.Sprintf("running %d", c.PID) {
		t.Fatalf("podman inspect at a: %q %v (pid was %d)", st, err, c.PID)
	}
	s1 := verify(t, p.nsA)
	time.Sleep(200 * time.Millisecond)
	s2, err := query(p.nsA, probe.ReqStat)
	if err != nil || !s1.VerifyOK || s1.Boot != before.Boot || s2.Counter <= s1.Counter || s1.Counter < before.Counter {
		t.Fatalf("memhog at a after the abort: %+v then %+v (%v), before: %+v", s1, s2, err, before)
	}
	if _, err := p.a.podman(ctx, "stop", "--time", "5", name); err != nil {
		t.Fatal(err)
	}
	if st, err := p.a.Inspect(ctx, name, "{{.State.Status}}"); err != nil || st != "exited" {
		t.Fatalf("after stop at a: %q %v", st, err)
	}
}

// TestAdapterRefusals: what cannot work is refused before anything is
// frozen or created.
func TestAdapterRefusals(t *testing.T) {
	p := newPair(t, "ferry-padr", true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "ferry-padr-ctr"

	if _, err := p.rtA.Inspect(ctx, "ferry-padr-nosuch"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("inspect of a missing container: %v", err)
	}
	p.run(ctx, t, p.a, name)
	c, err := p.rtA.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}

	// The image is missing at b.
	_, err = p.rtB.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: filepath.Join(p.work, "b1")})
	if err == nil || !strings.Contains(err.Error(), "does not have the image") || !strings.Contains(err.Error(), c.Image) {
		t.Fatalf("prepare without the image: %v", err)
	}
	t.Logf("refused: %v", err)
	if got := names(ctx, t, p.b, true); got != "" {
		t.Fatalf("b lists %q after a refused prepare", got)
	}

	// The name is taken at b.
	out, err := p.a.podman(ctx, "save", "--quiet", "--output", filepath.Join(p.work, "image.tar"), qualify(p.image))
	if err != nil {
		t.Fatalf("save: %v %s", err, out)
	}
	if _, err := p.b.podman(ctx, "load", "--quiet", "--input", filepath.Join(p.work, "image.tar")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.b.podman(ctx, "create", "--name", name, "--pull", "never", qualify(p.image), "/bin/sh"); err != nil {
		t.Fatal(err)
	}
	_, err = p.rtB.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: filepath.Join(p.work, "b2")})
	if err == nil || !strings.Contains(err.Error(), "already has a container named") {
		t.Fatalf("prepare onto a taken name: %v", err)
	}
	t.Logf("refused: %v", err)
	if got := names(ctx, t, p.b, true); got != name+":created" {
		t.Fatalf("b lists %q, want only its own %s", got, name)
	}

	// Another runtime's container; a dump of a container not frozen.
	if _, err := p.rtB.Prepare(ctx, &runtime.Container{Runtime: "runc", Name: "x"}, runtime.PrepareOptions{}); err == nil {
		t.Fatal("prepared a runc container")
	}
	_, err = p.rtA.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: filepath.Join(p.work, "a", "images")})
	if err == nil || !strings.Contains(err.Error(), "freeze it") {
		t.Fatalf("dump of a running container: %v", err)
	}
	if st, err := runtime.State(ctx, p.rtA, name); err != nil || st != "running" {
		t.Fatalf("source after the refused dump: %q %v", st, err)
	}
}

// --- without Podman ---

func configJSON(t *testing.T, edit func(m map[string]any)) []byte {
	t.Helper()
	const id = "ce19585cde1e02d8155f6e9d4f061b387fe6491f296b7f03de24340bca9e5065"
	own := "/h/a/storage/overlay-containers/" + id + "/userdata"
	run := "/h/a/run/overlay-containers/" + id + "/userdata"
	m := map[string]any{
		"id": id, "name": "hog", "runtime": "runc", "rootfsImageID": "7008", "rootfsImageName": "localhost/x:latest",
		"ShmDir": own + "/shm", "staticDir": own, "logPath": own + "/ctr.log", "mounts": []string{own + "/shm", "/elsewhere"},
		"conmonPidFile": run + "/conmon.pid", "pid_file": "/user/pidfile", "cgroupParent": "/libpod_parent",
		"CreateCommand": []string{"podman", "--root", "/h/a/storage", "run", "x"}, "stopTimeout": 10, "createNetNS": false,
	}
	if edit != nil {
		edit(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAdaptConfig(t *testing.T) {
	out, err := adaptConfig(configJSON(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"ShmDir": "", "staticDir": "", "logPath": "", "conmonPidFile": "", // the source's own files
		"pid_file": "/user/pidfile", "cgroupParent": "/libpod_parent", "name": "hog", "runtime": "runc", // kept
		"stopTimeout": float64(10), "createNetNS": false,
	} {
		if m[k] != want {
			t.Errorf("%s = %#v, want %#v", k, m[k], want)
		}
	}
	if got := fmt.Sprint(m["mounts"]); got != "[/elsewhere]" {
		t.Errorf("mounts = %s", got)
	}
	if got := fmt.Sprint(m["CreateCommand"]); got != "[podman --root /h/a/storage run x]" {
		t.Errorf("CreateCommand = %s", got)
	}
	if _, err := adaptConfig([]byte(`{"name":"x"}`)); err == nil {
		t.Error("a configuration without an ID was adapted")
	}
}

func TestMovable(t *testing.T) {
	for _, tc := range []struct {
		edit func(m map[string]any)
		want string
	}{
		{nil, ""},
		{func(m map[string]any) { m["pod"] = "p1" }, "in a pod"},
		{func(m map[string]any) { m["Dependencies"] = []string{"x"} }, "depends on other containers"},
		{func(m map[string]any) { m["netNsCtr"] = "x" }, "network"},
		{func(m map[string]any) { m["namedVolumes"] = []any{map[string]any{"volumeName": "v"}} }, ""}, // they move
		{func(m map[string]any) { m["overlayVolumes"] = []any{map[string]any{"source": "/x"}} }, "overlay or image volumes"},
		{func(m map[string]any) { m["ctrImageVolumes"] = []any{map[string]any{"Dest": "/x"}} }, "overlay or image volumes"},
		{func(m map[string]any) { m["rootfs"] = "/some/dir"; delete(m, "rootfsImageID") }, "--rootfs"},
	} {
		cfg, err := parseConfig(configJSON(t, tc.edit))
		if err != nil {
			t.Fatal(err)
		}
		err = cfg.movable()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	if _, err := parseConfig(nil); err == nil || !strings.Contains(err.Error(), "no Podman configuration") {
		t.Errorf("parseConfig(nil): %v", err)
	}
}

// A container under another OCI runtime is refused before anything runs,
// at either end.
func TestCheckpointNeedsRunc(t *testing.T) {
	r := New(Host{Dir: t.TempDir()})
	c := &runtime.Container{Runtime: "podman", Name: "hog", ID: "x",
		Meta: map[string][]byte{MetaConfig: configJSON(t, func(m map[string]any) { m["runtime"] = "crun" })}}
	_, err := r.Checkpoint(context.Background(), c, runtime.CheckpointOptions{ImagesDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), `OCI runtime "crun"`) {
		t.Fatalf("checkpoint under crun: %v", err)
	}
	for _, o := range []runtime.CheckpointOptions{{Lazy: true}, {PreDump: true}} {
		if _, err := r.Checkpoint(context.Background(), c, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if caps := r.Caps(); !caps.Freeze || caps.LazyDump || caps.LazyRestore || caps.PreDump {
		t.Errorf("caps %+v", caps)
	}
	r.Lazy = true
	if caps := r.Caps(); !caps.LazyDump || !caps.LazyRestore {
		t.Errorf("caps where CRIU's lazy pages work: %+v", caps)
	}
	r.Lazy = false
	// A destination whose Podman runs crun refuses before it creates
	// anything (its runtime name is cached: no podman runs here).
	r.ociName = "crun"
	c.Meta = map[string][]byte{MetaConfig: configJSON(t, func(m map[string]any) { delete(m, "pid_file"); m["createNetNS"] = true }), MetaSpec: specJSON(t, nil)}
	_, err = r.Prepare(context.Background(), c, runtime.PrepareOptions{WorkDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), `runs containers with "crun"`) {
		t.Fatalf("prepare under crun: %v", err)
	}
	if _, err := r.Prepare(context.Background(), c, runtime.PrepareOptions{NetNS: "/var/run/netns/x"}); err == nil {
		t.Fatal("prepare into a rebuilt network namespace accepted")
	}
}

// specJSON is a spec.dump as Podman writes it for the container of
// configJSON (abridged): runc's ordinary spec with a network namespace
// of Podman's, plus Podman's own bind mounts of files it made for the
// container in its storage and run directories.
func specJSON(t *testing.T, edit func(s *specs.Spec)) []byte {
	t.Helper()
	var cfg struct{ ID string }
	if err := json.Unmarshal(configJSON(t, nil), &cfg); err != nil {
		t.Fatal(err)
	}
	s := runc.NewSpec(runc.SpecOptions{Args: []string{"/bin/sh"}, NetNS: "/run/netns/netns-5b3ac6e2"})
	// Podman replaces the spec's tmpfs at /dev/shm with its own.
	s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/dev/shm" })
	for dst, src := range map[string]string{
		"/dev/shm": "/h/a/storage/overlay-containers/" + cfg.ID + "/userdata/shm", "/etc/hosts": "/h/a/run/overlay-containers/" + cfg.ID + "/userdata/hosts",
		"/etc/resolv.conf": "/h/a/run/overlay-containers/" + cfg.ID + "/userdata/resolv.conf", "/run/.containerenv": "/h/a/run/overlay-containers/" + cfg.ID + "/userdata/.containerenv",
	} {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"bind", "rprivate"}})
	}
	if edit != nil {
		edit(s)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Prepare applies the host's admission policy to both records before
// Podman creates anything. An admitted container goes on to the OCI
// runtime check, which fails here (crun cached: no podman runs).
func TestPrepareAdmission(t *testing.T) {
	// As Podman records a container on a network of its own: no
	// --pidfile, a network namespace Podman makes.
	noPidFile := func(m map[string]any) { delete(m, "pid_file"); m["createNetNS"] = true }
	hostNet := func(s *specs.Spec) {
		var kept []specs.LinuxNamespace
		for _, ns := range s.Linux.Namespaces {
			if ns.Type != specs.NetworkNamespace {
				kept = append(kept, ns)
			}
		}
		s.Linux.Namespaces = kept
	}
	for _, tc := range []struct {
		name   string
		netns  string // the Host's: the namespace Podman runs in
		policy admission.Policy
		config func(m map[string]any)
		spec   func(s *specs.Spec)
		want   string // "" admitted
	}{
		{name: "ordinary", config: noPidFile},
		{name: "host network in this machine's namespace", config: noPidFile, spec: hostNet, want: "shares this host's network namespace"},
		{name: "host network, allowed", policy: admission.Policy{HostNetwork: true}, config: noPidFile, spec: hostNet},
		{name: "host network in the host's container namespace", netns: "/var/run/netns/h2", config: noPidFile, spec: hostNet},
		{name: "hook", config: noPidFile, spec: func(s *specs.Spec) {
			s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{{Path: "/bin/sh"}}}
		}, want: "OCI hooks"},
		{name: "bind of /etc", config: noPidFile, spec: func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/h", Type: "bind", Source: "/etc"})
		}, want: "bind mount of host path /etc"},
		{name: "--network ns:PATH", config: func(m map[string]any) { delete(m, "pid_file") }, spec: func(s *specs.Spec) {
			for i := range s.Linux.Namespaces {
				if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
					s.Linux.Namespaces[i].Path = "/proc/1/ns/net"
				}
			}
		}, want: "joins the network namespace at /proc/1/ns/net"},
		{name: "--pidfile", config: func(m map[string]any) { m["createNetNS"] = true }, want: "writes its PID to host file /user/pidfile (--pidfile)"},
		{name: "--conmon-pidfile", config: func(m map[string]any) { noPidFile(m); m["conmonPidFile"] = "/etc/cron.d/x" }, want: "host file /etc/cron.d/x (--conmon-pidfile)"},
		{name: "secrets", config: func(m map[string]any) {
			noPidFile(m)
			m["secrets"] = []any{map[string]any{"name": "db-password", "id": "abc"}}
		}, want: `this host's Podman secret "db-password"`},
		{name: "privileged", policy: admission.Policy{Privileged: true}, config: func(m map[string]any) { m["conmonPidFile"] = "/etc/x" }, spec: func(s *specs.Spec) {
			s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/sh"}}} //nolint:staticcheck // runc still runs the deprecated hooks
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Host{Dir: t.TempDir(), NetNS: tc.netns})
			r.ociName, r.Admission = "crun", tc.policy
			c := &runtime.Container{Runtime: "podman", Name: "hog",
				Meta: map[string][]byte{MetaConfig: configJSON(t, tc.config), MetaSpec: specJSON(t, tc.spec)}}
			_, err := r.Prepare(context.Background(), c, runtime.PrepareOptions{WorkDir: t.TempDir()})
			switch {
			case tc.want == "" && (err == nil || !strings.Contains(err.Error(), `runs containers with "crun"`)):
				t.Fatalf("not admitted: %v", err)
			case tc.want != "" && (!admission.IsRefused(err) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("%v, want a refusal naming %q", err, tc.want)
			}
		})
	}
}

func TestCreateArchive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "create.tar")
	if err := writeCreateArchive(path, []byte(`{"id":"x"}`), []byte(`{"ociVersion":"1.0.2"}`), nil); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(b)
	}
	if got["config.dump"] != `{"id":"x"}` || got["spec.dump"] == "" || got["checkpoint/inventory.img"] != "" || len(got) != 5 {
		t.Fatalf("archive %v", got)
	}
	// The placeholder must not read as a tar, or Podman would go on.
	if _, err := tar.NewReader(strings.NewReader(got["rootfs-diff.tar"])).Next(); err == nil || err == io.EOF {
		t.Fatalf("placeholder diff reads as a tar: %v", err)
	}
}

func TestTarShm(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(t.TempDir(), devShmTar)
	if err := tarShm(dir, dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("an empty /dev/shm made a tar")
	}
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	if err := tarShm(dir, dst); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got = append(got, h.Name+"="+h.Linkname+string(b))
	}
	if strings.Join(got, " ") != "l=sub/f sub= sub/f=data" {
		t.Fatalf("tar holds %q", got)
	}
}

// TestThawAfterCRIUThawedTheCgroup: a CRIU killed mid-dump leaves the
// container running while Podman records it paused and will not unpause
// it. Thaw, given only the name (as a recovering agent has it from its
// journal), brings Podman's record in line.
func TestThawAfterCRIUThawedTheCgroup(t *testing.T) {
	p := newPair(t, "ferry-padt", true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const name = "ferry-padt-ctr"
	p.run(ctx, t, p.a, name)
	ready(t, p.nsA)
	c, err := p.rtA.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.rtA.Freeze(ctx, c); err != nil {
		t.Fatal(err)
	}
	// What the killed CRIU leaves: the cgroup thawed behind Podman's back.
	rc, err := p.rtA.runc()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Resume(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.a.podman(ctx, "unpause", name); err == nil || !strings.Contains(err.Error(), "not paused") {
		t.Fatalf("podman unpause of a container it records paused but runs: %v", err)
	}
	if err := p.rtA.Thaw(ctx, &runtime.Container{Runtime: "podman", Name: name, ID: name}); err != nil {
		t.Fatal(err)
	}
	if st, err := runtime.State(ctx, p.rtA, name); err != nil || st != "running" {
		t.Fatalf("after Thaw: %q %v", st, err)
	}
	verify(t, p.nsA)
	if _, err := p.a.podman(ctx, "rm", "--force", "--time", "0", name); err != nil {
		t.Fatalf("podman rm after Thaw: %v", err)
	}
}

package lxc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/vishvananda/netns"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// The container's init counts in a shell variable and publishes the count
// in /c every 100 ms: after a restore the count goes on from where it was,
// a restart would begin at 1 again. memhog holds 16 MiB whose digest and
// boot id must survive too. SIGPWR (lxc-stop's halt signal) ends it.
const initScript = `#!/bin/sh
trap 'exit 0' PWR TERM
ip link set lo up
/bin/memhog --memory 16M --port 7000 >/dev/null 2>&1 &
i=0
while true; do i=$((i+1)); echo $i > /c.new; mv /c.new /c; sleep 0.1; done
`

func requireTools(t *testing.T) {
	t.Helper()
	testroot.Require(t, "skipped: needs root (LXC checkpoint/restore)")
	for _, tool := range []string{"lxc-start", "lxc-checkpoint", "lxc-info", "lxc-ls", "lxc-stop", "lxc-destroy", "lxc-freeze", "lxc-cgroup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipped: %s not found (apt-get install lxc)", tool)
		}
	}
	if _, err := criu.Binary(); err != nil {
		t.Skipf("skipped: no CRIU (make setup): %v", err)
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("skipped: needs /bin/busybox (busybox-static)")
	}
}

// memhogBinary is bin/memhog from `make build`, or one built here.
func memhogBinary(t *testing.T) string {
	t.Helper()
	if p, err := filepath.Abs("../../../bin/memhog"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	out := filepath.Join(t.TempDir(), "memhog")
	cmd := exec.Command("go", "build", "-o", out, "../../../workloads/memhog")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build memhog: %v: %s", err, b)
	}
	return out
}

// lxcCmd runs an lxc-* command for a test; a container's monitor may keep
// its output open, so that goes to a file.
func lxcCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	f, err := os.CreateTemp("", "lxc-test-out")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	c := exec.Command(args[0], args[1:]...)
	c.Stdout, c.Stderr = f, f
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = c.Run()
	b, _ := os.ReadFile(f.Name())
	return string(b), err
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// testContainer is a busybox container running initScript under lxcpath.
type testContainer struct {
	lxcpath, name, rootfs string
}

// counter reads the count the container's init publishes.
func (c testContainer) counter(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.rootfs, "c"))
	if err != nil {
		t.Fatalf("read the counter: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("counter %q: %v", b, err)
	}
	return n
}

// newContainer writes a container (config and rootfs) under lxcpath and
// starts it. Cleanup kills and destroys it, whatever state it is in.
func newContainer(t *testing.T, lxcpath, name string, memhog string) testContainer {
	t.Helper()
	dir := filepath.Join(lxcpath, name)
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyFile("/bin/busybox", filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "sleep", "cat", "mv", "ip"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyFile(memhog, filepath.Join(root, "bin", "memhog"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "init"), []byte(initScript), 0o755); err != nil {
		t.Fatal(err)
	}
	// No network of its own beyond loopback (empty), no ttys (CRIU cannot
	// dump them), liblxc's default console (moved by liblxc's tty.info).
	cfg := fmt.Sprintf(`# ferry test container
lxc.uts.name = %s
lxc.rootfs.path = dir:%s
lxc.net.0.type = empty
lxc.tty.max = 0
lxc.pty.max = 1
lxc.autodev = 1
lxc.mount.auto = proc:mixed sys:ro
lxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio
lxc.mount.entry = /lib lib none ro,bind,create=dir 0 0
lxc.init.cmd = /bin/init
lxc.log.file = %s/lxc.log
lxc.log.level = INFO
`, name, root, dir)
	if err := os.WriteFile(filepath.Join(dir, "config"), []byte(cfg), 0o640); err != nil {
		t.Fatal(err)
	}
	c := testContainer{lxcpath: lxcpath, name: name, rootfs: root}
	t.Cleanup(func() { destroyContainer(t, lxcpath, name) })
	if out, err := lxcCmd(t, "lxc-start", "-P", lxcpath, "-n", name); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "lxc.log"))
		t.Fatalf("lxc-start: %v: %s\n%s", err, out, tail.Lines(string(b), 10))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(root, "c")); err == nil && memhogReady(t, mustPID(t, lxcpath, name)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s did not come up", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// destroyContainer kills and destroys a container if it exists.
func destroyContainer(t *testing.T, lxcpath, name string) {
	t.Helper()
	// A copy CRIU restored leaves its v2 cgroup to whoever removes it
	// (cgroups.go); liblxc's tools do not.
	defer func() {
		if err := RemoveIdleCgroups(name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}()
	if _, err := os.Stat(filepath.Join(lxcpath, name, "config")); err != nil {
		return
	}
	_, _ = lxcCmd(t, "lxc-stop", "-P", lxcpath, "-n", name, "-k")
	if out, err := lxcCmd(t, "lxc-destroy", "-P", lxcpath, "-n", name); err != nil {
		t.Errorf("cleanup: lxc-destroy -P %s -n %s: %v: %s", lxcpath, name, err, out)
	}
}

func lxcState(t *testing.T, lxcpath, name string) (string, int) {
	t.Helper()
	out, err := lxcCmd(t, "lxc-info", "-P", lxcpath, "-n", name, "-s", "-p")
	if err != nil {
		t.Fatalf("lxc-info: %v: %s", err, out)
	}
	var state string
	var pid int
	for _, l := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(l, ":")
		switch strings.TrimSpace(k) {
		case "State":
			state = strings.TrimSpace(v)
		case "PID":
			pid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return state, pid
}

func mustPID(t *testing.T, lxcpath, name string) int {
	t.Helper()
	_, pid := lxcState(t, lxcpath, name)
	return pid
}

// memhogReply is what memhog answers to STAT and VERIFY.
type memhogReply struct {
	Boot     string `json:"boot"`
	Counter  uint64 `json:"counter"`
	Digest   string `json:"digest"`
	Ready    bool   `json:"ready"`
	VerifyOK bool   `json:"verify_ok"`
	BadPages uint64 `json:"bad_pages"`
}

// askMemhog sends req to memhog inside the network namespace of pid.
func askMemhog(pid int, req string) (memhogReply, error) {
	return askMemhogWithin(pid, req, 5*time.Second)
}

// askMemhogWithin is askMemhog, waiting at most wait for the answer.
func askMemhogWithin(pid int, req string, wait time.Duration) (memhogReply, error) {
	var r memhogReply
	type result struct {
		conn *net.UDPConn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPid(pid)
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7000})
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread() // else the thread dies with its goroutine
		}
		ch <- result{conn, err}
	}()
	res := <-ch
	if res.err != nil {
		return r, res.err
	}
	defer res.conn.Close()
	if _, err := res.conn.Write([]byte(req)); err != nil {
		return r, err
	}
	_ = res.conn.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64<<10)
	n, err := res.conn.Read(buf)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(buf[:n], &r)
}

func memhogReady(t *testing.T, pid int) bool {
	r, err := askMemhog(pid, "STAT")
	return err == nil && r.Ready
}

// waitAdvancing waits until the counter passes after.
func (c testContainer) waitAdvancing(t *testing.T, after int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if n := c.counter(t); n > after {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s in %s: counter stuck at %d", c.name, c.lxcpath, c.counter(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pageServer runs `criu page-server` into dir on a free loopback port, and
// returns its address once it listens and a function waiting for its exit.
func pageServer(t *testing.T, dir string) (string, func() error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	cmd := exec.Command((&Runtime{}).criu(), "page-server", "--images-dir", dir, "--address", "127.0.0.1",
		"--port", strconv.Itoa(port), "--status-fd", "3", "-o", filepath.Join(dir, "page-server.log"))
	cmd.ExtraFiles = []*os.File{wr}
	if err := cmd.Start(); err != nil {
		wr.Close()
		t.Fatal(err)
	}
	wr.Close()
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill() // by PID
			<-done
		}
	})
	var b [1]byte
	if n, err := rd.Read(b[:]); n != 1 {
		t.Fatalf("criu page-server never got ready: %v", err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port), func() error {
		select {
		case <-done:
			return waitErr
		case <-time.After(10 * time.Second):
			return errors.New("criu page-server did not exit")
		}
	}
}

// copyTree copies a directory's contents (cp -a).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src+"/.", dst+"/").CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v: %s", src, dst, err, out)
	}
}

// copyImages copies every image but the memory (and logs): the memory is
// already at the destination, through the page server.
func copyImages(t *testing.T, src, dst string) {
	t.Helper()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, "pages-") || strings.HasPrefix(n, "pagemap-") || strings.HasSuffix(n, ".log") {
			t.Errorf("the source's images hold %s: memory or a log that should not be there", n)
			continue
		}
		if err := copyFile(filepath.Join(src, n), filepath.Join(dst, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func testName(tag string) string { return fmt.Sprintf("ferry-%s-%d", tag, os.Getpid()) }

func listed(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := lxcCmd(t, append([]string{"lxc-ls", "-1"}, args...)...)
	if err != nil {
		t.Fatalf("lxc-ls: %v: %s", err, out)
	}
	return strings.Fields(out)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestMigrateBetweenLXCPaths moves a running container from one lxcpath
// to another, memory through a real CRIU page server, the way the engine
// does: Inspect, Prepare, Freeze, Checkpoint, rootfs and images copied,
// Restore, Remove.
func TestMigrateBetweenLXCPaths(t *testing.T) {
	requireTools(t)
	memhog := memhogBinary(t)
	ctx := context.Background()
	base := t.TempDir()
	pathA, pathB := filepath.Join(base, "a"), filepath.Join(base, "b")
	src, dst := New(pathA), New(pathB)
	dst.Admission.BindSources = []string{"/lib"} // the test container binds the host's /lib
	name := testName("mig")
	ct := newContainer(t, pathA, name, memhog)
	t.Cleanup(func() { destroyContainer(t, pathB, name) })

	c, err := src.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if c.Runtime != "lxc" || c.Status != "running" || c.PID <= 0 || c.Rootfs != ct.rootfs || len(c.Meta["config"]) == 0 {
		t.Fatalf("Inspect = %+v", c)
	}
	before, err := askMemhog(c.PID, "STAT")
	if err != nil {
		t.Fatal(err)
	}

	tgt, err := dst.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: filepath.Join(base, "dst-work")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tgt.Discard(context.Background()); err != nil {
			t.Errorf("Discard: %v", err)
		}
	})
	if want := filepath.Join(pathB, name, "rootfs"); tgt.RootfsDir() != want {
		t.Fatalf("RootfsDir = %s, want %s", tgt.RootfsDir(), want)
	}
	cfgB, err := os.ReadFile(filepath.Join(pathB, name, "config"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfgB), "lxc.rootfs.path = dir:"+tgt.RootfsDir()+"\n") ||
		!strings.Contains(string(cfgB), "lxc.log.file = "+filepath.Join(pathB, name, "lxc.log")+"\n") ||
		strings.Contains(string(cfgB), pathA) {
		t.Fatalf("config at the destination not rewritten for %s:\n%s", pathB, cfgB)
	}

	srcImages, srcWork := filepath.Join(base, "src-work", "images"), filepath.Join(base, "src-work")
	dstImages, dstWork := filepath.Join(base, "dst-work", "images"), filepath.Join(base, "dst-work")
	addr, psDone := pageServer(t, dstImages)

	t0 := time.Now()
	if err := src.Freeze(ctx, c); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	d, err := src.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: srcImages, WorkDir: srcWork, PageServer: addr, TCPEstablished: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	if err := psDone(); err != nil {
		t.Fatalf("page server: %v", err)
	}
	t.Logf("freeze %v, checkpoint %v", t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond))

	// The source is frozen, not stopped: resumable until the commit.
	if got, err := src.Inspect(ctx, name); err != nil || got.Status != "paused" {
		t.Fatalf("source after the dump: %+v, %v (want paused)", got, err)
	}
	frozenAt := ct.counter(t)
	time.Sleep(300 * time.Millisecond)
	if n := ct.counter(t); n != frozenAt {
		t.Fatalf("source counter moved from %d to %d while frozen", frozenAt, n)
	}
	// The CRIU that ran is ferry's, and memory went to the page server.
	dumpLog, err := os.ReadFile(filepath.Join(srcWork, "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dumpLog), "Version: 4.2") {
		t.Fatalf("dump.log names another CRIU: %s", tail.Lines(string(dumpLog[:min(len(dumpLog), 400)]), 3))
	}
	if _, err := os.Stat(filepath.Join(srcWork, "stats-dump")); err != nil {
		t.Errorf("no stats-dump in the work directory: %v", err)
	}
	pages, _ := filepath.Glob(filepath.Join(dstImages, "pages-*.img"))
	if len(pages) == 0 {
		t.Fatal("the page server received no pages")
	}

	copyTree(t, ct.rootfs, tgt.RootfsDir())
	copyImages(t, srcImages, dstImages)

	t3 := time.Now()
	pid, err := tgt.Restore(ctx, runtime.RestoreOptions{ImagesDir: dstImages, WorkDir: dstWork, TCPEstablished: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore %v (until lxc-info FROZEN)", time.Since(t3).Round(time.Millisecond))

	// Restored frozen: until the commit (Start) none of it runs.
	if state, infoPID := lxcState(t, pathB, name); state != "FROZEN" || infoPID != pid {
		t.Fatalf("destination before Start: lxc-info %s PID %d, Restore returned PID %d", state, infoPID, pid)
	}
	if _, err := askMemhogWithin(pid, "VERIFY", 300*time.Millisecond); err == nil {
		t.Fatal("the restored copy answered before Start")
	}
	if err := tgt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tgt.Start(ctx); err != nil {
		t.Errorf("Start again: %v", err)
	}

	state, infoPID := lxcState(t, pathB, name)
	if state != "RUNNING" || infoPID != pid {
		t.Fatalf("destination: lxc-info %s PID %d, Restore returned PID %d", state, infoPID, pid)
	}
	if !contains(listed(t, "-P", pathB, "--running"), name) {
		t.Fatalf("lxc-ls --running -P %s does not list %s", pathB, name)
	}
	moved := testContainer{lxcpath: pathB, name: name, rootfs: tgt.RootfsDir()}
	if n := moved.waitAdvancing(t, frozenAt); n < frozenAt {
		t.Fatalf("counter restarted at the destination: %d after %d", n, frozenAt)
	}
	after, err := askMemhog(pid, "VERIFY")
	if err != nil {
		t.Fatal(err)
	}
	if !after.VerifyOK || after.Boot != before.Boot || after.Counter < before.Counter {
		t.Fatalf("memhog after the move: %+v, before: %+v", after, before)
	}

	// The commit: the source copy goes.
	if err := src.Remove(ctx, c); err != nil {
		t.Fatal(err)
	}
	if contains(listed(t, "-P", pathA), name) {
		t.Fatalf("lxc-ls -P %s still lists %s", pathA, name)
	}
	if _, err := src.Inspect(ctx, name); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Inspect after Remove: %v", err)
	}
	if err := src.Remove(ctx, c); err != nil {
		t.Fatalf("Remove twice: %v", err)
	}
	// The destination's copy runs on alone, and LXC manages it.
	moved.waitAdvancing(t, moved.counter(t))
	if out, err := lxcCmd(t, "lxc-stop", "-P", pathB, "-n", name, "-t", "10"); err != nil {
		t.Fatalf("lxc-stop at the destination: %v: %s", err, out)
	}
	if st, _ := lxcState(t, pathB, name); st != "STOPPED" {
		t.Fatalf("after lxc-stop: %s", st)
	}
	if out, err := lxcCmd(t, "lxc-destroy", "-P", pathB, "-n", name); err != nil {
		t.Fatalf("lxc-destroy at the destination: %v: %s", err, out)
	}
	if contains(listed(t, "-P", pathB), name) {
		t.Fatalf("lxc-ls -P %s still lists %s after lxc-destroy", pathB, name)
	}
	// The v2 cgroup CRIU restored the copy into is left by liblxc's tools
	// where both hosts share this kernel (cgroups.go).
	if err := RemoveIdleCgroups(name); err != nil {
		t.Fatal(err)
	}
	if left := containerCgroups(cgroups.Root, name); len(left) > 0 {
		t.Errorf("cgroups of %s left: %v", name, left)
	}
}

// TestCheckpointThenThaw: after a dump, failed or not, the source is
// frozen and Thaw makes it run on from where it was.
func TestCheckpointThenThaw(t *testing.T) {
	requireTools(t)
	memhog := memhogBinary(t)
	ctx := context.Background()
	base := t.TempDir()
	rt := New(filepath.Join(base, "a"))
	name := testName("thaw")
	ct := newContainer(t, rt.LXCPath, name, memhog)
	c, err := rt.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	before, err := askMemhog(c.PID, "STAT")
	if err != nil {
		t.Fatal(err)
	}

	resumes := func(t *testing.T, d runtime.Dump) {
		t.Helper()
		if got, err := rt.Inspect(ctx, name); err != nil || got.Status != "paused" {
			t.Fatalf("after the dump: %+v, %v (want paused)", got, err)
		}
		n := ct.counter(t)
		time.Sleep(300 * time.Millisecond)
		if m := ct.counter(t); m != n {
			t.Fatalf("counter moved from %d to %d while frozen", n, m)
		}
		if d != nil {
			if err := d.Release(ctx, false); err != nil {
				t.Fatal(err)
			}
		}
		if err := rt.Thaw(ctx, c); err != nil {
			t.Fatal(err)
		}
		if st, err := runtime.State(ctx, rt, name); err != nil || st != "running" {
			t.Fatalf("after Thaw: %q, %v", st, err)
		}
		if st, _ := lxcState(t, rt.LXCPath, name); st != "RUNNING" {
			t.Fatalf("lxc-info after Thaw: %s", st)
		}
		if m := ct.waitAdvancing(t, n); m < n {
			t.Fatalf("counter restarted: %d after %d", m, n)
		}
		r, err := askMemhog(c.PID, "VERIFY")
		if err != nil || !r.VerifyOK || r.Boot != before.Boot {
			t.Fatalf("memhog after Thaw: %+v, %v", r, err)
		}
	}

	t.Run("failed dump", func(t *testing.T) {
		// Nobody listens on the page server's port: CRIU fails after it
		// froze and seized the tree.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if err := rt.Freeze(ctx, c); err != nil {
			t.Fatal(err)
		}
		work := filepath.Join(base, "fail")
		_, err = rt.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: filepath.Join(work, "images"), WorkDir: work, PageServer: addr})
		if err == nil {
			t.Fatal("a dump to a closed page server succeeded")
		}
		if !strings.Contains(err.Error(), "Can't connect to server") {
			t.Errorf("the error does not quote CRIU's reason: %v", err)
		}
		t.Logf("expected failure: %v", err)
		resumes(t, nil)
	})
	t.Run("dump then thaw", func(t *testing.T) {
		work := filepath.Join(base, "ok")
		addr, psDone := pageServer(t, filepath.Join(base, "received"))
		if err := rt.Freeze(ctx, c); err != nil {
			t.Fatal(err)
		}
		d, err := rt.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: filepath.Join(work, "images"), WorkDir: work, PageServer: addr})
		if err != nil {
			t.Fatal(err)
		}
		if err := psDone(); err != nil {
			t.Fatal(err)
		}
		resumes(t, d)
	})
	t.Run("dump of a running container freezes it", func(t *testing.T) {
		work := filepath.Join(base, "running")
		addr, psDone := pageServer(t, filepath.Join(base, "received2"))
		d, err := rt.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: filepath.Join(work, "images"), WorkDir: work, PageServer: addr})
		if err != nil {
			t.Fatal(err)
		}
		if err := psDone(); err != nil {
			t.Fatal(err)
		}
		resumes(t, d)
	})
}

// TestBadInput: refusals come before anything is frozen, and say why.
func TestBadInput(t *testing.T) {
	requireTools(t)
	ctx := context.Background()
	base := t.TempDir()
	pathA, pathB := filepath.Join(base, "a"), filepath.Join(base, "b")
	src, dst := New(pathA), New(pathB)
	name := testName("bad")

	if _, err := src.Inspect(ctx, name); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect of a missing container: %v, want ErrNotFound", err)
	}
	if _, err := src.Inspect(ctx, "../etc"); err == nil {
		t.Error("Inspect accepted a path as a name")
	}
	missing := &runtime.Container{Runtime: "lxc", Name: name, ID: name}
	if err := src.Remove(ctx, missing); err != nil {
		t.Errorf("Remove of a missing container: %v", err)
	}
	if _, err := src.Checkpoint(ctx, missing, runtime.CheckpointOptions{ImagesDir: filepath.Join(base, "i"), WorkDir: base}); err == nil {
		t.Error("Checkpoint of a missing container succeeded")
	}
	if _, err := src.Checkpoint(ctx, missing, runtime.CheckpointOptions{ImagesDir: filepath.Join(base, "i"), WorkDir: base, Lazy: true}); err == nil || !strings.Contains(err.Error(), "lazy") {
		t.Errorf("lazy Checkpoint: %v", err)
	}

	cfg := func(extra string) []byte {
		return []byte(fmt.Sprintf("lxc.uts.name = %s\nlxc.rootfs.path = dir:%s/%s/rootfs\nlxc.net.0.type = empty\nlxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio\n%s", name, pathA, name, extra))
	}
	in := func(extra string) *runtime.Container {
		return &runtime.Container{Runtime: "lxc", Name: name, ID: name,
			Meta: map[string][]byte{"config": cfg(extra), "lxcpath": []byte(pathA)}}
	}

	// The name is taken at the destination.
	if err := os.MkdirAll(filepath.Join(pathB, name), 0o770); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pathB, name, "config"), cfg(""), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := dst.Prepare(ctx, in(""), runtime.PrepareOptions{})
	if err == nil || !strings.Contains(err.Error(), "already has a container named") {
		t.Errorf("Prepare over an existing container: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pathB, name, "config")); err != nil {
		t.Errorf("a refused Prepare touched the existing container: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(pathB, name)); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ extra, want string }{
		{"lxc.net.1.type = veth\nlxc.net.1.link = ferrynobr0\n", `no network interface "ferrynobr0"`},
		{"lxc.tty.max = 4\n", "lxc.tty.max"},
		{"lxc.net.1.type = vlan\n", "vlan"},
		{"lxc.mount.entry = /ferry-no-such-dir mnt none bind 0 0\n", "/ferry-no-such-dir does not exist"},
		{"lxc.include = /ferry/no/such.conf\n", "/ferry/no/such.conf"},
	} {
		_, err := dst.Prepare(ctx, in(tc.extra), runtime.PrepareOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Prepare with %q: %v, want an error naming %q", tc.extra, err, tc.want)
		}
		if _, serr := os.Stat(filepath.Join(pathB, name)); serr == nil {
			t.Errorf("a refused Prepare (%q) left %s behind", tc.extra, filepath.Join(pathB, name))
			_ = os.RemoveAll(filepath.Join(pathB, name))
		}
	}
	overlay := in("")
	overlay.Meta["config"] = []byte("lxc.rootfs.path = overlay:/a:/b\n")
	if _, err := dst.Prepare(ctx, overlay, runtime.PrepareOptions{}); err == nil || !strings.Contains(err.Error(), "overlay") {
		t.Errorf("Prepare of an overlay rootfs: %v", err)
	}
	if _, err := dst.Prepare(ctx, &runtime.Container{Name: name}, runtime.PrepareOptions{}); err == nil {
		t.Error("Prepare without a config succeeded")
	}

	// A good one, then Discard leaves nothing.
	tgt, err := dst.Prepare(ctx, in(""), runtime.PrepareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(tgt.RootfsDir()); err != nil || !st.IsDir() {
		t.Fatalf("no empty rootfs: %v", err)
	}
	if err := tgt.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pathB, name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Discard left %s: %v", filepath.Join(pathB, name), err)
	}
}

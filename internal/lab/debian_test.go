package lab

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime/podman"
)

func TestDebianKey(t *testing.T) {
	a := DebianOptions{CacheDir: "/c", Packages: []string{"redis-server", "python3"}}
	b := DebianOptions{CacheDir: "/c", Packages: []string{"python3", "redis-server", "python3"}}
	c := DebianOptions{CacheDir: "/c", Packages: []string{"redis-server"}}
	if a.Key() != b.Key() {
		t.Errorf("the key depends on the packages' order: %s vs %s", a.Key(), b.Key())
	}
	if a.Key() == c.Key() {
		t.Error("the key ignores the package list")
	}
	if want := "/c/debian-bookworm-" + a.Key() + ".tar"; a.Path() != want {
		t.Errorf("Path %s, want %s", a.Path(), want)
	}
	if got := a.ImageName(); got != "localhost/ferry-debian:"+a.Key() {
		t.Errorf("ImageName %s", got)
	}
	if got := (DebianOptions{}).Path(); !strings.HasPrefix(got, DefaultRootfsCache()+"/debian-bookworm-") {
		t.Errorf("default Path %s", got)
	}
}

// needDebianRootfs returns the cached Debian root filesystem, building it
// if needed; it skips (saying why) when it can be neither found nor built.
func needDebianRootfs(t *testing.T) DebianRootfs {
	t.Helper()
	testroot.Require(t, "needs root: the root filesystem keeps its owners")
	for _, tool := range []string{"tar", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	o := DebianOptions{}
	if _, err := os.Stat(o.Path()); err != nil {
		_, e1 := exec.LookPath("mmdebstrap")
		_, e2 := exec.LookPath("debootstrap")
		if e1 != nil && e2 != nil {
			t.Skip("SKIP (not a pass): neither mmdebstrap nor debootstrap is installed (make setup)")
		}
		if err := DebianMirrorReachable(context.Background(), o, 5*time.Second); err != nil {
			t.Skipf("SKIP (not a pass): no cached Debian root filesystem and the mirror is unreachable: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	r, err := EnsureDebianRootfs(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Built {
		t.Logf("built %s with %s in %.1f s", r.Tarball, r.Tool, time.Since(start).Seconds())
	}
	return r
}

// testWorkloadDir is a directory holding a static memhog: the one `make
// build` made (FERRY_BIN's directory or the repository's bin), or busybox
// standing in for it.
func testWorkloadDir(t *testing.T) (dir string, realMemhog bool) {
	t.Helper()
	var dirs []string
	if b := os.Getenv("FERRY_BIN"); b != "" {
		dirs = append(dirs, filepath.Dir(b))
	}
	if abs, err := filepath.Abs("../../bin"); err == nil {
		dirs = append(dirs, abs)
	}
	for _, d := range dirs {
		if requireStatic(filepath.Join(d, "memhog"), "") == nil {
			return d, true
		}
	}
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("no memhog (make build) and no %s to stand in for it", BusyboxPath)
	}
	d := t.TempDir()
	if err := copyFile(BusyboxPath, filepath.Join(d, "memhog")); err != nil {
		t.Fatal(err)
	}
	return d, false
}

type treeCount struct {
	entries, files, dirs, links int
	bytes                       int64
}

func countTree(t *testing.T, dir string) treeCount {
	t.Helper()
	var c treeCount
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		c.entries++
		switch {
		case d.Type().IsRegular():
			c.files++
			if fi, err := d.Info(); err == nil {
				c.bytes += fi.Size()
			}
		case d.IsDir():
			c.dirs++
		case d.Type()&fs.ModeSymlink != 0:
			c.links++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDebianRootfs(t *testing.T) {
	r := needDebianRootfs(t)
	ctx := context.Background()

	// The second call finds the cache.
	start := time.Now()
	again, err := EnsureDebianRootfs(ctx, DebianOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); again.Built || again.Tarball != r.Tarball || took > time.Second {
		t.Errorf("second call: %+v in %v, want the cached %s at once", again, took, r.Tarball)
	}
	st, err := os.Stat(r.Tarball)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cached %s: %.0f MiB, found again in %v", r.Tarball, float64(st.Size())/(1<<20), time.Since(start))
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(r.Tarball), ".build-*")); len(left) > 0 {
		t.Errorf("build directories left in the cache: %v", left)
	}

	bins, realMemhog := testWorkloadDir(t)
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	start = time.Now()
	if err := layDebianRootfs(ctx, r.Tarball, rootfs, bins); err != nil {
		t.Fatal(err)
	}
	c := countTree(t, rootfs)
	t.Logf("laid out in %.1f s: %d entries (%d files, %d directories, %d symlinks), %.0f MiB of file data",
		time.Since(start).Seconds(), c.entries, c.files, c.dirs, c.links, float64(c.bytes)/(1<<20))
	if c.entries <= 10_000 {
		t.Errorf("%d entries, want more than 10,000 (a real distribution's root filesystem)", c.entries)
	}
	for _, f := range []string{"usr/bin/redis-server", "usr/bin/redis-cli", "usr/bin/python3", "usr/local/bin/memhog", "etc/hosts", "etc/passwd"} {
		if _, err := os.Stat(filepath.Join(rootfs, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(rootfs, "dev")); len(ents) > 0 {
		t.Errorf("device files laid out: /dev has %d entries", len(ents))
	}
	// Owners survive: redis's home belongs to the redis user.
	if fi, err := os.Stat(filepath.Join(rootfs, "var/lib/redis")); err != nil {
		t.Error(err)
	} else if uid := fi.Sys().(*syscall.Stat_t).Uid; uid == 0 {
		t.Error("/var/lib/redis belongs to root: owners were not kept")
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || fi.Mode()&fs.ModeSticky == 0 {
		t.Errorf("/tmp is not sticky: %v", err)
	}

	out, err := exec.Command("chroot", rootfs, "redis-server", "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Redis server v=") {
		t.Fatalf("chroot redis-server --version: %v: %s", err, out)
	}

	// A real runc container: redis-server in a private network namespace,
	// asked by redis-cli from inside.
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skipf("SKIP (not a pass) of the container part: no runc: %v", err)
	}
	rc := runc.Host{Root: t.TempDir()}
	const id = "ferry-debian-test"
	spec := runc.NewSpec(runc.SpecOptions{
		Args:        []string{"redis-server", "--save", "", "--appendonly", "no"},
		Hostname:    id,
		CgroupsPath: "/" + id,
	})
	if err := runc.WriteSpec(bundle, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rc.Delete(context.Background(), id); err != nil {
			t.Errorf("runc delete: %v", err)
		}
	})
	if err := rc.Run(ctx, id, bundle, filepath.Join(bundle, "runc.log")); err != nil {
		t.Fatal(err)
	}
	exec1 := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "runc", append([]string{"--root", rc.Root, "exec", id}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	var pong string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if pong, err = exec1("redis-cli", "ping"); err == nil && pong == "PONG" {
			break
		}
	}
	if pong != "PONG" {
		t.Fatalf("redis-cli ping in the container: %q, %v", pong, err)
	}
	if out, err := exec1("redis-cli", "set", "ferry", "debian"); err != nil || out != "OK" {
		t.Errorf("redis-cli set: %q, %v", out, err)
	}
	if out, err := exec1("redis-cli", "get", "ferry"); err != nil || out != "debian" {
		t.Errorf("redis-cli get: %q, %v", out, err)
	}
	if out, err := exec1("id", "-un"); err != nil || out != "root" {
		t.Errorf("id -un: %q, %v", out, err)
	}
	if !realMemhog {
		t.Log("memhog is busybox here (no `make build`): not started")
		return
	}
	// ferry's memhog beside it, asked over UDP by Debian's python3.
	// No pipes: the detached memhog would inherit them and keep runc's
	// caller waiting.
	if err := exec.Command("runc", "--root", rc.Root, "exec", "--detach", id,
		"memhog", "--memory", "4M", "--port", "7000").Run(); err != nil {
		t.Fatalf("start memhog: %v", err)
	}
	const stat = `import socket,sys
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(0.5)
s.sendto(b"STAT",("127.0.0.1",7000)); print(s.recv(4096).decode())`
	var reply string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if reply, err = exec1("python3", "-c", stat); err == nil && strings.Contains(reply, "{") {
			break
		}
	}
	if !strings.Contains(reply, "{") {
		t.Errorf("memhog STAT from python3 in the container: %q, %v", reply, err)
	} else {
		t.Logf("memhog in Debian answers: %s", reply)
	}
}

func TestDebianPodmanImage(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skipf("SKIP (not a pass): no podman (make setup): %v", err)
	}
	r := needDebianRootfs(t)
	bins, _ := testWorkloadDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const ns = "ferry-debtest"
	_ = exec.Command("ip", "netns", "delete", ns).Run()
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	// Podman refuses a run root longer than 50 characters, which
	// t.TempDir's names can exceed.
	dir, err := os.MkdirTemp("", "ferry-dp-")
	if err != nil {
		t.Fatal(err)
	}
	h := podman.Host{Dir: dir, NetNS: ns}
	t.Cleanup(func() {
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := h.Cleanup(ctx); err != nil {
			t.Errorf("podman cleanup: %v", err)
		}
	})

	start := time.Now()
	image, err := ImportDebianImage(ctx, h, DebianOptions{}, bins)
	if err != nil {
		t.Fatal(err)
	}
	if want := "localhost/ferry-debian:" + r.Key; image != want {
		t.Errorf("image %s, want %s", image, want)
	}
	t.Logf("imported %s in %.1f s", image, time.Since(start).Seconds())

	const name = "ferry-debian-redis"
	if err := h.Run(ctx, name, image, []string{"redis-server", "--save", "", "--appendonly", "no"}); err != nil {
		t.Fatal(err)
	}
	var pong string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if pong, err = h.Exec(ctx, name, "redis-cli", "ping"); err == nil && strings.TrimSpace(pong) == "PONG" {
			break
		}
	}
	if strings.TrimSpace(pong) != "PONG" {
		t.Fatalf("redis-cli ping in the Podman container: %q, %v", pong, err)
	}
	if out, err := h.Exec(ctx, name, "ls", "/usr/local/bin"); err != nil || !slices.Contains(strings.Fields(out), "memhog") {
		t.Errorf("memhog in the image: %q, %v", out, err)
	}
}

// Lab.RunWith with the Debian root filesystem, on a lab host of its own
// that no lab knows (its own state directory and cgroup parent, a private
// network namespace): it runs next to a lab that others use.
func TestDebianLabRun(t *testing.T) {
	testroot.Require(t, "needs root for runc and cgroups")
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skipf("SKIP (not a pass): no runc: %v", err)
	}
	needDebianRootfs(t)
	bins, _ := testWorkloadDir(t)
	ctx := context.Background()
	h := newHost(9)
	h.StateDir = t.TempDir()
	h.CgroupParent = fmt.Sprintf("ferry-debtest-%d", os.Getpid())
	h.NetNS = ""
	l := &Lab{Hosts: []Host{h}, FerryBin: filepath.Join(bins, "ferry")}
	rc := h.Runc()
	t.Cleanup(func() {
		// The container, then its bundle with the overlay mounted there.
		if err := l.RemoveFrom(context.Background(), "runc", h.Name, "kv"); err != nil {
			t.Errorf("remove the container: %v", err)
		}
		dirs, _ := filepath.Glob(filepath.Join(cgroups.Root, "*", h.CgroupParent))
		for _, d := range dirs {
			if err := os.Remove(d); err != nil {
				t.Errorf("cgroup %s: %v", d, err)
			}
		}
	})
	if err := l.RunWith(ctx, "h9", "bad", RunOptions{Rootfs: "alpine"}, []string{"true"}); err == nil || !strings.Contains(err.Error(), "unknown root filesystem") {
		t.Errorf("RunWith an unknown rootfs: %v", err)
	}
	if err := l.RunWith(ctx, "h9", "bad", RunOptions{Packages: []string{"memcached"}}, []string{"true"}); err == nil || !strings.Contains(err.Error(), "packages need the debian root filesystem") {
		t.Errorf("RunWith packages on busybox: %v", err)
	}
	start := time.Now()
	if err := l.RunWith(ctx, "h9", "kv", RunOptions{Rootfs: RootfsDebian},
		[]string{"redis-server", "--save", "", "--appendonly", "no"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("Debian container started in %.1f s", time.Since(start).Seconds())
	var out []byte
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, err = exec.Command("runc", "--root", rc.Root, "exec", "kv", "redis-cli", "ping").CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == "PONG" {
			break
		}
	}
	if strings.TrimSpace(string(out)) != "PONG" {
		t.Fatalf("redis-cli ping in the lab container: %q, %v", out, err)
	}
	// The image below, shared; the container's own layer above, where
	// the workloads went.
	if ov, err := mounts.OverlayAt(filepath.Join(h.BundleDir("kv"), "rootfs")); err != nil || ov == nil ||
		len(ov.Lower) != 1 || filepath.Dir(ov.Lower[0]) != DebianImageRoot() {
		t.Errorf("the root is not an overlay over an image below %s: %+v %v", DebianImageRoot(), ov, err)
	}
	if _, err := os.Stat(filepath.Join(h.BundleDir("kv"), "upper", "usr/local/bin/memhog")); err != nil {
		t.Errorf("memhog in the container's own layer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cgroups.Root, "memory", h.CgroupParent, "kv")); err != nil {
		t.Errorf("container cgroup: %v", err)
	}
}

// The fallback builder, slower (a few minutes) and so run only on request:
// FERRY_TEST_DEBOOTSTRAP=1. It builds into a cache of its own.
func TestDebianDebootstrap(t *testing.T) {
	if os.Getenv("FERRY_TEST_DEBOOTSTRAP") == "" {
		t.Skip("SKIP (not a pass): set FERRY_TEST_DEBOOTSTRAP=1 to build with debootstrap (a few minutes)")
	}
	testroot.Require(t, "needs root")
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Skipf("SKIP (not a pass): no debootstrap: %v", err)
	}
	o := DebianOptions{CacheDir: t.TempDir(), Tool: "debootstrap"}
	if err := DebianMirrorReachable(context.Background(), o, 5*time.Second); err != nil {
		t.Skipf("SKIP (not a pass): the Debian mirror is unreachable: %v", err)
	}
	start := time.Now()
	r, err := EnsureDebianRootfs(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Built || r.Tool != "debootstrap" {
		t.Errorf("%+v, want built by debootstrap", r)
	}
	t.Logf("debootstrap built %s in %.1f s", r.Tarball, time.Since(start).Seconds())
	bins, _ := testWorkloadDir(t)
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := layDebianRootfs(context.Background(), r.Tarball, rootfs, bins); err != nil {
		t.Fatal(err)
	}
	c := countTree(t, rootfs)
	t.Logf("%d entries, %.0f MiB", c.entries, float64(c.bytes)/(1<<20))
	if out, err := exec.Command("chroot", rootfs, "redis-server", "--version").CombinedOutput(); err != nil {
		t.Errorf("chroot redis-server --version: %v: %s", err, out)
	}
	if left, _ := mounts.Under(o.CacheDir); len(left) > 0 {
		t.Errorf("mounts left: %v", left)
	}
}

package podman

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/mounts"
)

// counterLoop counts in /tmp/c, replacing the file whole (a reader never
// sees it truncated).
const counterLoop = `i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done`

func requireTools(t *testing.T) {
	t.Helper()
	testroot.Require(t, "needs root")
	for _, tool := range []string{"podman", "criu", "nsenter", "ip", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s in PATH", tool)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs /bin/busybox (busybox-static)")
	}
}

// addNetNS creates a network namespace with loopback up, deleted at the end.
func addNetNS(t *testing.T, name string) {
	t.Helper()
	_ = exec.Command("ip", "netns", "delete", name).Run() // left over from a crash
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", name, err, out)
	}
}

// busyboxRootfs builds a minimal root filesystem around busybox-static.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(filepath.Join(dir, "bin", "busybox"), os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "cat", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// keepMachineTidy removes what Podman leaves outside the hosts' own
// directories, if it was not there before the test: the cgroupfs parent
// (libpod_parent/conmon) and containers/image's blob-info cache, which
// lives in /var/lib/containers/cache whatever --root says.
func keepMachineTidy(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/sys/fs/cgroup/memory/libpod_parent"); errors.Is(err, os.ErrNotExist) {
		t.Cleanup(func() {
			dirs, _ := filepath.Glob("/sys/fs/cgroup/*/libpod_parent")
			for _, d := range dirs {
				_ = syscall.Rmdir(filepath.Join(d, "conmon"))
				_ = syscall.Rmdir(d)
			}
		})
	}
	if _, err := os.Stat("/var/lib/containers"); errors.Is(err, os.ErrNotExist) {
		t.Cleanup(func() {
			_ = os.Remove("/var/lib/containers/cache/blob-info-cache-v1.boltdb")
			_ = syscall.Rmdir("/var/lib/containers/cache")
			_ = syscall.Rmdir("/var/lib/containers")
		})
	}
}

func copyFile(_ context.Context, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func counter(ctx context.Context, t *testing.T, h Host, name string) int {
	t.Helper()
	out, err := h.Exec(ctx, name, "/bin/busybox", "cat", "/tmp/c")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("counter %q: %v", out, err)
	}
	return n
}

func netnsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestBaselineAcrossNetns(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	keepMachineTidy(t)
	addNetNS(t, "ferry-ptest-a")
	addNetNS(t, "ferry-ptest-b")
	rootfs := busyboxRootfs(t)
	base := t.TempDir()
	a := Host{Dir: filepath.Join(base, "a"), NetNS: "ferry-ptest-a"}
	b := Host{Dir: filepath.Join(base, "b"), NetNS: "ferry-ptest-b"}
	var restoredPid int
	t.Cleanup(func() {
		// A fresh context: the test's own may have expired.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, h := range []Host{b, a} {
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
		if restoredPid > 0 {
			if err := syscall.Kill(restoredPid, 0); err == nil {
				t.Errorf("container process %d still alive", restoredPid)
			}
		}
	})

	const image, name = "ferry-ptest", "ferry-ptest-ctr"
	for _, h := range []Host{a, b} {
		if err := h.ImportRootfs(ctx, rootfs, image); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for _, h := range []Host{a, b} {
		out, err := h.podman(ctx, "image", "inspect", "--format", "{{.Id}}", qualify(image))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	if ids[0] != ids[1] {
		t.Fatalf("image IDs differ between hosts: %s vs %s", ids[0], ids[1])
	}

	if err := a.Run(ctx, name, image, []string{"sh", "-c", counterLoop}); err != nil {
		t.Fatal(err)
	}
	// Wait for the first counter value.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := a.Exec(ctx, name, "/bin/busybox", "cat", "/tmp/c"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("counter never appeared in the container")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	before := counter(ctx, t, a, name)

	times, err := Baseline(ctx, a, b, name, copyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("podman baseline, busybox counter: checkpoint %.1f ms, copy %.1f ms, restore %.1f ms, downtime %.1f ms, archive %d bytes",
		times.CheckpointMs, times.CopyMs, times.RestoreMs, times.DowntimeMs, times.ArchiveBytes)
	if times.ArchiveBytes <= 0 || times.DowntimeMs < times.CheckpointMs+times.RestoreMs {
		t.Errorf("implausible times %+v", times)
	}

	running, err := b.Inspect(ctx, name, "{{.State.Running}}")
	if err != nil || running != "true" {
		t.Fatalf("container on b: running=%q err=%v", running, err)
	}
	pidStr, err := b.Inspect(ctx, name, "{{.State.Pid}}")
	if err != nil {
		t.Fatal(err)
	}
	restoredPid, _ = strconv.Atoi(pidStr)
	if got, want := netnsInode(t, "/proc/"+pidStr+"/ns/net"), netnsInode(t, "/var/run/netns/ferry-ptest-b"); got != want {
		t.Errorf("restored container not in b's network namespace")
	}
	after := counter(ctx, t, b, name)
	if after <= before {
		t.Fatalf("counter did not continue: %d before checkpoint, %d after restore", before, after)
	}
	time.Sleep(300 * time.Millisecond)
	if later := counter(ctx, t, b, name); later <= after {
		t.Fatalf("counter stopped on b: %d then %d", after, later)
	}

	out, err := a.podman(ctx, "ps", "--all", "--format", "{{.Names}}")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, name) {
		t.Fatalf("source host still has the container: %q", out)
	}
	for _, p := range []string{a.path("checkpoints", name+".tar"), b.path("checkpoints", name+".tar")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("archive %s left behind", p)
		}
	}
}

func TestCleanupMissingDir(t *testing.T) {
	h := Host{Dir: filepath.Join(t.TempDir(), "never-used")}
	if err := h.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := (Host{}).Cleanup(context.Background()); err == nil {
		t.Fatal("Cleanup with empty Dir should fail")
	}
}

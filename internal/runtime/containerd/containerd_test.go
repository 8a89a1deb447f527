package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
)

// Two containerd daemons of the test's own on this machine stand for two
// hosts; a container moves from a to b through the adapter's steps, its
// images copied by hand (the engine's part, tested in internal/e2e).

const image = "localhost/ferry-ctr-test:latest"

// counter counts in the container's writable layer: a restored copy goes
// on from where the source stopped.
var counter = []string{"/bin/sh", "-c", `echo moved > /etc/ferry-marker
i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done`}

type host struct {
	d  containerd.Daemon
	rt *containerd.Runtime
}

func requireTools(t *testing.T) {
	t.Helper()
	testroot.Require(t, "needs root")
	for _, tool := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "criu", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s in PATH (apt-get install containerd runc; CRIU from make setup)", tool)
		}
	}
}

// rootfs builds the busybox root filesystem with ferry's workloads from
// the repository's bin/ (make build).
func rootfs(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs("../../../bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bin, "memhog")); err != nil {
		t.Skipf("needs %s/memhog: run make build", bin)
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := lab.BuildRootfsFrom(dir, bin); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newHosts starts daemons a and b (b without the image when bareB), all
// stopped and removed at the test's end.
func newHosts(t *testing.T, bareB bool) (a, b host) {
	t.Helper()
	requireTools(t)
	root := rootfs(t)
	base, err := os.MkdirTemp("", "ferry-ctr-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hosts := []*host{&a, &b}
	for i, h := range hosts {
		name := string(rune('a' + i))
		h.d = containerd.Daemon{Dir: filepath.Join(base, name)}
		h.rt = &containerd.Runtime{Address: h.d.Socket(), RuncRoot: h.d.RuncRoot(), CgroupParent: "ferry-ctrtest-" + name,
			StateDir: filepath.Join(base, name, "ferry")}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, h := range hosts {
			_ = h.rt.Close()
			if err := h.d.Stop(ctx); err != nil {
				t.Errorf("stop %s: %v", h.d.Dir, err)
			}
		}
		if left, _ := mounts.Under(base); len(left) > 0 {
			t.Errorf("mounts left behind: %v", left)
		}
		_ = os.RemoveAll(base)
		// The cgroup parents the tasks were made under.
		for _, parent := range []string{"/ferry-ctrtest-src", "/" + a.rt.CgroupParent, "/" + b.rt.CgroupParent} {
			if err := cgroups.Destroy(cgroups.Root, parent); err != nil {
				t.Errorf("cgroup %s left behind: %v", parent, err)
			}
		}
	})
	for i, h := range hosts {
		if err := h.d.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 1 && bareB {
			continue
		}
		if err := containerd.ImportRootfs(ctx, h.d.Socket(), "default", root, image); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

func (h host) run(t *testing.T, id string) {
	t.Helper()
	err := h.d.Run(context.Background(), containerd.RunOptions{ID: id, Image: image, Args: counter,
		CgroupsPath: "/ferry-ctrtest-src/" + id, Log: filepath.Join(h.d.Dir, id+".log")})
	if err != nil {
		t.Fatal(err)
	}
}

// ctr runs containerd's own CLI against the host's daemon.
func (h host) ctr(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ctr", append([]string{"--address", h.d.Socket()}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// tasks is `ctr tasks ls` as ID:STATUS words.
func (h host) tasks(t *testing.T) string {
	var l []string
	for _, line := range strings.Split(h.ctr(t, "-n", "default", "tasks", "ls"), "\n")[1:] {
		if f := strings.Fields(line); len(f) == 3 {
			l = append(l, f[0]+":"+f[2])
		}
	}
	return strings.Join(l, " ")
}

// count reads the container's counter through its init's root.
func count(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/c", pid))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// copyTree copies the source's writable layer into the destination's,
// overlay whiteouts included.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// dump freezes and checkpoints c at a into dir (pages included: no page
// server), leaving it paused.
func dump(ctx context.Context, t *testing.T, a host, c *runtime.Container, dir string) {
	t.Helper()
	if err := a.rt.Freeze(ctx, c); err != nil {
		t.Fatal(err)
	}
	d, err := a.rt.Checkpoint(ctx, c, runtime.CheckpointOptions{ImagesDir: filepath.Join(dir, "images"), WorkDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(); err != nil {
		t.Fatal(err)
	}
	if s, err := a.rt.Inspect(ctx, c.Name); err != nil || s.Status != "paused" {
		t.Fatalf("source after the dump: %+v %v", s, err)
	}
}

func TestMoveBetweenDaemons(t *testing.T) {
	a, b := newHosts(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const id = "ferry-ctr-move"
	a.run(t, id)
	time.Sleep(300 * time.Millisecond)

	c, err := a.rt.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if c.Runtime != "containerd" || c.Name != id || c.ID != id || c.Status != "running" || !alive(c.PID) || !strings.HasPrefix(c.Image, image+"@sha256:") {
		t.Fatalf("inspect: %+v", c)
	}
	if b, err := os.ReadFile(filepath.Join(c.Rootfs, "etc", "ferry-marker")); err != nil || string(b) != "moved\n" {
		t.Fatalf("Rootfs %s is not the writable layer: %q %v", c.Rootfs, b, err)
	}
	if _, err := a.rt.Inspect(ctx, "other/"+id); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("inspect in another namespace: %v", err)
	}

	work := t.TempDir()
	tgt, err := b.rt.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(tgt.RootfsDir()); err != nil || !st.IsDir() {
		t.Fatalf("RootfsDir %s: %v", tgt.RootfsDir(), err)
	}
	if got := b.tasks(t); got != "" {
		t.Fatalf("b has tasks after prepare: %q", got)
	}
	dump(ctx, t, a, c, work)
	before := count(t, c.PID)
	copyTree(t, c.Rootfs, tgt.RootfsDir())

	pid, err := tgt.Restore(ctx, runtime.RestoreOptions{ImagesDir: filepath.Join(work, "images"), WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	// Restored stopped until Start, though containerd says running.
	if got := b.tasks(t); got != id+":RUNNING" {
		t.Fatalf("ctr tasks ls at b before Start: %q", got)
	}
	tree := append([]int{pid}, procs.Descendants(pid, "")...)
	for _, q := range tree {
		if st, ok := procs.State(q); ok && st != 'T' {
			t.Errorf("process %d of the restored copy is in state %c before Start, want T", q, st)
		}
	}
	if err := tgt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pid); n < before {
		t.Fatalf("count at b %d, at a it had reached %d", n, before)
	}
	time.Sleep(300 * time.Millisecond)
	if n := count(t, pid); n <= before {
		t.Fatalf("count at b stuck at %d", n)
	}
	cb, err := b.rt.Inspect(ctx, id)
	if err != nil || cb.PID != pid || cb.Status != "running" {
		t.Fatalf("b: %+v %v (restore said pid %d)", cb, err, pid)
	}
	if got := a.tasks(t); got != id+":PAUSED" {
		t.Fatalf("a before the commit: %q", got)
	}

	// The commit: a's copy goes.
	if err := a.rt.Remove(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := a.ctr(t, "-n", "default", "containers", "ls", "-q"); strings.TrimSpace(got) != "" {
		t.Fatalf("a still lists %q", got)
	}
	if alive(c.PID) {
		t.Errorf("source process %d still alive", c.PID)
	}

	// b: containerd's own commands manage it.
	b.ctr(t, "-n", "default", "tasks", "kill", "--signal", "SIGKILL", id)
	for deadline := time.Now().Add(10 * time.Second); alive(pid) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	b.ctr(t, "-n", "default", "tasks", "delete", id)
	b.ctr(t, "-n", "default", "containers", "rm", id)
	if got := b.ctr(t, "-n", "default", "containers", "ls", "-q"); strings.TrimSpace(got) != "" {
		t.Fatalf("b still lists %q", got)
	}
	if alive(pid) {
		t.Errorf("restored process %d still alive", pid)
	}
}

// TestFailedRestoreLeavesSourceRunning: b's restore fails (its images are
// not there); b drops its copy, and a, thawed, counts on.
func TestFailedRestoreLeavesSourceRunning(t *testing.T) {
	a, b := newHosts(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const id = "ferry-ctr-fail"
	a.run(t, id)
	c, err := a.rt.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	tgt, err := b.rt.Prepare(ctx, c, runtime.PrepareOptions{WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	dump(ctx, t, a, c, work)
	if _, err := tgt.Restore(ctx, runtime.RestoreOptions{ImagesDir: t.TempDir(), WorkDir: work}); err == nil {
		t.Fatal("a restore from an empty directory succeeded")
	}
	if err := tgt.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.ctr(t, "-n", "default", "containers", "ls", "-q"); strings.TrimSpace(got) != "" {
		t.Fatalf("b keeps %q after Discard", got)
	}
	if err := a.rt.Thaw(ctx, c); err != nil {
		t.Fatal(err)
	}
	n := count(t, c.PID)
	time.Sleep(300 * time.Millisecond)
	if m := count(t, c.PID); m <= n {
		t.Fatalf("a does not count on after the thaw: %d then %d", n, m)
	}
	if got := a.tasks(t); got != id+":RUNNING" {
		t.Fatalf("a: %q", got)
	}
}

// TestPrepareRefuses: a missing image and a taken ID are refused before
// anything is created.
func TestPrepareRefuses(t *testing.T) {
	a, b := newHosts(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const id = "ferry-ctr-refuse"
	a.run(t, id)
	c, err := a.rt.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.rt.Prepare(ctx, c, runtime.PrepareOptions{}); err == nil || !strings.Contains(err.Error(), "has no image "+image) {
		t.Fatalf("prepare without the image: %v", err)
	}
	// a itself has the ID.
	if _, err := a.rt.Prepare(ctx, c, runtime.PrepareOptions{}); err == nil || !strings.Contains(err.Error(), "already has a container") {
		t.Fatalf("prepare over a taken ID: %v", err)
	}
	if got := b.ctr(t, "-n", "default", "containers", "ls", "-q"); strings.TrimSpace(got) != "" {
		t.Fatalf("b has %q after refusing", got)
	}
	other := *c
	other.Runtime = "podman"
	if _, err := b.rt.Prepare(ctx, &other, runtime.PrepareOptions{}); err == nil {
		t.Fatal("prepare of a podman container succeeded")
	}
}

package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/lab"
)

// What Podman, LXC, containerd and Docker leave of a container is seen, and only that: a
// container's cgroups and storage appear in a snapshot taken after it
// was made, the shared ones (conmon's cgroup, the layers' links) do not.
func TestRuntimeLeftovers(t *testing.T) {
	root := t.TempDir()
	cgroups := filepath.Join(root, "cgroup")
	var h lab.Host
	h.Name, h.StateDir = "h1", filepath.Join(root, "h1")
	mkdirs := func(dirs ...string) {
		t.Helper()
		for _, d := range dirs {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}
	storage := filepath.Join(h.PodmanDir(), "storage")
	mkdirs(filepath.Join(cgroups, "memory", "libpod_parent", "conmon"),
		filepath.Join(cgroups, "memory", "lxc.pivot"),
		filepath.Join(storage, "overlay", "l"),
		filepath.Join(storage, "overlay", "image-layer"),
		filepath.Join(h.Containerd().Dir, "root", "io.containerd.snapshotter.v1.overlayfs", "snapshots", "1"),
		h.LXCPath())
	snap := func() leakSet {
		s := leakSet{}
		runtimeLeftovers(s, cgroups, []lab.Host{h})
		return s
	}
	before := snap()
	mkdirs(filepath.Join(cgroups, "memory", "libpod_parent", "libpod-abc"),
		filepath.Join(cgroups, "freezer", "lxc.payload.web-1"),
		filepath.Join(cgroups, "pids", "lxc.monitor.web"),
		filepath.Join(cgroups, "memory", "lxc.pivot", "ignored"),
		filepath.Join(storage, "overlay-containers", "abc"),
		filepath.Join(storage, "overlay", "abc-layer"),
		filepath.Join(h.LXCPath(), "web", "rootfs"),
		filepath.Join(cgroups, "cpu", "docker", "d0c"),
		filepath.Join(h.Containerd().Dir, "root", "io.containerd.snapshotter.v1.overlayfs", "snapshots", "2"),
		filepath.Join(h.Docker().Dir, "data", "containers", "d0c"),
		filepath.Join(h.Docker().Dir, "xdg", "ctrd-checkpoint1"))
	got := snap().since(before)
	ctrSnaps := filepath.Join(h.Containerd().Dir, "root", "io.containerd.snapshotter.v1.overlayfs", "snapshots")
	want := []string{
		"cgroup: cpu/docker/d0c",
		"cgroup: freezer/lxc.payload.web-1",
		"cgroup: memory/libpod_parent/libpod-abc",
		"cgroup: pids/lxc.monitor.web",
		"storage: " + filepath.Join(ctrSnaps, "2"),
		"storage: " + filepath.Join(h.Docker().Dir, "data", "containers", "d0c"),
		"storage: " + filepath.Join(h.Docker().Dir, "xdg", "ctrd-checkpoint1"),
		"storage: " + filepath.Join(h.LXCPath(), "web"),
		"storage: " + filepath.Join(storage, "overlay-containers", "abc"),
		"storage: " + filepath.Join(storage, "overlay", "abc-layer"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("leftovers:\n got %q\nwant %q", got, want)
	}
}

// A case's scratch directory and a rescue record CRIU left show in a
// snapshot taken after them, the agent's own rescue directory does not;
// cleanLeaks removes the scratch directory and keeps the agent's.
func TestSnapshotAndCleanScratch(t *testing.T) {
	dir := t.TempDir()
	var h lab.Host
	h.Name, h.StateDir, h.ScratchDir = "h1", filepath.Join(dir, "state"), filepath.Join(dir, "scratch")
	// Names no lab has: no namespace's processes, no cgroup.
	h.NetNSName, h.CgroupParent = "ferry-bench-unit-test-none", "ferry-bench-unit-test-none"
	l := &lab.Lab{Hosts: []lab.Host{h}}
	if err := os.MkdirAll(h.RescueDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	mine := func(s leakSet) []string {
		return slices.DeleteFunc(s.since(nil), func(k string) bool { return !strings.Contains(k, dir) })
	}
	before := snapshot(l)
	if got := mine(before); len(got) != 0 {
		t.Fatalf("an empty scratch directory: %q", got)
	}
	case1 := filepath.Join(h.ScratchDir, "0a1b2c")
	record := filepath.Join(h.RescueDir(), "1234.json")
	if err := os.MkdirAll(case1, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := []string{"CRIU rescue record: " + record, "scratch: " + case1}
	if got := mine(snapshot(l)); !slices.Equal(got, want) {
		t.Errorf("after a case:\n got %q\nwant %q", got, want)
	}
	cleanLeaks(l)
	if _, err := os.Stat(case1); !os.IsNotExist(err) {
		t.Errorf("the case's scratch directory is still there: %v", err)
	}
	if _, err := os.Stat(record); err != nil {
		t.Errorf("the agent's rescue directory went: %v", err)
	}
}

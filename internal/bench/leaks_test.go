package bench

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferry-migrate/ferry/internal/lab"
)

// What Podman and LXC leave of a container is seen, and only that: a
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
		filepath.Join(h.LXCPath(), "web", "rootfs"))
	got := snap().since(before)
	want := []string{
		"cgroup: freezer/lxc.payload.web-1",
		"cgroup: memory/libpod_parent/libpod-abc",
		"cgroup: pids/lxc.monitor.web",
		"storage: " + filepath.Join(h.LXCPath(), "web"),
		"storage: " + filepath.Join(storage, "overlay-containers", "abc"),
		"storage: " + filepath.Join(storage, "overlay", "abc-layer"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("leftovers:\n got %q\nwant %q", got, want)
	}
}

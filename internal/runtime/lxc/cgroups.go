package lxc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cgroups"
)

// liblxc removes a container's cgroups (lxc.payload.NAME and
// lxc.monitor.NAME at the top of each hierarchy, NAME-1, NAME-2... where
// the name was taken) when a container it started stops, but not when its
// restore dies: a CRIU killed mid-restore leaves them, and the next
// restore of that name takes the next suffix. And CRIU puts a restored
// copy back into the cgroup path it dumped in the v2 tree, which neither
// host's liblxc removes where two hosts share one kernel (ferry's lab). So
// removing a container also removes every empty cgroup named for it: a
// cgroup holding a process (another container's) cannot be removed, and
// a stopped container has none.

// containerCgroups lists the cgroups on this machine that liblxc names
// for container name, in every hierarchy mounted at root.
func containerCgroups(root, name string) []string {
	var out []string
	for _, h := range cgroups.Hierarchies(root) {
		ents, _ := os.ReadDir(h)
		for _, e := range ents {
			if e.IsDir() && namedFor(e.Name(), name) {
				out = append(out, filepath.Join(h, e.Name()))
			}
		}
	}
	return out
}

// namedFor says whether cgroup is one liblxc makes for container name:
// lxc.payload.NAME or lxc.monitor.NAME, perhaps with a -N suffix.
func namedFor(cgroup, name string) bool {
	for _, prefix := range []string{"lxc.payload.", "lxc.monitor."} {
		rest, ok := strings.CutPrefix(cgroup, prefix+name)
		if !ok {
			continue
		}
		if rest == "" {
			return true
		}
		if n, ok := strings.CutPrefix(rest, "-"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}

// removeEmptyCgroups removes those of cgroups that hold no process and no
// cgroup (the kernel refuses to remove any other).
func removeEmptyCgroups(cgroups []string) error {
	var errs []error
	for _, c := range cgroups {
		if err := unix.Rmdir(c); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, &os.PathError{Op: "remove cgroup", Path: c, Err: err})
		}
	}
	return errors.Join(errs...)
}

// RemoveIdleCgroups removes every empty cgroup named for container name on
// this machine, as removing the container through this package does; for
// those who remove it with liblxc's own tools where hosts share a kernel.
func RemoveIdleCgroups(name string) error {
	return removeEmptyCgroups(containerCgroups(cgroups.Root, name))
}

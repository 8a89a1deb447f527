package lxc

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cgroups"
)

// A CRIU killed during a restore leaves the cgroups liblxc made for the
// copy: lxc.payload.NAME and lxc.monitor.NAME at the top of each
// hierarchy, or NAME-1, NAME-2... where the name was taken (two lab hosts
// share one kernel's cgroups). liblxc removes them when a container it
// started stops, not when its restore dies, and the next restore of the
// same name then takes the next suffix: they would pile up. The target
// notes which exist before its restore and removes the new ones that are
// empty when it is discarded.

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
// cgroup (the kernel refuses to remove any other), except those in keep.
func removeEmptyCgroups(cgroups, keep []string) error {
	var errs []error
	for _, c := range cgroups {
		if slices.Contains(keep, c) {
			continue
		}
		if err := unix.Rmdir(c); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, &os.PathError{Op: "remove cgroup", Path: c, Err: err})
		}
	}
	return errors.Join(errs...)
}

// RemoveIdleCgroups removes every empty cgroup liblxc named for container
// name on this machine. For a lab, whose hosts share one kernel's
// cgroups: a copy restored on one host goes back into the source's
// unified cgroup (CRIU restores the path it dumped there), which neither
// host's liblxc removes when its container stops.
func RemoveIdleCgroups(name string) error {
	return removeEmptyCgroups(containerCgroups(cgroups.Root, name), nil)
}

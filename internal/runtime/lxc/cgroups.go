package lxc

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/procs"
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
// cgroup (the kernel refuses to remove any other). A cgroup stays busy
// while its last processes are zombies, still listed (a stopped
// container's, until liblxc's monitor reaps them): one that holds nothing
// else is tried again for up to a second.
func removeEmptyCgroups(cgroups []string) error {
	var errs []error
	for _, c := range cgroups {
		for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
			err := unix.Rmdir(c)
			if errors.Is(err, unix.EBUSY) && !holdsLiving(c) && time.Now().Before(deadline) {
				continue
			}
			if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) {
				errs = append(errs, &os.PathError{Op: "remove cgroup", Path: c, Err: err})
			}
			break
		}
	}
	return errors.Join(errs...)
}

// holdsLiving says whether cgroup holds a cgroup or a process that is not
// a zombie.
func holdsLiving(cgroup string) bool {
	ents, err := os.ReadDir(cgroup)
	if err != nil {
		return true
	}
	for _, e := range ents {
		if e.IsDir() {
			return true
		}
	}
	listed, err := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		return true
	}
	for _, f := range strings.Fields(string(listed)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return true
		}
		if st, ok := procs.State(pid); ok && st != 'Z' {
			return true
		}
	}
	return false
}

// RemoveIdleCgroups removes every empty cgroup named for container name on
// this machine, as removing the container through this package does; for
// those who remove it with liblxc's own tools where hosts share a kernel.
func RemoveIdleCgroups(name string) error {
	return removeEmptyCgroups(containerCgroups(cgroups.Root, name))
}

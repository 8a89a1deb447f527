package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	ocgroups "github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// Destroy ends every process left in the cgroup at rel (a path below each
// hierarchy, as in an OCI config's cgroupsPath) and removes it from every
// hierarchy mounted at root. A restore whose CRIU died midway leaves
// such a cgroup: its restored processes stuck where CRIU left them, and
// runc, which no longer knows the container, fails to remove it.
func Destroy(root, rel string) error {
	rel = filepath.Clean("/" + rel)
	if rel == "/" {
		return errors.New("cgroups: refusing to destroy a hierarchy's root")
	}
	var dirs []string
	for _, h := range Hierarchies(root) {
		if d := filepath.Join(h, rel); ocgroups.PathExists(d) {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		return nil
	}
	// A frozen process does not die of SIGKILL until thawed, and a v1
	// cgroup frozen itself stays frozen when its parent thaws.
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				_ = os.WriteFile(filepath.Join(p, "freezer.state"), []byte("THAWED"), 0)
				_ = os.WriteFile(filepath.Join(p, "cgroup.freeze"), []byte("0"), 0)
			}
			return nil
		})
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		pids := map[int]bool{}
		for _, d := range dirs {
			ps, _ := ocgroups.GetAllPids(d)
			for _, p := range ps {
				pids[p] = true
			}
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroups: %d processes of %s would not die", len(pids), rel)
		}
		for p := range pids {
			_ = unix.Kill(p, unix.SIGKILL)
		}
	}
	var errs []error
	for _, d := range dirs {
		if err := ocgroups.RemovePath(d); err != nil {
			errs = append(errs, fmt.Errorf("cgroups: remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

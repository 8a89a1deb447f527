package cgroups

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Root is where cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Hierarchies lists the cgroup hierarchies mounted at root or directly
// below it: every v1 controller's and the v2 tree, whether that is
// mounted below (the hybrid layout's unified) or at root itself.
// Symlinks such as cpu -> cpu,cpuacct are not followed, so each
// hierarchy appears once.
func Hierarchies(root string) []string {
	candidates := []string{root}
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.IsDir() {
			candidates = append(candidates, filepath.Join(root, e.Name()))
		}
	}
	var out []string
	for _, c := range candidates {
		var st unix.Statfs_t
		if unix.Statfs(c, &st) == nil && (st.Type == unix.CGROUP_SUPER_MAGIC || st.Type == unix.CGROUP2_SUPER_MAGIC) {
			out = append(out, c)
		}
	}
	return out
}

package cgroups

import (
	occgroups "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
)

// Freeze freezes the cgroup at dir (the freezer in v1, cgroup.freeze in
// v2) and returns once every process in it is frozen: runc pause without
// runc's exec, ~5 ms of a switchover's downtime. runc reads a container's
// state from the same freezer, so runc then reports it paused and resumes
// it.
func Freeze(dir string) error { return setFreezer(dir, occgroups.Frozen) }

// Thaw thaws the cgroup at dir.
func Thaw(dir string) error { return setFreezer(dir, occgroups.Thawed) }

func setFreezer(dir string, state occgroups.FreezerState) error {
	if occgroups.IsCgroup2UnifiedMode() {
		m, err := fs2.NewManager(&occgroups.Cgroup{Resources: &occgroups.Resources{}}, dir)
		if err != nil {
			return err
		}
		return m.Freeze(state)
	}
	return (&fs.FreezerGroup{}).Set(dir, &occgroups.Resources{Freezer: state})
}

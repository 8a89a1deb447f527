package cgroups

import (
	"fmt"
	"path/filepath"

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

// FreezerOf is the freezer cgroup (v1; the unified cgroup in v2) of
// process pid, as a directory to give Freeze and Thaw.
func FreezerOf(pid int) (string, error) {
	paths, err := occgroups.ParseCgroupFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	if occgroups.IsCgroup2UnifiedMode() {
		return filepath.Join(fs2.UnifiedMountpoint, paths[""]), nil
	}
	rel, ok := paths["freezer"]
	if !ok {
		return "", fmt.Errorf("process %d is in no freezer cgroup", pid)
	}
	mnt, err := occgroups.FindCgroupMountpoint("", "freezer")
	if err != nil {
		return "", err
	}
	return filepath.Join(mnt, rel), nil
}

// Frozen says whether process pid's freezer cgroup is frozen (or freezing:
// the library reads both as frozen):
// its tasks stop for nothing else then (a ptrace stop waits for the thaw).
func Frozen(pid int) (bool, error) {
	dir, err := FreezerOf(pid)
	if err != nil {
		return false, err
	}
	var st occgroups.FreezerState
	if occgroups.IsCgroup2UnifiedMode() {
		m, err := fs2.NewManager(&occgroups.Cgroup{Resources: &occgroups.Resources{}}, dir)
		if err != nil {
			return false, err
		}
		st, err = m.GetFreezerState()
		if err != nil {
			return false, err
		}
	} else if st, err = (&fs.FreezerGroup{}).GetState(dir); err != nil {
		return false, err
	}
	// The root cgroup has no freezer state (Undefined): it is never frozen.
	return st == occgroups.Frozen, nil
}

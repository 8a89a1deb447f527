package cgroups

import (
	"fmt"
	"path/filepath"

	occgroups "github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// Continue sends SIGCONT to every process in pid's cgroup and the cgroups
// below it: the processes of a container CRIU restored stopped. None of
// them can fork or exit while stopped, so the list is whole; a process
// that a continued one forks starts running anyway. It is runc kill --all
// CONT without runc's exec and its freeze of the cgroup around the
// signals, milliseconds of a switchover's downtime.
func Continue(pid int) error {
	dir, err := dirOf(pid, "freezer")
	if err != nil {
		return err
	}
	pids, err := occgroups.GetAllPids(dir)
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return fmt.Errorf("cgroups: no process in %s", dir)
	}
	for _, p := range pids {
		if err := unix.Kill(p, unix.SIGCONT); err != nil && err != unix.ESRCH {
			return fmt.Errorf("cgroups: continue %d: %w", p, err)
		}
	}
	return nil
}

// dirOf is the directory of pid's cgroup: in v1, in the hierarchy of
// subsystem; in v2, the one tree.
func dirOf(pid int, subsystem string) (string, error) {
	paths, err := occgroups.ParseCgroupFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	if occgroups.IsCgroup2UnifiedMode() {
		p, ok := paths[""]
		if !ok {
			return "", fmt.Errorf("pid %d has no cgroup v2 path", pid)
		}
		return filepath.Join(unifiedMountpoint, p), nil
	}
	p, ok := paths[subsystem]
	if !ok {
		return "", fmt.Errorf("pid %d has no %s cgroup", pid, subsystem)
	}
	mnt, root, err := occgroups.FindCgroupMountpointAndRoot("", subsystem)
	if err != nil {
		return "", fmt.Errorf("%s cgroup mount: %w", subsystem, err)
	}
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return "", err
	}
	return filepath.Join(mnt, rel), nil
}

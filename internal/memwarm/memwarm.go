// Package memwarm touches memory ahead of a restore. On a VM whose balloon
// driver reports free pages to the hypervisor, the first touch of a guest
// page the hypervisor reclaimed is slow: here a restore of 256 MiB took
// 0.16 s or 0.65 s depending only on whether its memory was warm. The
// destination therefore touches as much memory as the container holds
// while the pages stream in (it is idle then), and frees it just before
// the restore, which reuses those warm pages.
package memwarm

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Warm maps and touches size bytes, at most half of the host's free
// memory; release unmaps them.
func Warm(size int64) (release func()) {
	if size <= 0 {
		return func() {}
	}
	// Never more than half of what the host has free: warming is an
	// optimisation, and the peer says how much it wants.
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		size = min(size, int64(si.Freeram)*int64(si.Unit)/2)
	}
	size = (size + 4095) &^ 4095
	if size <= 0 {
		return func() {}
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return func() {}
	}
	// At the lowest CPU priority: the transfer the warming overlaps with
	// (and, in the lab, the source on the same machine) goes first.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prio, _ := unix.Getpriority(unix.PRIO_PROCESS, 0)
	_ = unix.Setpriority(unix.PRIO_PROCESS, 0, 19)
	defer unix.Setpriority(unix.PRIO_PROCESS, 0, 20-prio) // Getpriority returns 20 - nice
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	return func() { _ = unix.Munmap(mem) }
}

// Package hostload says what a host can offer a container that would move
// to it: CPU not busy, memory available, free storage in a directory. The
// figures are the host's (/proc/stat, /proc/meminfo, statfs), not what a
// cgroup the agent runs in leaves it.
//
// CPU is a rate, so it is measured over a window: Measure samples
// /proc/stat twice, window apart; a Meter, read again and again (an
// agent answering queries), gives the average since its previous reading,
// so a long-lived caller gets a moving average without a wait.
//
//	l, err := hostload.Measure(ctx, "/var/lib/ferry", 200*time.Millisecond)
//	// l.CPUFree cores, l.MemAvailable and l.DiskFree bytes
package hostload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// Load is what a host can offer, at one moment (CPU: over a window).
type Load struct {
	// CPUs is the host's online logical CPUs (its cpuN lines in
	// /proc/stat).
	CPUs int `json:"cpus"`
	// CPUFree is how many CPUs' worth of time was not busy over the
	// window, 0 to CPUs: idle or waiting on I/O (a CPU waiting on I/O
	// runs anything runnable), of all CPUs. Time stolen by a hypervisor
	// counts as busy: it was never ours to give.
	CPUFree float64 `json:"cpu_free"`
	// CPUWindow is how long CPUFree was measured over.
	CPUWindow time.Duration `json:"cpu_window_ns"`
	// MemTotal is the host's usable RAM (MemTotal), in bytes.
	MemTotal uint64 `json:"mem_total_bytes"`
	// MemAvailable is the kernel's estimate of memory that can be given
	// to new work without swapping (MemAvailable): free memory plus page
	// cache and reclaimable slab it can drop, in bytes.
	MemAvailable uint64 `json:"mem_available_bytes"`
	// Dir is the directory whose file system DiskTotal and DiskFree are.
	Dir string `json:"dir"`
	// DiskTotal is the size of Dir's file system, in bytes.
	DiskTotal uint64 `json:"disk_total_bytes"`
	// DiskFree is what can still be written there, in bytes: the blocks
	// free to anyone (f_bavail), without the reserve only root may fill.
	DiskFree uint64 `json:"disk_free_bytes"`
	// DiskFreeInodes is the files that can still be made there (f_ffree;
	// 0 on file systems that do not count them, such as btrfs).
	DiskFreeInodes uint64 `json:"disk_free_inodes"`
}

// Measure reads the host's load: CPU over window (blocking that long; a
// tenth of a second or more, so that it holds several of the kernel's
// 10 ms ticks), memory and dir's storage at its end.
func Measure(ctx context.Context, dir string, window time.Duration) (Load, error) {
	m, err := NewMeter(dir)
	if err != nil {
		return Load{}, err
	}
	t := time.NewTimer(window)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return Load{}, ctx.Err()
	case <-t.C:
	}
	return m.Read()
}

// Meter reads a host's load again and again, CPU averaged since the
// previous reading. It is safe for concurrent use.
type Meter struct {
	fs  procfs.FS
	dir string

	mu      sync.Mutex
	prev    procfs.CPUStat
	prevAt  time.Time
	last    Load // the last CPU figures, for a reading too soon after it
	hasLast bool
}

// NewMeter starts a meter of the host's load with dir's storage; its first
// Read covers the time since.
func NewMeter(dir string) (*Meter, error) {
	fs, err := procfs.NewFS(procfs.DefaultMountPoint)
	if err != nil {
		return nil, err
	}
	return newMeter(fs, dir)
}

func newMeter(fs procfs.FS, dir string) (*Meter, error) {
	m := &Meter{fs: fs, dir: dir}
	st, err := fs.Stat()
	if err != nil {
		return nil, fmt.Errorf("CPU times: %w", err)
	}
	m.prev, m.prevAt = st.CPUTotal, time.Now()
	return m, nil
}

// errTooSoon says no CPU time passed between two readings.
var errTooSoon = errors.New("CPU: no time passed since the previous reading")

// Read gives the load now, CPU since the previous Read (or NewMeter). A
// Read too soon after the previous one for the kernel's clock to have
// moved (a tick, 10 ms) repeats that one's CPU figures, or fails if
// there is none yet.
func (m *Meter) Read() (Load, error) {
	st, err := m.fs.Stat()
	if err != nil {
		return Load{}, fmt.Errorf("CPU times: %w", err)
	}
	now := time.Now()
	var l Load
	m.mu.Lock()
	l.CPUs = len(st.CPU)
	l.CPUFree, err = cpuFree(m.prev, st.CPUTotal, l.CPUs)
	switch {
	case err == nil:
		l.CPUWindow = now.Sub(m.prevAt)
		m.prev, m.prevAt = st.CPUTotal, now
		m.last, m.hasLast = l, true
	case errors.Is(err, errTooSoon) && m.hasLast:
		l.CPUs, l.CPUFree, l.CPUWindow = m.last.CPUs, m.last.CPUFree, m.last.CPUWindow
	default:
		m.mu.Unlock()
		return Load{}, err
	}
	m.mu.Unlock()

	mi, err := m.fs.Meminfo()
	if err != nil {
		return Load{}, fmt.Errorf("memory: %w", err)
	}
	if mi.MemTotalBytes == nil || mi.MemAvailableBytes == nil {
		return Load{}, errors.New("memory: no MemTotal or MemAvailable in meminfo")
	}
	l.MemTotal, l.MemAvailable = *mi.MemTotalBytes, *mi.MemAvailableBytes

	l.Dir = m.dir
	l.DiskTotal, l.DiskFree, l.DiskFreeInodes, err = storage(m.dir)
	if err != nil {
		return Load{}, err
	}
	return l, nil
}

// cpuFree is the CPUs' worth of time not busy between two readings of
// the CPUs' total times.
func cpuFree(prev, cur procfs.CPUStat, cpus int) (float64, error) {
	// Guest time is already in user and nice: not added again.
	busy := func(c procfs.CPUStat) float64 { return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal }
	free := func(c procfs.CPUStat) float64 { return c.Idle + c.Iowait }
	dBusy, dFree := busy(cur)-busy(prev), free(cur)-free(prev)
	// iowait may step back (the kernel counts it per CPU, loosely).
	dBusy, dFree = max(dBusy, 0), max(dFree, 0)
	if dBusy+dFree <= 0 {
		return 0, errTooSoon
	}
	return float64(cpus) * dFree / (dBusy + dFree), nil
}

// storage is the size, the free bytes and free inodes of dir's file
// system.
func storage(dir string) (total, free, inodes uint64, err error) {
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		return 0, 0, 0, fmt.Errorf("storage of %s: %w", dir, err)
	}
	// Block counts are in fragments, as statvfs and df count them.
	unit := uint64(s.Frsize)
	if unit == 0 {
		unit = uint64(s.Bsize)
	}
	return s.Blocks * unit, s.Bavail * unit, s.Ffree, nil
}

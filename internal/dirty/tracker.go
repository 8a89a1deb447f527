// Package dirty tells which pages of a process were written since the last
// look, from the kernel's page tables instead of reading and hashing all of
// memory: a userfaultfd in asynchronous write-protect mode (Linux 6.7)
// marks each page written on its first write after protection, and
// PAGEMAP_SCAN on /proc/PID/pagemap reports the marked pages and protects
// them again in one walk. A userfaultfd watches the memory of the process
// that created it, so the tracker has the container's process create one
// (package inject) and takes it over with pidfd_getfd; the process keeps
// no descriptor of it. This is soft-dirty's successor; kernels without
// either leave content hashing as the way to find changed pages.
package dirty

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/inject"
	"github.com/ferry-migrate/ferry/internal/procs"
)

const (
	// userEnd is where a scan of the address space ends: the top of user
	// space on x86-64 with 4-level page tables, page aligned.
	userEnd = 0x7ffffffff000

	regionBatch = 4096
)

// Tracker follows the writes to one process's private memory. It is not
// safe for concurrent use.
type Tracker struct {
	pid        int
	uffd       int
	pagemap    *os.File
	registered map[[2]uint64]bool
	vec        []region // one PAGEMAP_SCAN's output
	all        []region // one Scan's
	last       bool     // no scan follows: do not protect again
}

// Track starts tracking process pid's writes. The process must be running
// (not frozen): it makes the userfaultfd itself. Until the first Scan
// every page counts as written.
func Track(pid int) (*Tracker, error) {
	uffd, err := takeUserfaultfd(pid)
	if err != nil {
		return nil, err
	}
	if err := enableWPAsync(uffd); err != nil {
		unix.Close(uffd)
		return nil, err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		unix.Close(uffd)
		return nil, fmt.Errorf("dirty: %w", err)
	}
	t := &Tracker{pid: pid, uffd: uffd, pagemap: pm, registered: map[[2]uint64]bool{}, vec: make([]region, regionBatch)}
	t.register()
	return t, nil
}

// takeUserfaultfd has process pid create a userfaultfd (user-mode faults
// only: no privilege needed, and asynchronous write protection resolves
// every fault in the kernel anyway), copies it here with pidfd_getfd and
// closes the process's own.
func takeUserfaultfd(pid int) (int, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("dirty: pidfd of %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	ours := -1
	err = inject.Do(pid, []uintptr{unix.SYS_USERFAULTFD, unix.SYS_CLOSE}, func(s *inject.Session) error {
		theirs, err := s.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly)
		if err != nil {
			return fmt.Errorf("dirty: userfaultfd in process %d: %w", pid, err)
		}
		ours, err = unix.PidfdGetfd(pidfd, int(theirs), 0)
		if _, cerr := s.Syscall(unix.SYS_CLOSE, theirs); cerr != nil && err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("dirty: taking process %d's userfaultfd: %w", pid, err)
		}
		return nil
	})
	if err != nil {
		if ours >= 0 {
			unix.Close(ours)
		}
		return -1, err
	}
	return ours, nil
}

// register registers the private mappings not yet registered. One that
// cannot be (the kernel refuses some special mappings) stays unregistered
// and its pages count as written at every scan. It returns the stretches
// of the address space to scan.
func (t *Tracker) register() []scanRun {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", t.pid))
	if err != nil {
		return []scanRun{{0, userEnd, false}}
	}
	maps := procs.ParseMaps(b)
	for _, m := range maps {
		if !m.OwnMemory() {
			continue
		}
		r := [2]uint64{m.Start, m.End}
		if t.registered[r] {
			continue
		}
		if registerWP(t.uffd, m.Start, m.End) == nil {
			t.registered[r] = true
		}
	}
	return scanRuns(maps)
}

// scanRun is a stretch of the address space scanned in one walk; anon:
// every mapping in it is private anonymous memory.
type scanRun struct {
	start, end uint64
	anon       bool
}

// scanRuns cuts [0, userEnd) where the mappings change between private
// anonymous memory and anything else, so that a process's heap and large
// anonymous mappings are walked without a lookup of each page. A mapping
// made after maps was read is walked as its neighbours are: at worst its
// page cache pages are reported too.
func scanRuns(maps []procs.Mapping) []scanRun {
	runs := []scanRun{{0, userEnd, false}}
	for _, m := range maps {
		last := &runs[len(runs)-1]
		if m.Anonymous() == last.anon || m.End > userEnd {
			continue
		}
		last.end = m.Start
		runs = append(runs, scanRun{m.Start, userEnd, m.Anonymous()})
	}
	return slices.DeleteFunc(runs, func(r scanRun) bool { return r.end <= r.start })
}

// Scan reports the process's private pages that are present or swapped,
// as ranges [start, end) in address order, each with whether it was
// written since the previous Scan (or Track), and protects them again.
// Pages of the zero page are left out: they hold nothing. A mapping made
// since the previous Scan is registered first and counts as written.
//
// The ranges are reported after the whole walk: the kernel may end a
// batch at a walk_end below ranges it already reported (and protected)
// while the process writes, so the next batch reports some of them again,
// now unwritten. A page is written if any batch said so.
func (t *Tracker) Scan(fn func(start, end uint64, written bool) error) error {
	all := t.all[:0]
	for _, run := range t.register() {
		for start := run.start; start < run.end; {
			regs, walkEnd, err := scanRegions(int(t.pagemap.Fd()), start, run.end, !t.last, run.anon, t.vec)
			if errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("dirty: process %d: %w", t.pid, os.ErrNotExist)
			}
			if err != nil {
				return fmt.Errorf("dirty: PAGEMAP_SCAN of %d: %w", t.pid, err)
			}
			all = append(all, regs...)
			if walkEnd <= start {
				return fmt.Errorf("dirty: PAGEMAP_SCAN of %d made no progress at %#x", t.pid, start)
			}
			start = walkEnd
		}
	}
	t.all = all
	for _, sp := range spans(all) {
		if err := fn(sp.start, sp.end, sp.written); err != nil {
			return err
		}
	}
	return nil
}

// span is a range of pages as Scan reports it.
type span struct {
	start, end uint64
	written    bool
}

// spans turns the kernel's reports, which may overlap, into disjoint
// ranges in address order: a page is written if any report covering it
// says so (written, or not protected: not write-protect allowed), and
// left out if every report covering it says it is the zero page.
func spans(regs []region) []span {
	type edge struct {
		at            uint64
		data, written int // +1 where a report starts, -1 where it ends
	}
	edges := make([]edge, 0, 2*len(regs))
	for _, r := range regs {
		if r.End <= r.Start {
			continue
		}
		d, w := 1, 0
		if r.Categories&pagePFNZero != 0 {
			d = 0
		} else if r.Categories&pageWritten != 0 || r.Categories&pageWPAllowed == 0 {
			w = 1
		}
		edges = append(edges, edge{r.Start, d, w}, edge{r.End, -d, -w})
	}
	sort.Slice(edges, func(i, j int) bool { return edges[i].at < edges[j].at })
	var out []span
	data, written := 0, 0
	for i, e := range edges {
		data += e.data
		written += e.written
		if i+1 == len(edges) || edges[i+1].at == e.at || data == 0 {
			continue
		}
		sp := span{e.at, edges[i+1].at, written > 0}
		if n := len(out); n > 0 && out[n-1].end == sp.start && out[n-1].written == sp.written {
			out[n-1].end = sp.end
			continue
		}
		out = append(out, sp)
	}
	return out
}

// Last says the next Scan is the last, of a frozen process: it reports
// without protecting the pages again, which would rewrite every page table
// entry of the process (and flush the TLB) for a scan that never comes.
func (t *Tracker) Last() { t.last = true }

// Close stops tracking: the kernel unregisters the mappings and lifts
// the protection when the last descriptor of the userfaultfd goes, a walk
// of every tracked page table entry with the process's memory map locked
// for writing (~30 ms for 1 GiB here), which anything reading the process's
// maps or pagemap meanwhile waits for.
func (t *Tracker) Close() error {
	t.pagemap.Close()
	return unix.Close(t.uffd)
}

// Available says whether this kernel tracks writes this way: a
// userfaultfd with asynchronous write protection (made here, in this
// process) and PAGEMAP_SCAN. It says nothing of a given process's
// seccomp profile.
func Available() error {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
	if errno != 0 {
		return fmt.Errorf("dirty: userfaultfd: %w", errno)
	}
	defer unix.Close(int(fd))
	if err := enableWPAsync(int(fd)); err != nil {
		return err
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return fmt.Errorf("dirty: %w", err)
	}
	defer pm.Close()
	vec := make([]region, 1)
	if _, _, err := scanRegions(int(pm.Fd()), 0, pageSizeProbe, false, false, vec); err != nil {
		return fmt.Errorf("dirty: PAGEMAP_SCAN: %w", err)
	}
	return nil
}

const pageSizeProbe = 4096

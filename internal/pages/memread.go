// Package pages reads, stores, diffs and streams the anonymous memory of a
// container's processes for content-based pre-copy migration: on kernels
// without soft-dirty tracking, pages that changed are found by hashing.
package pages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// PageSize is the page size this package works with (x86-64 and most arm64
// kernels).
const PageSize = 4096

// Key names a page of the container: the process by its pid inside the
// container's pid namespace (stable across migration), and the page's address.
type Key struct {
	PID  uint32
	Addr uint64 // page aligned
}

// Page is one page found by Scan.
type Page struct {
	Key  Key
	Hash xxh3.Uint128
	// Data is PageSize bytes and valid only during the callback; copy it to
	// keep it.
	Data []byte
}

// Stats describes one Scan.
type Stats struct {
	Processes int // processes scanned (vanished ones are not counted)
	VMAs      int // mappings whose pages were looked at
	Pages     uint64
	Bytes     uint64
	Duration  time.Duration
	// Unchanged are the pages a WriteTracker said were not written since
	// its last scan, reported as ranges without being read (counted in
	// Pages too).
	Unchanged uint64
}

// WriteTracker reports a process's private pages (present or swapped,
// not the zero page) as address ranges, each with whether it was written
// since the tracker's previous scan (package dirty).
type WriteTracker interface {
	Scan(fn func(start, end uint64, written bool) error) error
}

const (
	readBufSize  = 2 << 20 // bytes read from a process per system call at most
	pagemapBatch = 64 << 10
	pmPresent    = 1 << 63
	pmSwapped    = 1 << 62
	pmFile       = 1 << 61 // file page or shared anonymous
	pmPFNMask    = 1<<55 - 1
)

// proc is one process to scan.
type proc struct {
	host int
	ns   uint32
}

// Reader scans the memory of a fixed set of processes. It reuses its buffers
// between scans; it is not safe for concurrent use.
type Reader struct {
	procs   []proc
	buf     []byte
	pagemap []byte
	zeroPFN uint64

	trackers    map[int]WriteTracker // by host pid
	held        func(Range) []Range
	unchanged   func(Range)
	writtenOnly bool
}

// Range is pages [Start, End) of the process PID (in its pid namespace,
// as in Key).
type Range struct {
	PID        uint32
	Start, End uint64
}

// UseTrackers has Scan ask each process's tracker which pages were
// written instead of reading all of them. Of a range not written since
// the tracker's last scan, held gives the parts the receiver holds as
// they were then (in address order); those go to unchanged unread, and
// the rest is read and goes to Scan's fn as usual.
func (r *Reader) UseTrackers(trackers map[int]WriteTracker, held func(Range) []Range, unchanged func(Range)) {
	r.trackers, r.held, r.unchanged, r.writtenOnly = trackers, held, unchanged, false
}

// UseTrackersWrittenOnly has Scan report only the pages each process's
// tracker saw written since its last scan, leaving the others out
// (post-copy's last writes: the daemon asks for those). A process without
// a tracker is read whole.
func (r *Reader) UseTrackersWrittenOnly(trackers map[int]WriteTracker) {
	r.trackers, r.held, r.unchanged, r.writtenOnly = trackers, nil, nil, true
}

// NewReader prepares to scan the given processes (host PIDs). Processes that
// have already gone are left out; it fails if none is left.
func NewReader(hostPIDs []int) (*Reader, error) {
	if os.Getpagesize() != PageSize {
		return nil, fmt.Errorf("pages: system page size %d, want %d", os.Getpagesize(), PageSize)
	}
	r := &Reader{
		buf:     make([]byte, readBufSize),
		pagemap: make([]byte, pagemapBatch*8),
		zeroPFN: zeroPagePFN(),
	}
	seen := map[int]bool{}
	for _, pid := range hostPIDs {
		if seen[pid] {
			continue
		}
		seen[pid] = true
		ns, err := nsPID(pid)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			return nil, err
		}
		r.procs = append(r.procs, proc{host: pid, ns: ns})
	}
	if len(r.procs) == 0 {
		return nil, fmt.Errorf("pages: none of the processes %v exists", hostPIDs)
	}
	return r, nil
}

// nsPID returns the pid of a process in its own (innermost) pid namespace:
// the last field of NSpid, or the host pid on kernels without NSpid.
func nsPID(pid int) (uint32, error) {
	v, ok, err := procs.Status(pid, "NSpid")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(v)
	if !ok || len(f) == 0 {
		return uint32(pid), nil
	}
	n, err := strconv.ParseUint(f[len(f)-1], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("pages: bad NSpid line in /proc/%d/status: %q", pid, v)
	}
	return uint32(n), nil
}

// ContainerPIDs returns initPID and all of its descendants, init first.
func ContainerPIDs(initPID int) ([]int, error) {
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", initPID)); err != nil {
		return nil, fmt.Errorf("pages: container init: %w", err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d/children", initPID, initPID)); err != nil {
		// Kernels without CONFIG_PROC_CHILDREN: the tree from every
		// process's parent instead.
		return append([]int{initPID}, procs.Descendants(initPID, "")...), nil
	}
	children := childrenFromTasks
	out := []int{initPID}
	seen := map[int]bool{initPID: true}
	for i := 0; i < len(out); i++ {
		for _, c := range children(out[i]) {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// childrenFromTasks lists the children of every thread of pid. A process
// that exits meanwhile simply has none.
func childrenFromTasks(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range bytes.Fields(b) {
			if c, err := strconv.Atoi(string(f)); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

var (
	zeroOnce sync.Once
	zeroPFN  uint64
)

// zeroPagePFN finds the frame of the kernel's shared zero page, which CRIU
// does not dump: a private mapping that was only read maps it. It returns 0
// when frame numbers are hidden (no CAP_SYS_ADMIN).
func zeroPagePFN() uint64 {
	zeroOnce.Do(func() {
		m, err := unix.Mmap(-1, 0, PageSize, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return
		}
		defer unix.Munmap(m)
		sink = m[0] // fault the zero page in
		f, err := os.Open("/proc/self/pagemap")
		if err != nil {
			return
		}
		defer f.Close()
		var e [8]byte
		addr := uint64(uintptr(unsafe.Pointer(&m[0])))
		if _, err := f.ReadAt(e[:], int64(addr/PageSize*8)); err != nil {
			return
		}
		v := binary.LittleEndian.Uint64(e[:])
		if v&pmPresent != 0 {
			zeroPFN = v & pmPFNMask
		}
	})
	return zeroPFN
}

// sink keeps the compiler from dropping the read that maps the zero page.
var sink byte //nolint:unused // only written: the write is the point

// errGone means the process exited during the scan.
var errGone = errors.New("process gone")

// Scan calls fn for every page that CRIU would dump as private anonymous
// memory: present or swapped pages of private mappings that are not the
// page cache's or the zero page, nor executable. (While it dumps, CRIU
// writes the system calls it makes its parasite run at the start of a
// process's first executable mapping, then puts the code back: a page
// read beside the dump could be CRIU's. Such pages, few and rare, are
// left to CRIU's dump.) Processes that exit during the scan are skipped,
// and so are pages that can no longer be read. An error from fn stops
// the scan and is returned.
func (r *Reader) Scan(fn func(p Page) error) (Stats, error) {
	start := time.Now()
	var st Stats
	for _, p := range r.procs {
		err := r.scanProc(p, fn, &st)
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			st.Duration = time.Since(start)
			return st, err
		}
		st.Processes++
	}
	st.Bytes = st.Pages * PageSize
	st.Duration = time.Since(start)
	return st, nil
}

// ReadRange reports the pages of rg that Scan would, in address order: of
// process rg.PID (in its pid namespace), in its private mappings. Nothing
// when the process is not among the reader's or has gone.
func (r *Reader) ReadRange(rg Range, fn func(p Page) error) error {
	for _, p := range r.procs {
		if p.ns != rg.PID {
			continue
		}
		err := r.scanProcRange(p, rg, fn, &Stats{})
		if errors.Is(err, errGone) {
			return nil
		}
		return err
	}
	return nil
}

// gone reports whether err means that the process or its memory went away.
func gone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

func (r *Reader) scanProc(p proc, fn func(Page) error, st *Stats) error {
	return r.scanProcRange(p, Range{PID: p.ns, End: math.MaxUint64}, fn, st)
}

// scanProcRange is scanProc within rg's addresses (no write tracking
// there: a range is read whole).
func (r *Reader) scanProcRange(p proc, rg Range, fn func(Page) error, st *Stats) error {
	dir := fmt.Sprintf("/proc/%d/", p.host)
	maps, err := os.ReadFile(dir + "maps")
	if gone(err) {
		return errGone
	}
	if err != nil {
		return fmt.Errorf("pages: %w", err)
	}
	private := procs.PrivateMappings(maps)
	if len(private) == 0 {
		return nil // a zombie has no memory left
	}
	var vmas, code []procs.Mapping // code is not read: see Scan
	for _, v := range private {
		if v.Executable() {
			code = append(code, v)
		} else {
			vmas = append(vmas, v)
		}
	}
	pm, err := os.Open(dir + "pagemap")
	if gone(err) {
		return errGone
	}
	if err != nil {
		return fmt.Errorf("pages: %w", err)
	}
	defer pm.Close()
	mem, err := os.Open(dir + "mem")
	if gone(err) {
		return errGone
	}
	if err != nil {
		return fmt.Errorf("pages: %w", err)
	}
	defer mem.Close()

	s := procScan{r: r, p: p, pm: int(pm.Fd()), mem: int(mem.Fd()), fn: fn, st: st, code: code}
	if rg.Start > 0 || rg.End < math.MaxUint64 {
		for _, v := range vmas {
			v.Start, v.End = max(v.Start, rg.Start), min(v.End, rg.End)
			if v.Start >= v.End {
				continue
			}
			if err := s.vma(v); err != nil {
				return err
			}
		}
		return nil
	}
	if t := r.trackers[p.host]; t != nil && (r.writtenOnly || r.held != nil && r.unchanged != nil) {
		st.VMAs += len(vmas)
		err := s.tracked(t)
		if gone(err) {
			return errGone
		}
		return err
	}
	for _, v := range vmas {
		st.VMAs++
		if err := s.vma(v); err != nil {
			return err
		}
	}
	return nil
}

// procScan is the state of scanning one process.
type procScan struct {
	r       *Reader
	p       proc
	pm, mem int
	fn      func(Page) error
	st      *Stats
	code    []procs.Mapping // the executable mappings, not read
}

func (s *procScan) vma(v procs.Mapping) error {
	r := s.r
	for addr := v.Start; addr < v.End; {
		n := min((v.End-addr)/PageSize, pagemapBatch)
		got, err := unix.Pread(s.pm, r.pagemap[:n*8], int64(addr/PageSize*8))
		if gone(err) {
			return errGone
		}
		if err != nil || got == 0 {
			// The mapping changed under us; its pages are read next round.
			return nil
		}
		n = uint64(got / 8)
		// Collect runs of wanted pages and read each run in one go.
		runStart := -1
		for i := uint64(0); i <= n; i++ {
			want := false
			if i < n {
				e := binary.LittleEndian.Uint64(r.pagemap[i*8:])
				want = e&pmFile == 0 && (e&pmSwapped != 0 ||
					e&pmPresent != 0 && (r.zeroPFN == 0 || e&pmPFNMask != r.zeroPFN))
			}
			switch {
			case want && runStart < 0:
				runStart = int(i)
			case !want && runStart >= 0:
				if err := s.run(addr+uint64(runStart)*PageSize, i-uint64(runStart), v.Readable()); err != nil {
					return err
				}
				runStart = -1
			}
		}
		addr += n * PageSize
	}
	return nil
}

// tracked reports the process's pages as its tracker sees them: the
// written ones read, the others read only where the receiver lacks them,
// or not at all (writtenOnly). (A written page that cannot be read is left
// out, as in a full scan.)
func (s *procScan) tracked(t WriteTracker) error {
	return t.Scan(func(start, end uint64, written bool) error {
		if !written && s.r.writtenOnly {
			return nil
		}
		return outside(s.code, start, end, func(start, end uint64) error { return s.trackedRange(start, end, written) })
	})
}

// outside calls fn for each part of [start, end) outside the mappings
// skip (in address order).
func outside(skip []procs.Mapping, start, end uint64, fn func(start, end uint64) error) error {
	for _, m := range skip {
		if m.End <= start {
			continue
		}
		if m.Start >= end {
			break
		}
		if m.Start > start {
			if err := fn(start, m.Start); err != nil {
				return err
			}
		}
		start = m.End
		if start >= end {
			return nil
		}
	}
	return fn(start, end)
}

// trackedRange reports [start, end), which the tracker says was written
// or not.
func (s *procScan) trackedRange(start, end uint64, written bool) error {
	at := start
	if !written {
		for _, h := range s.r.held(Range{PID: s.p.ns, Start: start, End: end}) {
			h.Start, h.End = max(h.Start, at), min(h.End, end)
			if h.End <= h.Start {
				continue
			}
			if err := s.run(at, (h.Start-at)/PageSize, true); err != nil {
				return err
			}
			n := (h.End - h.Start) / PageSize
			s.st.Pages += n
			s.st.Unchanged += n
			s.r.unchanged(h)
			at = h.End
		}
	}
	return s.run(at, (end-at)/PageSize, true)
}

// run reads and reports npages pages from addr on.
func (s *procScan) run(addr, npages uint64, readable bool) error {
	buf := s.r.buf
	for npages > 0 {
		n := min(npages, uint64(len(buf)/PageSize))
		got, err := s.read(buf[:n*PageSize], addr, readable)
		if errors.Is(err, errGone) {
			return err
		}
		good := uint64(got / PageSize)
		for i := uint64(0); i < good; i++ {
			d := buf[i*PageSize : (i+1)*PageSize]
			p := Page{Key: Key{PID: s.p.ns, Addr: addr + i*PageSize}, Hash: xxh3.Hash128(d), Data: d}
			s.st.Pages++
			if err := s.fn(p); err != nil {
				return err
			}
		}
		if good < n {
			// The page at addr+good could not be read (unmapped meanwhile,
			// or a hardware-poisoned page): skip it.
			good++
		}
		addr += good * PageSize
		npages -= good
	}
	return nil
}

// read fills b from the process's memory at addr, returning how many bytes
// were read before the first page that could not be.
func (s *procScan) read(b []byte, addr uint64, readable bool) (int, error) {
	if readable {
		// process_vm_readv copies straight from the process's pages, without
		// the bounce buffer that /proc/PID/mem uses.
		local := []unix.Iovec{{Base: &b[0]}}
		local[0].SetLen(len(b))
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
		n, err := unix.ProcessVMReadv(s.p.host, local, remote, 0)
		if err == unix.ESRCH {
			return 0, errGone
		}
		if err == nil && n > 0 {
			return n, nil
		}
		// Fall through: EFAULT on the first page, or a mapping that lost
		// its read permission. /proc/PID/mem reads regardless of protection.
	}
	total := 0
	for total < len(b) {
		n, err := unix.Pread(s.mem, b[total:], int64(addr)+int64(total))
		if gone(err) {
			return total, errGone
		}
		if err != nil || n <= 0 {
			// n == 0 also when the process's memory has been torn down.
			break
		}
		total += n
	}
	return total, nil
}

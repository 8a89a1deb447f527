package criu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/ferry-migrate/ferry/internal/vmas"
)

// A dump reads each task's /proc/PID/smaps for its mappings and their
// VmFlags, and the kernel walks every page table entry behind them for
// statistics CRIU does not use: ~20 ms per GiB of resident memory, with
// the container frozen. ferry's CRIU (scripts/criu-patches/0014) reads a
// snapshot taken just before the freeze instead, where the frozen task's
// mappings (/proc/PID/maps, no walk) are the snapshot's line for line.
// A flag changed over a whole mapping (madvise) changes no line, so the
// snapshot also holds each area's vm_flags, read through a BPF iterator
// (package vmas, no walk), and Check reads them again from the frozen
// tasks: the same flags, the dump took the right ones.

// SmapsSnapshotEnv names the snapshot directory in CRIU's environment.
const SmapsSnapshotEnv = "CRIU_SMAPS_SNAPSHOT"

// vmFlagBits are the vm_flags behind the VmFlags CRIU reads
// (criu/proc_parse.c: __parse_vmflags; the kernel's names in
// fs/proc/task_mmu.c). "dp" and "ss" are left out, their bits depending
// on the kernel's configuration: an area with either fails the
// snapshot's validation, and CRIU reads that process's smaps.
var vmFlagBits = map[string]uint64{
	"gd": 0x00000100, // VM_GROWSDOWN
	"pf": 0x00000400, // VM_PFNMAP
	"lo": 0x00002000, // VM_LOCKED
	"io": 0x00004000, // VM_IO
	"sr": 0x00008000, // VM_SEQ_READ
	"rr": 0x00010000, // VM_RAND_READ
	"dc": 0x00020000, // VM_DONTCOPY
	"nr": 0x00200000, // VM_NORESERVE
	"ht": 0x00400000, // VM_HUGETLB
	"wf": 0x02000000, // VM_WIPEONFORK
	"dd": 0x04000000, // VM_DONTDUMP
	"hg": 0x20000000, // VM_HUGEPAGE
	"nh": 0x40000000, // VM_NOHUGEPAGE
	"mg": 0x80000000, // VM_MERGEABLE
}

// vmFlagsCRIUReads are the VmFlags CRIU's dump reads.
var vmFlagsCRIUReads = []string{"gd", "lo", "nr", "ht", "dp", "sr", "rr", "dc", "dd", "mg", "hg", "nh", "wf", "io", "pf", "ss"}

// notTheTasks are vm_flags that change without the task doing anything
// and reach no image: ferry's own write tracking (userfaultfd missing and
// write-protect modes) and soft-dirty.
const notTheTasks = 0x00000200 | 0x00001000 | 0x08000000

// SmapsSnapshot is the container's smaps as CRIU reads them, taken before
// the freeze, and its areas' vm_flags then.
type SmapsSnapshot struct {
	vmas    *vmas.Reader
	untrack func()
	flags   map[int]map[[2]uint64]uint64 // per process, per area
}

// TakeSmapsSnapshot writes into dir, for each of pids, the mapping lines
// and VmFlags of its smaps as they are now, and reads its areas' vm_flags.
// A process whose smaps and vm_flags disagree (it changed them between
// the two reads, or holds a flag this package cannot tell) is left out,
// as is one that ended: CRIU reads their smaps. r reads the vm_flags;
// Close stops tracking the processes there.
func TakeSmapsSnapshot(dir string, pids []int, r *vmas.Reader) (*SmapsSnapshot, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	untrack, err := r.Track(pids)
	if err != nil {
		return nil, err
	}
	s := &SmapsSnapshot{vmas: r, untrack: untrack, flags: map[int]map[[2]uint64]uint64{}}
	smaps := map[int][]byte{}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			untrack()
			return nil, fmt.Errorf("smaps snapshot: %w", err)
		}
		smaps[pid] = mappingsAndFlags(b)
	}
	areas, err := r.Read()
	if err != nil {
		untrack()
		return nil, err
	}
	for pid, snap := range smaps {
		if !agrees(parseSnapshot(snap), areas[pid]) {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(pid)), snap, 0o600); err != nil {
			untrack()
			return nil, fmt.Errorf("smaps snapshot: %w", err)
		}
		s.flags[pid] = byArea(areas[pid])
	}
	return s, nil
}

// Processes is how many processes the snapshot holds.
func (s *SmapsSnapshot) Processes() int { return len(s.flags) }

// Check reads the areas' vm_flags again, the container frozen: an area
// the snapshot holds whose flags changed since means CRIU may have taken
// the snapshot's, and the dump must not count. Areas added or removed
// changed the mapping lines, so CRIU read those processes' smaps.
func (s *SmapsSnapshot) Check() error {
	areas, err := s.vmas.Read()
	if err != nil {
		return err
	}
	for pid, was := range s.flags {
		for _, a := range areas[pid] {
			f, ok := was[[2]uint64{a.Start, a.End}]
			if ok && f&^notTheTasks != a.Flags&^notTheTasks {
				return fmt.Errorf("process %d changed the flags of its memory area %x-%x (madvise or mlock: vm_flags %#x, then %#x) as it was frozen, after ferry read them for the dump; migrating it again reads them anew", pid, a.Start, a.End, f, a.Flags)
			}
		}
	}
	return nil
}

// Close stops tracking the snapshot's processes.
func (s *SmapsSnapshot) Close() { s.untrack() }

func byArea(v []vmas.VMA) map[[2]uint64]uint64 {
	m := make(map[[2]uint64]uint64, len(v))
	for _, a := range v {
		m[[2]uint64{a.Start, a.End}] = a.Flags
	}
	return m
}

// agrees tells whether smaps' mappings are the areas, one for one (but
// for the vsyscall page, which smaps shows and is no area), each with the
// VmFlags CRIU reads that its vm_flags make.
func agrees(maps []snapshotMapping, areas []vmas.VMA) bool {
	byRange := byArea(areas)
	n := 0
	for _, m := range maps {
		start, end, ok := mappingRange(m.line)
		if !ok {
			return false
		}
		f, found := byRange[[2]uint64{start, end}]
		if !found {
			if start >= 1<<63 { // the vsyscall page, in the kernel's half
				continue
			}
			return false
		}
		n++
		if !slices.Equal(m.flags, tokens(f)) {
			return false
		}
	}
	return n == len(areas)
}

// tokens are the VmFlags CRIU reads that vm_flags f shows, sorted.
func tokens(f uint64) []string {
	var t []string
	for name, bit := range vmFlagBits {
		if f&bit != 0 {
			t = append(t, name)
		}
	}
	slices.Sort(t)
	return t
}

func mappingRange(line string) (start, end uint64, ok bool) {
	r, _, _ := strings.Cut(line, " ")
	a, b, found := strings.Cut(r, "-")
	if !found {
		return 0, 0, false
	}
	start, err1 := strconv.ParseUint(a, 16, 64)
	end, err2 := strconv.ParseUint(b, 16, 64)
	return start, end, err1 == nil && err2 == nil
}

// mappingsAndFlags keeps the mapping lines of smaps and their VmFlags
// lines: what CRIU reads of it.
func mappingsAndFlags(smaps []byte) []byte {
	var out bytes.Buffer
	for line := range bytes.Lines(smaps) {
		if isMappingLine(line) || bytes.HasPrefix(line, []byte("VmFlags:")) {
			out.Write(line)
		}
	}
	return out.Bytes()
}

// isMappingLine tells smaps' mapping lines ("START-END PERMS ...") from
// its "Key: value" lines, as CRIU does.
func isMappingLine(line []byte) bool {
	dash := bytes.IndexByte(line, '-')
	if dash <= 0 {
		return false
	}
	for _, c := range line[:dash] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

type snapshotMapping struct {
	line  string
	flags []string // those CRIU reads, sorted
}

func parseSnapshot(s []byte) []snapshotMapping {
	var out []snapshotMapping
	for line := range bytes.Lines(s) {
		switch {
		case isMappingLine(line):
			out = append(out, snapshotMapping{line: string(bytes.TrimRight(line, "\n"))})
		case len(out) > 0 && bytes.HasPrefix(line, []byte("VmFlags:")):
			var f []string
			for tok := range strings.FieldsSeq(string(line[len("VmFlags:"):])) {
				if slices.Contains(vmFlagsCRIUReads, tok) {
					f = append(f, tok)
				}
			}
			slices.Sort(f)
			out[len(out)-1].flags = f
		}
	}
	return out
}

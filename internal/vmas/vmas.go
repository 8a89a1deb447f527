// Package vmas reads processes' memory areas with their kernel flags
// (vm_flags) through a BPF task_vma iterator: what smaps' VmFlags says of
// them, without the walk of every page table entry smaps makes for its
// statistics (~20 ms per GiB of resident memory).
package vmas

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
)

// VMA is one memory area of a process.
type VMA struct {
	Start, End uint64
	Flags      uint64 // the kernel's vm_flags
}

// Reader reads the memory areas of the processes it tracks. Its BPF
// program is loaded once, for an agent's life: loading needs the kernel's
// BTF, which cilium/ebpf decodes whole (~40 MB of heap, ~100 ms), and
// which is let go of as soon as the program is in. Tracking a process is
// a map update; each Read is one pass of the iterator (a fraction of a
// millisecond).
type Reader struct {
	prog *ebpf.Program
	iter *link.Iter
	pids *ebpf.Map // tgid -> 1: the processes whose areas the program writes

	mu      sync.Mutex
	tracked map[int]int // how many trackers each process has
}

// record is what the program writes per area: the process, the area.
const record = 4 * 8

// maxTracked is how many processes can be tracked at once.
const maxTracked = 16384

// NewReader loads the iterator. It fails where the kernel has no BTF, no
// task_vma iterator, or this process may not load BPF programs.
func NewReader() (*Reader, error) {
	off, err := kernelOffsets()
	if err != nil {
		return nil, fmt.Errorf("vmas: %w", err)
	}
	defer btf.FlushKernelSpec() // the program has what it needs of it
	pids, err := ebpf.NewMap(&ebpf.MapSpec{Name: "ferry_vmas_pids", Type: ebpf.Hash, KeySize: 4, ValueSize: 1, MaxEntries: maxTracked})
	if err != nil {
		return nil, fmt.Errorf("vmas: %w", err)
	}
	insns := program(off)
	if err := insns[slices.IndexFunc(insns, func(i asm.Instruction) bool { return i.Reference() == "pids" })].AssociateMap(pids); err != nil {
		pids.Close()
		return nil, fmt.Errorf("vmas: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "ferry_vmas",
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceIter,
		AttachTo:     "task_vma",
		Instructions: insns,
		License:      "Dual MIT/GPL", // bpf_seq_write is GPL-only
	})
	if err != nil {
		pids.Close()
		return nil, fmt.Errorf("vmas: load the task_vma iterator: %w", err)
	}
	iter, err := link.AttachIter(link.IterOptions{Program: prog})
	if err != nil {
		prog.Close()
		pids.Close()
		return nil, fmt.Errorf("vmas: attach the task_vma iterator: %w", err)
	}
	return &Reader{prog: prog, iter: iter, pids: pids, tracked: map[int]int{}}, nil
}

// Available says why this host cannot read areas' flags, or nil.
func Available() error {
	r, err := NewReader()
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = r.Read()
	return err
}

// Track has Read return the areas of pids (thread group IDs) until
// untrack is called.
func (r *Reader) Track(pids []int) (untrack func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var added []int
	for _, pid := range pids {
		if r.tracked[pid] == 0 {
			if err := r.pids.Put(uint32(pid), uint8(1)); err != nil {
				r.untrack(added)
				return nil, fmt.Errorf("vmas: track %d: %w", pid, err)
			}
		}
		r.tracked[pid]++
		added = append(added, pid)
	}
	return sync.OnceFunc(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.untrack(added)
	}), nil
}

func (r *Reader) untrack(pids []int) {
	for _, pid := range pids {
		if r.tracked[pid]--; r.tracked[pid] == 0 {
			delete(r.tracked, pid)
			_ = r.pids.Delete(uint32(pid))
		}
	}
}

// Read returns each tracked process's memory areas, in address order; a
// process that has ended (or whose leader has, its threads living on) is
// absent.
func (r *Reader) Read() (map[int][]VMA, error) {
	rd, err := r.iter.Open()
	if err != nil {
		return nil, fmt.Errorf("vmas: %w", err)
	}
	defer rd.Close()
	b, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("vmas: %w", err)
	}
	return parse(b)
}

func parse(b []byte) (map[int][]VMA, error) {
	if len(b)%record != 0 {
		return nil, fmt.Errorf("vmas: %d bytes from the iterator, not whole records", len(b))
	}
	out := map[int][]VMA{}
	for ; len(b) > 0; b = b[record:] {
		pid := int(binary.NativeEndian.Uint64(b))
		out[pid] = append(out[pid], VMA{
			Start: binary.NativeEndian.Uint64(b[8:]),
			End:   binary.NativeEndian.Uint64(b[16:]),
			Flags: binary.NativeEndian.Uint64(b[24:]),
		})
	}
	for _, v := range out {
		slices.SortFunc(v, func(a, b VMA) int { return cmp.Compare(a.Start, b.Start) })
	}
	return out, nil
}

// Close unloads the program.
func (r *Reader) Close() error {
	return errors.Join(r.iter.Close(), r.prog.Close(), r.pids.Close())
}

// offsets are where the program finds what it reads, from the kernel's
// own BTF.
type offsets struct {
	meta, task, vma   uint32 // in struct bpf_iter__task_vma
	seq               uint32 // in struct bpf_iter_meta
	pid, tgid         uint32 // in struct task_struct
	start, end, flags uint32 // in struct vm_area_struct
}

func kernelOffsets() (offsets, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return offsets{}, err
	}
	var o offsets
	for _, f := range []struct {
		typ, member string
		to          *uint32
	}{
		{"bpf_iter__task_vma", "meta", &o.meta},
		{"bpf_iter__task_vma", "task", &o.task},
		{"bpf_iter__task_vma", "vma", &o.vma},
		{"bpf_iter_meta", "seq", &o.seq},
		{"task_struct", "pid", &o.pid},
		{"task_struct", "tgid", &o.tgid},
		{"vm_area_struct", "vm_start", &o.start},
		{"vm_area_struct", "vm_end", &o.end},
		{"vm_area_struct", "vm_flags", &o.flags},
	} {
		var s *btf.Struct
		if err := spec.TypeByName(f.typ, &s); err != nil {
			return offsets{}, err
		}
		off, ok := memberOffset(s.Members, f.member)
		if !ok {
			return offsets{}, fmt.Errorf("no %s in the kernel's struct %s", f.member, f.typ)
		}
		*f.to = off
	}
	return o, nil
}

// memberOffset finds a member by name, inside anonymous structs and
// unions too, and returns its offset in bytes.
func memberOffset(members []btf.Member, name string) (uint32, bool) {
	for _, m := range members {
		if m.Name == name {
			return m.Offset.Bytes(), true
		}
		if m.Name != "" {
			continue
		}
		var inner []btf.Member
		switch t := btf.UnderlyingType(m.Type).(type) {
		case *btf.Struct:
			inner = t.Members
		case *btf.Union:
			inner = t.Members
		}
		if off, ok := memberOffset(inner, name); ok {
			return m.Offset.Bytes() + off, true
		}
	}
	return 0, false
}

// program writes, for each memory area of a tracked process's leader,
// (tgid, vm_start, vm_end, vm_flags) into the iterator's output.
func program(o offsets) asm.Instructions {
	const (
		ctx  = asm.R6
		vma  = asm.R7
		task = asm.R8
		tgid = asm.R9
	)
	return asm.Instructions{
		asm.Mov.Reg(ctx, asm.R1),
		asm.LoadMem(vma, ctx, int16(o.vma), asm.DWord),
		asm.JEq.Imm(vma, 0, "out"),
		asm.LoadMem(task, ctx, int16(o.task), asm.DWord),
		asm.JEq.Imm(task, 0, "out"),
		asm.LoadMem(tgid, task, int16(o.tgid), asm.Word),
		asm.LoadMem(asm.R2, task, int16(o.pid), asm.Word),
		asm.JNE.Reg(asm.R2, tgid, "out"), // a thread: its leader has the same areas
		asm.StoreMem(asm.RFP, -40, tgid, asm.Word),
		asm.LoadMapPtr(asm.R1, 0).WithReference("pids"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -40),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"), // not tracked
		asm.StoreMem(asm.RFP, -32, tgid, asm.DWord),
		asm.LoadMem(asm.R2, vma, int16(o.start), asm.DWord),
		asm.StoreMem(asm.RFP, -24, asm.R2, asm.DWord),
		asm.LoadMem(asm.R2, vma, int16(o.end), asm.DWord),
		asm.StoreMem(asm.RFP, -16, asm.R2, asm.DWord),
		asm.LoadMem(asm.R2, vma, int16(o.flags), asm.DWord),
		asm.StoreMem(asm.RFP, -8, asm.R2, asm.DWord),
		asm.LoadMem(asm.R1, ctx, int16(o.meta), asm.DWord),
		asm.LoadMem(asm.R1, asm.R1, int16(o.seq), asm.DWord),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -record),
		asm.Mov.Imm(asm.R3, record),
		asm.FnSeqWrite.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}

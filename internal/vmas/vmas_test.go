package vmas

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"unsafe"

	"golang.org/x/sys/unix"
)

// newReader tracks pids, or skips the test where BPF iterators are not
// available.
func newReader(t *testing.T, pids ...int) *Reader {
	t.Helper()
	r, err := NewReader()
	if err != nil {
		t.Skipf("no BPF task_vma iterator here: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	untrack, err := r.Track(pids)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(untrack)
	return r
}

// The iterator's areas are the process's maps (but the vsyscall page,
// which is no area), and only the processes asked for.
func TestReadIsMaps(t *testing.T) {
	pid := os.Getpid()
	r := newReader(t, pid, 1<<30)
	got, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[pid]) == 0 {
		t.Fatalf("areas of %d processes, want this one's only", len(got))
	}
	var have []string
	for _, v := range got[pid] {
		have = append(have, fmt.Sprintf("%x-%x", v.Start, v.End))
	}
	var want []string
	for _, line := range mapsLines(t) {
		r := strings.Fields(line)[0]
		if strings.Contains(line, "[vsyscall]") {
			continue
		}
		var start, end uint64
		fmt.Sscanf(r, "%x-%x", &start, &end)
		want = append(want, fmt.Sprintf("%x-%x", start, end))
	}
	if !slices.Equal(have, want) {
		t.Errorf("the iterator's areas\n%v\nare not maps'\n%v", have, want)
	}
}

// An area's flags are the kernel's vm_flags: a mapping made dontdump,
// locked or dontfork shows VM_DONTDUMP, VM_LOCKED or VM_DONTCOPY.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func([]byte) error
		bit  uint64
	}{
		{"dontdump", func(b []byte) error { return unix.Madvise(b, unix.MADV_DONTDUMP) }, 0x04000000},
		{"dontfork", func(b []byte) error { return unix.Madvise(b, unix.MADV_DONTFORK) }, 0x00020000},
		{"locked", unix.Mlock, 0x00002000},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem, err := unix.Mmap(-1, 0, 3*4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(mem)
			area := mem[4096 : 2*4096] // its own area once its flags differ
			if err := c.set(area); err != nil {
				t.Skipf("%s: %v", c.name, err)
			}
			pid := os.Getpid()
			got, err := newReader(t, pid).Read()
			if err != nil {
				t.Fatal(err)
			}
			start := uint64(uintptr(unsafePointer(area)))
			i := slices.IndexFunc(got[pid], func(v VMA) bool { return v.Start == start })
			if i < 0 || got[pid][i].End != start+4096 {
				t.Fatalf("no area %x-%x among %x", start, start+4096, got[pid])
			}
			if f := got[pid][i].Flags; f&c.bit == 0 || f&0x1 == 0 || f&0x2 != 0 {
				t.Errorf("vm_flags %#x: want %#x and VM_READ, not VM_WRITE", f, c.bit)
			}
		})
	}
}

func mapsLines(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// A process is read while tracked, by one tracker or more, and not after.
func TestTrack(t *testing.T) {
	pid := os.Getpid()
	r := newReader(t)
	areas := func() int {
		t.Helper()
		got, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		return len(got[pid])
	}
	if n := areas(); n != 0 {
		t.Fatalf("%d areas of a process nobody tracks", n)
	}
	one, err := r.Track([]int{pid})
	if err != nil {
		t.Fatal(err)
	}
	two, err := r.Track([]int{pid})
	if err != nil {
		t.Fatal(err)
	}
	if areas() == 0 {
		t.Fatal("no area of a tracked process")
	}
	one()
	one() // once only
	if areas() == 0 {
		t.Fatal("no area of a process still tracked once")
	}
	two()
	if n := areas(); n != 0 {
		t.Fatalf("%d areas of a process no longer tracked", n)
	}
}

func TestParse(t *testing.T) {
	if _, err := parse(make([]byte, record+1)); err == nil {
		t.Error("a partial record parsed")
	}
	b := make([]byte, 0, 2*record)
	for _, v := range [][4]uint64{{7, 0x2000, 0x3000, 3}, {7, 0x1000, 0x2000, 1}} {
		for _, x := range v {
			b = append(b, byte(x), byte(x>>8), 0, 0, 0, 0, 0, 0)
		}
	}
	got, err := parse(b)
	if err != nil || !slices.Equal(got[7], []VMA{{0x1000, 0x2000, 1}, {0x2000, 0x3000, 3}}) {
		t.Errorf("parse = %v, %v; want process 7's two areas in address order", got, err)
	}
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

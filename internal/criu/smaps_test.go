package criu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/procs/procstest"
	"github.com/ferry-migrate/ferry/internal/vmas"
)

func TestAgrees(t *testing.T) {
	const smaps = "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\nVmFlags: rd wr mr mw me ac \n" +
		"7f38cb31f000-7f390b31f000 rw-p 00000000 00:00 0 \nVmFlags: rd wr mr mw me ac dd \n" +
		"7ffc2e1e0000-7ffc2e201000 rw-p 00000000 00:00 0                          [stack]\nVmFlags: rd wr mr mw me gd ac \n" +
		"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\nVmFlags: ex \n"
	const rw = 0x1 | 0x2 | 0x10 | 0x20 | 0x40 | 0x100000 // rd wr mr mw me ac
	areas := func(heap, anon, stack uint64) []vmas.VMA {
		return []vmas.VMA{{Start: 0x55d0c0a00000, End: 0x55d0c0a21000, Flags: heap}, {Start: 0x7f38cb31f000, End: 0x7f390b31f000, Flags: anon}, {Start: 0x7ffc2e1e0000, End: 0x7ffc2e201000, Flags: stack}}
	}
	maps := parseSnapshot([]byte(smaps))
	for _, c := range []struct {
		name  string
		areas []vmas.VMA
		want  bool
	}{
		{"the same", areas(rw, rw|0x04000000, rw|0x100), true},
		{"flags CRIU does not read differ", areas(rw|0x08000000, rw|0x04000000|0x1000, rw|0x100), true},
		{"dontdump gone", areas(rw, rw, rw|0x100), false},
		{"locked", areas(rw|0x2000, rw|0x04000000, rw|0x100), false},
		{"an area fewer", areas(rw, rw|0x04000000, rw|0x100)[:2], false},
		{"an area more", append(areas(rw, rw|0x04000000, rw|0x100), vmas.VMA{Start: 0x7ffd00000000, End: 0x7ffd00001000, Flags: rw}), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := agrees(maps, c.areas); got != c.want {
				t.Errorf("agrees = %v, want %v", got, c.want)
			}
		})
	}
}

func TestMappingsAndFlags(t *testing.T) {
	smaps := "7f38cb31f000-7f390b31f000 rw-p 00000000 00:00 0 \nSize:            1048576 kB\nRss:             1048576 kB\nTHPeligible:    0\nVmFlags: rd wr mr mw me ac \n" +
		"7f390b31f000-7f390b320000 r--p 00000000 08:01 1234                       /usr/lib/libc.so.6\nSize:                  4 kB\nVmFlags: rd mr mw me \n"
	want := "7f38cb31f000-7f390b31f000 rw-p 00000000 00:00 0 \nVmFlags: rd wr mr mw me ac \n" +
		"7f390b31f000-7f390b320000 r--p 00000000 08:01 1234                       /usr/lib/libc.so.6\nVmFlags: rd mr mw me \n"
	if got := string(mappingsAndFlags([]byte(smaps))); got != want {
		t.Errorf("mappingsAndFlags:\n%s\nwant\n%s", got, want)
	}
}

// startSnapshotted is a mapper process and a reader of its areas; it
// skips the test where BPF iterators are not available.
func startSnapshotted(t *testing.T) (pid int, ask func(string), r *vmas.Reader) {
	t.Helper()
	pid, ask = procstest.StartMapper(t)
	r, err := vmas.NewReader()
	if err != nil {
		t.Skipf("no BPF task_vma iterator here: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return pid, ask, r
}

// A real process's smaps and vm_flags agree, every area (its stack's
// growing down, its vDSO's data, the mapper's dontdump): the table of
// flags is this kernel's; and they disagree once it changed a flag
// between the two reads.
func TestSmapsAgreeWithVMFlags(t *testing.T) {
	pid, ask, r := startSnapshotted(t)
	untrack, err := r.Track([]int{pid})
	if err != nil {
		t.Fatal(err)
	}
	defer untrack()
	read := func() []snapshotMapping {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
		if err != nil {
			t.Fatal(err)
		}
		return parseSnapshot(mappingsAndFlags(b))
	}
	areas := func() []vmas.VMA {
		a, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		return a[pid]
	}
	ask("dontdump")
	if maps := read(); !agrees(maps, areas()) {
		t.Fatalf("smaps and vm_flags disagree with nothing changed:\n%v\n%x", maps, areas())
	}
	maps := read()
	ask("dodump")
	if agrees(maps, areas()) {
		t.Fatal("a mapping's dontdump went between smaps and vm_flags, and they agree")
	}
}

// The snapshot holds against the process as long as it changes nothing;
// a flag changed over a whole mapping (its line the same) is caught, with
// a mapping added or without; a mapping added alone is not an error.
func TestSmapsSnapshotAgainstAProcess(t *testing.T) {
	pid, ask, r := startSnapshotted(t)
	dir := filepath.Join(t.TempDir(), "smaps")
	s, err := TakeSmapsSnapshot(dir, []int{pid, 1 << 30}, r) // the second PID does not exist
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 1 || ents[0].Name() != strconv.Itoa(pid) || s.Processes() != 1 {
		t.Fatalf("snapshot holds %v (%d processes), want the one living process", ents, s.Processes())
	}
	if err := s.Check(); err != nil {
		t.Fatalf("nothing changed, yet: %v", err)
	}
	ask("dontdump")
	err = s.Check()
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("process %d changed the flags", pid)) {
		t.Fatalf("a mapping made dontdump: %v, want the change named", err)
	}
	ask("dodump")
	if err := s.Check(); err != nil {
		t.Fatalf("the flags back as they were: %v", err)
	}
	ask("map")
	if err := s.Check(); err != nil {
		t.Fatalf("a mapping more, no flag changed: %v", err)
	}
	ask("dontdump")
	if err := s.Check(); err == nil {
		t.Fatal("a mapping more and another made dontdump: no error")
	}
}

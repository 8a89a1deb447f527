package procs

import (
	"os"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"golang.org/x/sys/unix"
)

func TestReferencedPrivate(t *testing.T) {
	smaps := []byte(`55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Referenced:           12 kB
7f0000000000-7f0000100000 r-xp 00000000 08:01 123                        /usr/lib/libc.so.6
Referenced:          800 kB
7f0000200000-7f0000300000 rw-s 00000000 00:05 77                         /dev/shm/x
Referenced:          100 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
Size:               1024 kB
Referenced:          256 kB
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
Referenced:            4 kB
`)
	// The heap and the anonymous mapping; the library's text is private
	// too, readable: CRIU moves its pages when they were written, and
	// PrivateMappings keeps it.
	want := int64(12+800+256) << 10
	if got := referencedPrivate(smaps); got != want {
		t.Errorf("referencedPrivate = %d, want %d", got, want)
	}
}

// Memory touched after the bits were cleared counts, memory left alone
// does not.
func TestReferencedSeesTouchedPages(t *testing.T) {
	const size = 64 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := 0; i < size; i += 4096 {
		mem[i] = 1
	}
	if err := ClearReferenced(os.Getpid()); err != nil {
		t.Skipf("SKIP (not a pass): cannot clear the accessed bits here: %v", err)
	}
	before, err := Referenced(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 16<<20; i += 4096 {
		mem[i] = 2
	}
	after, err := Referenced(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < 16<<20 || got > 32<<20 {
		t.Errorf("16 MiB touched of 64: Referenced grew by %d MiB (%d before)", got>>20, before>>20)
	}
}

// An anonymous shared mapping counts what it holds, once however many
// times it is mapped; private memory does not count.
func TestSharedMemory(t *testing.T) {
	testroot.Require(t, "SKIP (not a pass): /proc/PID/map_files needs root")
	before := SharedMemory([]int{os.Getpid()})
	shared, err := unix.Mmap(-1, 0, 8<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(shared)
	private, err := unix.Mmap(-1, 0, 8<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(private)
	for i := 0; i < 4<<20; i += 4096 {
		shared[i], private[i] = 1, 1
	}
	// The same process twice: each object once.
	if got := SharedMemory([]int{os.Getpid(), os.Getpid()}) - before; got != 4<<20 {
		t.Errorf("4 MiB written into a shared mapping: %d bytes counted", got)
	}
}

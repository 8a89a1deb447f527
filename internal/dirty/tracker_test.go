package dirty

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/inject"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/procs/procstest"
)

// The tests run a child process (this test binary again) that maps a
// region of its own, writes the pages it is told to, and answers each
// command with a line: the tracker is checked against what the child
// really wrote.

const (
	childEnv      = "FERRY_DIRTY_CHILD"
	childPagesEnv = "FERRY_DIRTY_CHILD_PAGES" // the region's size, if not regionPages
	regionPages   = 256
	pageSize      = 4096
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		child(mode)
		return
	}
	os.Exit(m.Run())
}

// child serves commands on stdin:
//
//	w N     write page N of the region
//	W N     write pages 0, 2, 4, ... (N of them)
//	R N     from now on, write a page every N µs, all over the region
//	m       map a second region and write all of it
//	d       unmap the second region
//	z N     MADV_DONTNEED page N of the region
//	f       map 16 pages of this program's file privately, read them
//	        all and write the first
//	p       print nothing but "ok" (am I alive and answering?)
func child(mode string) {
	switch mode {
	case "seccomp-kill":
		installFilter(unix.SECCOMP_RET_KILL_PROCESS)
	case "seccomp-errno":
		installFilter(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	}
	npages := regionPages
	if n, err := strconv.Atoi(os.Getenv(childPagesEnv)); err == nil {
		npages = n
	}
	region, err := unix.Mmap(-1, 0, npages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		panic(err)
	}
	for i := range npages {
		region[i*pageSize] = 1
	}
	var second []byte
	fmt.Printf("region %d\n", uintptr(unsafe.Pointer(&region[0])))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		n := 0
		if len(f) > 1 {
			n, _ = strconv.Atoi(f[1])
		}
		switch f[0] {
		case "w":
			region[n*pageSize+8]++
		case "R":
			go func() { // a page every n microseconds, stepping far
				for i := 0; ; i += 7919 {
					region[(i%npages)*pageSize+16]++
					time.Sleep(time.Duration(n) * time.Microsecond)
				}
			}()
		case "W":
			for i := range n { // every other page from page 0: n ranges
				region[2*i*pageSize+8]++
			}
		case "m":
			second, _ = unix.Mmap(-1, 0, 16*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			for i := range 16 {
				second[i*pageSize] = 2
			}
			fmt.Printf("second %d\n", uintptr(unsafe.Pointer(&second[0])))
			continue
		case "f":
			exe, err := os.Open("/proc/self/exe")
			if err != nil {
				panic(err)
			}
			file, err := unix.Mmap(int(exe.Fd()), 0, 16*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
			exe.Close()
			if err != nil {
				panic(err)
			}
			var sum byte
			for i := range 16 {
				sum += file[i*pageSize]
			}
			file[0] = sum
			fmt.Printf("file %d\n", uintptr(unsafe.Pointer(&file[0])))
			continue
		case "d":
			_ = unix.Munmap(second)
		case "z":
			_ = unix.Madvise(region[n*pageSize:(n+1)*pageSize], unix.MADV_DONTNEED)
		}
		fmt.Println("ok")
	}
}

// installFilter makes userfaultfd(2) meet the given seccomp action.
func installFilter(act uint32) {
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_USERFAULTFD, SkipFalse: 1},
		bpf.RetConstant{Val: act},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	})
	if err != nil {
		panic(err)
	}
	filters := make([]unix.SockFilter, len(prog))
	for i, p := range prog {
		filters[i] = unix.SockFilter{Code: p.Op, Jt: p.Jt, Jf: p.Jf, K: p.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filters)), Filter: &filters[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, 1 /* SECCOMP_SET_MODE_FILTER */, 1 /* TSYNC */, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		panic(errno)
	}
}

type kid struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	region uint64
}

func startChild(t *testing.T, mode string, env ...string) *kid {
	t.Helper()
	testroot.Require(t, "needs root: ptrace and pidfd_getfd of another process")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), env...)
	cmd.Stderr = os.Stderr
	in, out := procstest.StartTalking(t, cmd)
	k := &kid{t: t, cmd: cmd, in: in, out: out}
	t.Cleanup(func() {
		in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	f := k.line()
	if len(f) != 2 || f[0] != "region" {
		t.Fatalf("child said %v", f)
	}
	k.region, _ = strconv.ParseUint(f[1], 10, 64)
	return k
}

func (k *kid) line() []string {
	k.t.Helper()
	got := make(chan bool, 1)
	go func() { got <- k.out.Scan() }()
	select {
	case ok := <-got:
		if !ok {
			k.t.Fatalf("child gone: %v", k.out.Err())
		}
	case <-time.After(10 * time.Second):
		k.t.Fatal("child silent for 10 s")
	}
	return strings.Fields(k.out.Text())
}

func (k *kid) do(cmd string) []string {
	k.t.Helper()
	if _, err := fmt.Fprintln(k.in, cmd); err != nil {
		k.t.Fatal(err)
	}
	return k.line()
}

// written scans and returns, of [lo, hi), the pages reported present and
// the pages reported written (page numbers from lo).
func written(t *testing.T, tr *Tracker, lo, hi uint64) (present, dirty map[int]bool) {
	t.Helper()
	present, dirty = map[int]bool{}, map[int]bool{}
	err := tr.Scan(func(start, end uint64, w bool) error {
		for a := max(start, lo); a < min(end, hi); a += pageSize {
			present[int((a-lo)/pageSize)] = true
			if w {
				dirty[int((a-lo)/pageSize)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return present, dirty
}

func track(t *testing.T, k *kid) *Tracker {
	t.Helper()
	tr, err := Track(k.cmd.Process.Pid)
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
		t.Skipf("this kernel lacks asynchronous userfaultfd write protection or PAGEMAP_SCAN: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestTrackerReportsExactlyTheWrittenPages(t *testing.T) {
	k := startChild(t, "plain")
	tr := track(t, k)
	lo, hi := k.region, k.region+regionPages*pageSize
	present, dirty := written(t, tr, lo, hi)
	if len(present) != regionPages || len(dirty) != regionPages {
		t.Fatalf("first scan: %d present, %d written; want all %d both (everything counts as written once)", len(present), len(dirty), regionPages)
	}
	if _, dirty = written(t, tr, lo, hi); len(dirty) != 0 {
		t.Fatalf("nothing written, yet %d pages reported", len(dirty))
	}
	for _, p := range []int{3, 7, 200} {
		if f := k.do(fmt.Sprintf("w %d", p)); len(f) != 1 || f[0] != "ok" {
			t.Fatalf("child: %v", f)
		}
	}
	present, dirty = written(t, tr, lo, hi)
	if len(present) != regionPages || len(dirty) != 3 || !dirty[3] || !dirty[7] || !dirty[200] {
		t.Fatalf("wrote pages 3, 7, 200: %d present, written %v", len(present), dirty)
	}
	if _, dirty = written(t, tr, lo, hi); len(dirty) != 0 {
		t.Fatalf("the scan did not protect again: %v written", dirty)
	}
	// A page dropped is no longer there; written again, it is reported.
	k.do("z 10")
	present, _ = written(t, tr, lo, hi)
	if present[10] {
		t.Fatal("page 10 dropped with MADV_DONTNEED, still reported present")
	}
	k.do("w 10")
	if _, dirty = written(t, tr, lo, hi); len(dirty) != 1 || !dirty[10] {
		t.Fatalf("rewrote dropped page 10: written %v", dirty)
	}
}

// A private file mapping's pages are reported once written (the process's
// own copy), never while they are the page cache's; anonymous memory next
// to it is reported whole.
func TestScanLeavesOutThePageCache(t *testing.T) {
	k := startChild(t, "plain")
	tr := track(t, k)
	f := k.do("f")
	file, _ := strconv.ParseUint(f[1], 10, 64)
	present, _ := written(t, tr, file, file+16*pageSize)
	if len(present) != 1 || !present[0] {
		t.Fatalf("file mapping, all 16 pages read, page 0 written: reported %v, want page 0 only", present)
	}
	if present, _ = written(t, tr, k.region, k.region+regionPages*pageSize); len(present) != regionPages {
		t.Fatalf("anonymous region: %d pages reported, want %d", len(present), regionPages)
	}
}

// The last scan reports what was written, as any other, but protects
// nothing again: a scan after it still finds those pages written.
func TestLastScanDoesNotProtect(t *testing.T) {
	k := startChild(t, "plain")
	tr := track(t, k)
	lo, hi := k.region, k.region+regionPages*pageSize
	written(t, tr, lo, hi)
	k.do("w 5")
	tr.Last()
	if _, dirty := written(t, tr, lo, hi); len(dirty) != 1 || !dirty[5] {
		t.Fatalf("wrote page 5: the last scan found %v written", dirty)
	}
	if _, dirty := written(t, tr, lo, hi); len(dirty) != 1 || !dirty[5] {
		t.Fatalf("page 5 protected again by the last scan: a scan after it found %v written", dirty)
	}
}

func TestTrackerCountsANewMappingAsWritten(t *testing.T) {
	k := startChild(t, "plain")
	tr := track(t, k)
	written(t, tr, 0, userEnd)
	f := k.do("m")
	second, _ := strconv.ParseUint(f[1], 10, 64)
	present, dirty := written(t, tr, second, second+16*pageSize)
	if len(present) != 16 || len(dirty) != 16 {
		t.Fatalf("new mapping: %d present, %d written; want 16, 16", len(present), len(dirty))
	}
	if _, dirty = written(t, tr, second, second+16*pageSize); len(dirty) != 0 {
		t.Fatalf("new mapping not tracked after its first scan: %d written", len(dirty))
	}
	k.do("d")
	if present, _ = written(t, tr, second, second+16*pageSize); len(present) != 0 {
		t.Fatalf("unmapped, still %d present", len(present))
	}
}

// The child blocks reading its stdin while the userfaultfd is made: the
// read is restarted, and the child keeps its descriptors as they were.
func TestTrackedProcessCarriesOn(t *testing.T) {
	k := startChild(t, "plain")
	before := fds(t, k.cmd.Process.Pid)
	for range 5 {
		tr := track(t, k)
		tr.Close()
		if f := k.do("p"); len(f) != 1 || f[0] != "ok" {
			t.Fatalf("child after tracking: %v", f)
		}
	}
	if after := fds(t, k.cmd.Process.Pid); after != before {
		t.Fatalf("child's descriptors: %d before, %d after", before, after)
	}
}

func fds(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A profile that kills the call: it is never made. One that fails it: the
// errno comes back. Either way the child goes on.
func TestSeccompIsRespected(t *testing.T) {
	for _, c := range []struct {
		mode string
		want error
	}{
		{"seccomp-kill", inject.ErrSeccomp},
		{"seccomp-errno", unix.EPERM},
	} {
		t.Run(c.mode, func(t *testing.T) {
			k := startChild(t, c.mode)
			if _, err := Track(k.cmd.Process.Pid); !errors.Is(err, c.want) {
				t.Fatalf("Track: %v, want %v", err, c.want)
			}
			if f := k.do("p"); len(f) != 1 || f[0] != "ok" {
				t.Fatalf("child after refusal: %v", f)
			}
		})
	}
}

// A C program asleep in clock_nanosleep when its userfaultfd is made: the
// sleep goes on (restart_syscall) and ends when it should, with status 0.
// (Nothing waits for the child while it is traced: a waiting parent would
// take the tracer's stop reports.)
func TestTrackedSleeperWakesOnTime(t *testing.T) {
	testroot.Require(t, "needs root: ptrace and pidfd_getfd of another process")
	cmd := exec.Command("sleep", "1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	time.Sleep(100 * time.Millisecond)
	tr, err := Track(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	timer := time.AfterFunc(5*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	err = cmd.Wait()
	waited = true
	d := time.Since(start)
	if err != nil {
		t.Fatalf("sleep 1 after tracking: %v (after %v; killed at 5 s if the sleep was not restarted right)", err, d)
	}
	if d < 900*time.Millisecond {
		t.Fatalf("sleep 1 ended after %v: the sleep was cut short", d)
	}
}

// scanCount scans and counts, of [lo, hi), the pages reported and the
// pages reported written; ranges out of order or overlapping are an error.
func scanCount(tr *Tracker, lo, hi uint64) (seen, dirty int, err error) {
	var last uint64
	err = tr.Scan(func(start, end uint64, w bool) error {
		if start < last || end <= start {
			return fmt.Errorf("range %#x-%#x after one ending at %#x", start, end, last)
		}
		last = end
		if start < hi && end > lo {
			n := int((min(end, hi) - max(start, lo)) / pageSize)
			seen += n
			if w {
				dirty += n
			}
		}
		return nil
	})
	return seen, dirty, err
}

// A scan larger than one batch of the kernel's output (many ranges, a
// region far larger than a batch) reports every page once, in order, and
// exactly the pages written.
func TestScanReportsEachPageOnce(t *testing.T) {
	const pages = 64 << 20 / pageSize // 64 MiB
	k := startChild(t, "plain", fmt.Sprintf("%s=%d", childPagesEnv, pages))
	tr := track(t, k)
	lo, hi := k.region, k.region+pages*pageSize
	for i, writes := range []int{0, 2 * regionBatch, 100, 0} {
		if writes > 0 {
			k.do(fmt.Sprintf("W %d", writes))
		}
		seen, dirty, err := scanCount(tr, lo, hi)
		if err != nil {
			t.Fatalf("scan %d: %v", i, err)
		}
		want := writes
		if i == 0 {
			want = pages // the first scan: every page counts as written
		}
		if seen != pages || dirty != want {
			t.Fatalf("scan %d after writing %d pages: %d pages reported of %d, %d written, want %d", i, writes, seen, pages, dirty, want)
		}
	}
}

// Scans while the process writes (1000 pages/s, as memhog does): ranges
// in order, none twice, every page present reported. (On Linux 6.18 a
// batch of a 1 GiB scan can end at a walk_end below ranges it reported.)
func TestScanWhileWriting(t *testing.T) {
	const pages = 1 << 30 / pageSize
	k := startChild(t, "plain", fmt.Sprintf("%s=%d", childPagesEnv, pages))
	tr := track(t, k)
	lo, hi := k.region, k.region+pages*pageSize
	k.do("R 1000")
	for i := range 10 {
		seen, dirty, err := scanCount(tr, lo, hi)
		if err != nil {
			t.Fatalf("scan %d: %v", i, err)
		}
		if seen != pages {
			t.Fatalf("scan %d: %d pages reported of %d (%d written)", i, seen, pages, dirty)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSpans(t *testing.T) {
	const w, a, z = pageWritten | pageWPAllowed, pageWPAllowed, pageWPAllowed | pagePFNZero
	for _, c := range []struct {
		name string
		in   []region
		want []span
	}{
		{"none", nil, nil},
		{"one clean", []region{{0x1000, 0x3000, a}}, []span{{0x1000, 0x3000, false}}},
		{"not protected counts as written", []region{{0x1000, 0x2000, 0}}, []span{{0x1000, 0x2000, true}}},
		{"zero page left out", []region{{0x1000, 0x2000, a}, {0x2000, 0x3000, z}, {0x3000, 0x4000, w}},
			[]span{{0x1000, 0x2000, false}, {0x3000, 0x4000, true}}},
		{"adjacent alike merge", []region{{0x1000, 0x2000, a}, {0x2000, 0x3000, a}}, []span{{0x1000, 0x3000, false}}},
		{"gap kept", []region{{0x1000, 0x2000, a}, {0x5000, 0x6000, a}}, []span{{0x1000, 0x2000, false}, {0x5000, 0x6000, false}}},
		// A batch reported up to 0x9000 but ended its walk at 0x4000; the
		// next batch reports 0x4000-0x9000 again, clean, since the first
		// protected it: the page written stays written.
		{"batch reported again", []region{{0x1000, 0x4000, a}, {0x4000, 0x5000, w}, {0x5000, 0x9000, a}, {0x4000, 0x9000, a}},
			[]span{{0x1000, 0x4000, false}, {0x4000, 0x5000, true}, {0x5000, 0x9000, false}}},
		{"out of order", []region{{0x5000, 0x6000, w}, {0x1000, 0x2000, a}}, []span{{0x1000, 0x2000, false}, {0x5000, 0x6000, true}}},
		{"zero then data again", []region{{0x1000, 0x2000, z}, {0x1000, 0x2000, w}}, []span{{0x1000, 0x2000, true}}},
		{"empty range ignored", []region{{0x2000, 0x2000, w}}, nil},
	} {
		if got := spans(c.in); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: spans(%v) = %v, want %v", c.name, c.in, got, c.want)
		}
	}
}

func TestScanRuns(t *testing.T) {
	maps := procs.ParseMaps([]byte(`1000-3000 rw-p 00000000 00:00 0
3000-4000 rw-p 00000000 00:00 0                          [heap]
5000-6000 r-xp 00000000 08:01 12 /usr/bin/x
6000-7000 rw-p 00000000 00:00 0                          [anon:arena]
7000-8000 rw-s 00000000 00:01 9 /dev/zero (deleted)
9000-a000 rw-p 00000000 00:00 0                          [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]
`))
	want := []scanRun{{0, 0x1000, false}, {0x1000, 0x5000, true}, {0x5000, 0x6000, false}, {0x6000, 0x7000, true}, {0x7000, 0x9000, false}, {0x9000, userEnd, true}}
	if got := scanRuns(maps); !slices.Equal(got, want) {
		t.Fatalf("scanRuns:\n got %+v\nwant %+v", got, want)
	}
	if got := scanRuns(nil); !slices.Equal(got, []scanRun{{0, userEnd, false}}) {
		t.Fatalf("no mappings: %+v", got)
	}
}

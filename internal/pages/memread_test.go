package pages

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/ferry-migrate/ferry/internal/procs"
)

func TestNSPIDOfSelf(t *testing.T) {
	ns, err := nsPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ns == 0 {
		t.Fatal("no pid")
	}
}

func TestNewReaderNoProcess(t *testing.T) {
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Skip("no /bin/true:", err)
	}
	if _, err := NewReader([]int{cmd.Process.Pid}); err == nil {
		t.Fatal("NewReader of a process that is gone succeeded")
	}
	if _, err := NewReader(nil); err == nil {
		t.Fatal("NewReader of nothing succeeded")
	}
}

func TestContainerPIDs(t *testing.T) {
	h := startHolder(t, 1)
	pids, err := ContainerPIDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if pids[0] != os.Getpid() || !slices.Contains(pids, h.pid) {
		t.Fatalf("ContainerPIDs(%d) = %v, want self first and holder %d", os.Getpid(), pids, h.pid)
	}
	// The fallback for kernels without /proc/PID/task/TID/children.
	if d := procs.Descendants(os.Getpid(), ""); !slices.Contains(d, h.pid) {
		t.Fatalf("procs.Descendants(%d) = %v, want holder %d", os.Getpid(), d, h.pid)
	}
	if _, err := ContainerPIDs(1 << 30); err == nil {
		t.Fatal("ContainerPIDs of a pid that does not exist succeeded")
	}
}

// scanRegion scans and returns the hashes of the pages in [lo, hi) of pid's
// pages, checking their data against the holder's pattern for gens.
func scanRegion(t *testing.T, r *Reader, h *holder, gens map[int]uint64) (map[uint64]xxh3.Uint128, Stats) {
	t.Helper()
	got := map[uint64]xxh3.Uint128{}
	want := make([]byte, PageSize)
	nsPid, err := nsPID(h.pid)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.Scan(func(p Page) error {
		if p.Key.PID != nsPid {
			return nil
		}
		if p.Key.Addr >= h.zero && p.Key.Addr < h.zero+zeroRegion && zeroPagePFN() != 0 {
			t.Errorf("page %#x of the read-only region (zero page) reported", p.Key.Addr)
		}
		if p.Key.Addr < h.addr || p.Key.Addr >= h.addr+h.size {
			return nil
		}
		if p.Key.Addr%PageSize != 0 || len(p.Data) != PageSize {
			t.Fatalf("bad page %#x len %d", p.Key.Addr, len(p.Data))
		}
		i := int((p.Key.Addr - h.addr) / PageSize)
		fillPage(want, i, gens[i])
		if !bytes.Equal(p.Data, want) {
			t.Errorf("page %d: data differs from what the holder wrote", i)
		}
		if p.Hash != xxh3.Hash128(want) {
			t.Errorf("page %d: wrong hash", i)
		}
		if _, dup := got[p.Key.Addr]; dup {
			t.Errorf("page %d reported twice", i)
		}
		got[p.Key.Addr] = p.Hash
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != int(h.size/PageSize) {
		t.Fatalf("found %d pages of the holder's %d", len(got), h.size/PageSize)
	}
	return got, st
}

func TestScanFindsChangedPages(t *testing.T) {
	needRoot(t)
	h := startHolder(t, 32)
	r, err := NewReader([]int{h.pid})
	if err != nil {
		t.Fatal(err)
	}
	gens := map[int]uint64{}
	first, st := scanRegion(t, r, h, gens)
	if st.Processes != 1 || st.VMAs == 0 || st.Pages < h.size/PageSize || st.Bytes != st.Pages*PageSize {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("first scan: %+v (zero page frame %#x)", st, zeroPagePFN())

	// Direct read of one page through /proc/PID/mem agrees too.
	mem, err := os.Open("/proc/" + strconv.Itoa(h.pid) + "/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	b := make([]byte, PageSize)
	if _, err := mem.ReadAt(b, int64(h.addr+5*PageSize)); err != nil {
		t.Fatal(err)
	}
	if xxh3.Hash128(b) != first[h.addr+5*PageSize] {
		t.Fatal("hash of page 5 differs from reading it directly")
	}

	changed := []int{0, 1, 2, 511, 512, 4000, 8191}
	h.touch(t, 1, changed...)
	for _, i := range changed {
		gens[i] = 1
	}
	second, _ := scanRegion(t, r, h, gens)
	var diff []int
	for a, hash := range second {
		if first[a] != hash {
			diff = append(diff, int((a-h.addr)/PageSize))
		}
	}
	slices.Sort(diff)
	if !slices.Equal(diff, changed) {
		t.Fatalf("changed pages %v, want %v", diff, changed)
	}
}

func TestScanSkipsExitingProcess(t *testing.T) {
	needRoot(t)
	h1 := startHolder(t, 8)
	h2 := startHolder(t, 8)
	r, err := NewReader([]int{h2.pid, h1.pid})
	if err != nil {
		t.Fatal(err)
	}
	ns2, err := nsPID(h2.pid)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]int{}
	st, err := r.Scan(func(p Page) error {
		if p.Key.PID == ns2 && seen[ns2] == 0 {
			h2.kill() // gone and reaped in the middle of its scan
		}
		seen[p.Key.PID]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ns1, _ := nsPID(h1.pid)
	if st.Processes != 1 || uint64(seen[ns1]) < h1.size/PageSize {
		t.Fatalf("stats %+v, pages by pid %v", st, seen)
	}
	if uint64(seen[ns2]) >= h2.size/PageSize {
		t.Fatalf("read %d pages of a process killed at its first page", seen[ns2])
	}
}

// BenchmarkScan reads and hashes a 256 MiB holder.
func BenchmarkScan(b *testing.B) {
	needRoot(b)
	h := startHolder(b, 256)
	r, err := NewReader([]int{h.pid})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(h.size))
	b.ResetTimer()
	var st Stats
	for b.Loop() {
		st, err = r.Scan(func(p Page) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.Pages), "pages/scan")
}

// holderReader starts a holder of one region and a Reader of it; n is
// the region's pages.
func holderReader(t *testing.T) (h *holder, n uint64, r *Reader) {
	t.Helper()
	needRoot(t)
	h = startHolder(t, 1)
	r, err := NewReader([]int{h.pid})
	if err != nil {
		t.Fatal(err)
	}
	return h, h.size / PageSize, r
}

// scanIndexes scans, checking each page's hash, and returns the pages
// read as indexes from base, in order.
func scanIndexes(t *testing.T, r *Reader, base uint64) ([]uint64, Stats) {
	t.Helper()
	var read []uint64
	st, err := r.Scan(func(p Page) error {
		if len(p.Data) != PageSize || p.Hash != xxh3.Hash128(p.Data) {
			t.Errorf("page %#x: %d bytes, hash mismatch", p.Key.Addr, len(p.Data))
		}
		read = append(read, (p.Key.Addr-base)/PageSize)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return read, st
}

// indexes lists the i < n that keep says.
func indexes(n uint64, keep func(uint64) bool) []uint64 {
	var out []uint64
	for i := range n {
		if keep(i) {
			out = append(out, i)
		}
	}
	return out
}

// fakeTracker reports the holder's region in three parts: pages [0, 8)
// written, [8, 24) unwritten, [24, n) written.
type fakeTracker struct{ addr, n uint64 }

func (f fakeTracker) Scan(fn func(start, end uint64, written bool) error) error {
	a := f.addr
	for _, part := range []struct {
		from, to uint64
		written  bool
	}{{0, 8, true}, {8, 24, false}, {24, f.n, true}} {
		if err := fn(a+part.from*PageSize, a+part.to*PageSize, part.written); err != nil {
			return err
		}
	}
	return nil
}

// With a tracker, written pages are read, unwritten ones the receiver
// holds go as ranges, and unwritten ones it lacks are read after all.
func TestScanWithTracker(t *testing.T) {
	h, n, r := holderReader(t)
	missing := h.addr + 12*PageSize // unwritten, yet the receiver lacks it
	var ranges []Range
	// The receiver holds all but the missing page, told as ranges that
	// reach past what is asked (the reader keeps to its range).
	r.UseTrackers(map[int]WriteTracker{h.pid: fakeTracker{h.addr, n}},
		func(q Range) []Range {
			return []Range{{q.PID, q.Start - PageSize, missing}, {q.PID, missing + PageSize, q.End + PageSize}}
		},
		func(rg Range) { ranges = append(ranges, rg) })
	read, st := scanIndexes(t, r, h.addr)
	want := indexes(n, func(i uint64) bool { return i < 8 || i == 12 || i >= 24 })
	if !slices.Equal(read, want) {
		t.Errorf("pages read %v, want %v", read, want)
	}
	ns, _ := nsPID(h.pid)
	wantRanges := []Range{{ns, h.addr + 8*PageSize, missing}, {ns, missing + PageSize, h.addr + 24*PageSize}}
	if !slices.Equal(ranges, wantRanges) {
		t.Errorf("unchanged ranges %v, want %v", ranges, wantRanges)
	}
	if st.Unchanged != 15 || st.Pages != n {
		t.Errorf("stats: %d unchanged of %d pages, want 15 of %d", st.Unchanged, st.Pages, n)
	}
}

// Written only: the tracker's written pages are read, the others left
// out, whatever the receiver holds; a later UseTrackers reads them again.
func TestScanWrittenOnly(t *testing.T) {
	h, n, r := holderReader(t)
	r.UseTrackersWrittenOnly(map[int]WriteTracker{h.pid: fakeTracker{h.addr, n}})
	read, st := scanIndexes(t, r, h.addr)
	want := indexes(n, func(i uint64) bool { return i < 8 || i >= 24 })
	if !slices.Equal(read, want) {
		t.Errorf("pages read %v, want %v", read, want)
	}
	if st.Unchanged != 0 || st.Pages != n-16 {
		t.Errorf("stats: %d unchanged of %d pages, want 0 of %d", st.Unchanged, st.Pages, n-16)
	}

	r.UseTrackers(map[int]WriteTracker{h.pid: fakeTracker{h.addr, n}},
		func(Range) []Range { return nil }, func(Range) {})
	if read, _ = scanIndexes(t, r, h.addr); uint64(len(read)) != n {
		t.Errorf("after UseTrackers, a receiver holding nothing got %d pages of %d", len(read), n)
	}
}

// codeTracker reports the holder's code and its region, all written.
type codeTracker struct{ code, addr, n uint64 }

func (f codeTracker) Scan(fn func(start, end uint64, written bool) error) error {
	if err := fn(f.code, f.code+codePages*PageSize, true); err != nil {
		return err
	}
	return fn(f.addr, f.addr+f.n*PageSize, true)
}

// No scan reads an executable mapping's pages, though the process wrote
// them (CRIU may be writing there: see Scan): not a whole scan, not a
// range over them, not a tracker that says they were written. The
// holder's data pages are read all the same.
func TestScanSkipsCode(t *testing.T) {
	h, n, r := holderReader(t)
	ns, err := nsPID(h.pid)
	if err != nil {
		t.Fatal(err)
	}
	inCode := func(p Page) bool {
		return p.Key.PID == ns && p.Key.Addr >= h.code && p.Key.Addr < h.code+codePages*PageSize
	}
	check := func(how string, scan func(fn func(Page) error) error) {
		t.Helper()
		var data, code int
		if err := scan(func(p Page) error {
			switch {
			case inCode(p):
				code++
			case p.Key.PID == ns && p.Key.Addr >= h.addr && p.Key.Addr < h.addr+n*PageSize:
				data++
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if code != 0 {
			t.Errorf("%s: %d pages of the executable mapping read", how, code)
		}
		if how != "range over the code" && uint64(data) != n {
			t.Errorf("%s: %d of the region's %d pages read", how, data, n)
		}
	}
	check("whole scan", func(fn func(Page) error) error { _, err := r.Scan(fn); return err })
	check("range over the code", func(fn func(Page) error) error {
		return r.ReadRange(Range{PID: ns, Start: h.code, End: h.code + codePages*PageSize}, fn)
	})
	r.UseTrackersWrittenOnly(map[int]WriteTracker{h.pid: codeTracker{h.code, h.addr, n}})
	check("tracked scan", func(fn func(Page) error) error { _, err := r.Scan(fn); return err })
}

func TestOutside(t *testing.T) {
	skip := []procs.Mapping{{Start: 0x3000, End: 0x5000}, {Start: 0x8000, End: 0x9000}}
	for _, tc := range []struct {
		start, end uint64
		want       [][2]uint64
	}{
		{0x1000, 0x2000, [][2]uint64{{0x1000, 0x2000}}},
		{0x1000, 0xa000, [][2]uint64{{0x1000, 0x3000}, {0x5000, 0x8000}, {0x9000, 0xa000}}},
		{0x3000, 0x5000, nil},
		{0x4000, 0x8000, [][2]uint64{{0x5000, 0x8000}}},
		{0x8000, 0xa000, [][2]uint64{{0x9000, 0xa000}}},
	} {
		var got [][2]uint64
		_ = outside(skip, tc.start, tc.end, func(s, e uint64) error { got = append(got, [2]uint64{s, e}); return nil })
		if !slices.Equal(got, tc.want) {
			t.Errorf("outside [%#x, %#x): %#x, want %#x", tc.start, tc.end, got, tc.want)
		}
	}
}

// TestReadRange: a range reads the holder's pages there, in order, with
// their data, and nothing of another process's or outside the range.
func TestReadRange(t *testing.T) {
	needRoot(t)
	h := startHolder(t, 8)
	r, err := NewReader([]int{h.pid})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := nsPID(h.pid)
	if err != nil {
		t.Fatal(err)
	}
	from, to := h.addr+10*PageSize, h.addr+30*PageSize
	var got []uint64
	want := make([]byte, PageSize)
	if err := r.ReadRange(Range{PID: ns, Start: from, End: to}, func(p Page) error {
		fillPage(want, int((p.Key.Addr-h.addr)/PageSize), 0)
		if !bytes.Equal(p.Data, want) || p.Key.PID != ns {
			t.Errorf("page %#x: wrong data or pid %d", p.Key.Addr, p.Key.PID)
		}
		got = append(got, p.Key.Addr)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 20 || got[0] != from || got[19] != to-PageSize || !slices.IsSorted(got) {
		t.Fatalf("read %d pages from %#x to %#x, want the 20 of [%#x, %#x)", len(got), got[0], got[len(got)-1], from, to)
	}
	n := 0
	if err := r.ReadRange(Range{PID: ns + 1000000, Start: from, End: to}, func(Page) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("another pid: %d pages, %v", n, err)
	}

}

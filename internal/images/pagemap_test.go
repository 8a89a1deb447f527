package images

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// pageOf is the synthetic content of a page: its pid and address, repeated.
func pageOf(pid uint32, addr uint64) []byte {
	p := make([]byte, PageSize)
	for i := 0; i < PageSize; i += 12 {
		if i+12 > PageSize {
			break
		}
		binary.LittleEndian.PutUint32(p[i:], pid)
		binary.LittleEndian.PutUint64(p[i+4:], addr)
	}
	return p
}

func writeLazyDump(t *testing.T, dir string, pm Pagemap) {
	t.Helper()
	var pages bytes.Buffer
	for _, e := range pm.Entries {
		if e.Flags&PagePresent != 0 {
			for p := uint64(0); p < uint64(e.NrPages); p++ {
				pages.Write(pageOf(pm.PID, e.Vaddr+p*PageSize))
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), pages.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writePagemap(dir, pm); err != nil {
		t.Fatal(err)
	}
}

func TestFillLazy(t *testing.T) {
	dir := t.TempDir()
	writeLazyDump(t, dir, Pagemap{PID: 7, PagesID: 1, Entries: []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 2, Flags: PagePresent}, // e.g. a shared mapping, dumped as usual
		{Vaddr: 0x10000, NrPages: 4, Flags: PageLazy},
		{Vaddr: 0x20000, NrPages: 1, Flags: PagePresent},
		{Vaddr: 0x30000, NrPages: 3, Flags: PageLazy},
	}})
	// The host holds every lazy page but 0x11000-0x12000 and 0x32000.
	missing := map[uint64]bool{0x11000: true, 0x12000: true, 0x32000: true}
	var fetches []string
	st, err := FillLazy(dir, PageSource{
		Local: func(pid uint32, addr uint64, dst []byte) bool {
			if pid != 7 || missing[addr] {
				return false
			}
			copy(dst, pageOf(pid, addr))
			return true
		},
		Fetch: func(pid uint32, addr uint64, dst []byte) error {
			fetches = append(fetches, fmt.Sprintf("%d@%#x", len(dst)/PageSize, addr))
			for i := 0; i < len(dst); i += PageSize {
				copy(dst[i:], pageOf(pid, addr+uint64(i)))
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Local != 4 || st.Fetched != 3 || st.Dumped != 3 {
		t.Errorf("stats %+v, want 4 local, 3 fetched, 3 dumped", st)
	}
	// One fetch per contiguous missing run.
	if strings.Join(fetches, " ") != "2@0x11000 1@0x32000" {
		t.Errorf("fetches %q, want two runs", fetches)
	}
	pms, err := ReadPagemaps(dir)
	if err != nil || len(pms) != 1 {
		t.Fatalf("read back: %v %v", pms, err)
	}
	var want bytes.Buffer
	for _, e := range pms[0].Entries {
		if e.Flags != PagePresent {
			t.Errorf("entry at %#x has flags %#x, want present", e.Vaddr, e.Flags)
		}
		for p := uint64(0); p < uint64(e.NrPages); p++ {
			want.Write(pageOf(7, e.Vaddr+p*PageSize))
		}
	}
	got, err := os.ReadFile(filepath.Join(dir, "pages-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("pages image: %d bytes, want %d in pagemap order", len(got), want.Len())
	}
}

func TestFillLazyRefuses(t *testing.T) {
	t.Run("missing page without a source", func(t *testing.T) {
		dir := t.TempDir()
		writeLazyDump(t, dir, Pagemap{PID: 1, PagesID: 1, Entries: []PagemapEntry{{Vaddr: 0x1000, NrPages: 1, Flags: PageLazy}}})
		_, err := FillLazy(dir, PageSource{Local: func(uint32, uint64, []byte) bool { return false }})
		if err == nil || !strings.Contains(err.Error(), "neither in the dump nor held here") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("parent images", func(t *testing.T) {
		dir := t.TempDir()
		writeLazyDump(t, dir, Pagemap{PID: 1, PagesID: 1, Entries: []PagemapEntry{{Vaddr: 0x1000, NrPages: 1, Flags: PageParent}}})
		if _, err := FillLazy(dir, PageSource{}); err == nil || !strings.Contains(err.Error(), "parent") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("short pages image", func(t *testing.T) {
		dir := t.TempDir()
		writeLazyDump(t, dir, Pagemap{PID: 1, PagesID: 1, Entries: []PagemapEntry{{Vaddr: 0x1000, NrPages: 1, Flags: PagePresent}}})
		if err := os.Truncate(filepath.Join(dir, "pages-1.img"), 100); err != nil {
			t.Fatal(err)
		}
		if _, err := FillLazy(dir, PageSource{}); err == nil || !strings.Contains(err.Error(), "ends before") {
			t.Fatalf("err = %v", err)
		}
		// A failed fill leaves the dump as it was.
		if b, _ := os.ReadFile(filepath.Join(dir, "pages-1.img")); len(b) != 100 {
			t.Errorf("pages image changed to %d bytes", len(b))
		}
	})
}

func TestPagemapRoundTrip(t *testing.T) {
	pm := Pagemap{PagesID: 3, Entries: []PagemapEntry{{Vaddr: 0x400000, NrPages: 1, Flags: PagePresent}, {Vaddr: 0x7f0000000000, NrPages: 1 << 20, Flags: PageLazy}}}
	got, err := decodePagemap(encodePagemap(pm))
	if err != nil {
		t.Fatal(err)
	}
	if got.PagesID != pm.PagesID || len(got.Entries) != 2 || got.Entries[0] != pm.Entries[0] || got.Entries[1] != pm.Entries[1] {
		t.Fatalf("round trip: %+v, want %+v", got, pm)
	}
}

// FuzzDecodePagemap: pagemap images arrive from the source host.
func FuzzDecodePagemap(f *testing.F) {
	f.Add(encodePagemap(Pagemap{PagesID: 1, Entries: []PagemapEntry{{Vaddr: 0x1000, NrPages: 2, Flags: PageLazy}}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		pm, err := decodePagemap(b)
		if err != nil {
			return
		}
		again, err := decodePagemap(encodePagemap(pm))
		if err != nil || len(again.Entries) != len(pm.Entries) {
			t.Fatalf("re-encoded pagemap does not decode the same: %v", err)
		}
	})
}

// BenchmarkFillLazy completes a 64 MiB lazy dump from memory (MB/s of pages
// written); scratch images live on tmpfs, as ferry keeps them.
func BenchmarkFillLazy(b *testing.B) {
	const pages = 16384
	held := make([]byte, pages*PageSize)
	for i := range held {
		held[i] = byte(i * 7)
	}
	pm := Pagemap{PID: 1, PagesID: 1}
	for i := uint64(0); i < pages; i += 64 {
		pm.Entries = append(pm.Entries, PagemapEntry{Vaddr: 0x7f0000000000 + i*PageSize, NrPages: 64, Flags: PageLazy})
	}
	src := PageSource{Local: func(_ uint32, addr uint64, dst []byte) bool {
		off := addr - 0x7f0000000000
		copy(dst, held[off:off+PageSize])
		return true
	}}
	b.SetBytes(pages * PageSize)
	for b.Loop() {
		b.StopTimer()
		dir, err := os.MkdirTemp("/dev/shm", "fill-bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := writePagemap(dir, pm); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := FillLazy(dir, src); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dir)
		b.StartTimer()
	}
}

// For a lazy restore from the filled images, the pages that were lazy keep
// the flag beside where they now are (this directory's pages image, or
// the parent's); the pages the dump carried stay plain; the image holds
// the same bytes as FillLazy's.
func TestFillForLazyRestore(t *testing.T) {
	entries := []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 2, Flags: PagePresent},
		{Vaddr: 0x10000, NrPages: 4, Flags: PageLazy},
		{Vaddr: 0x30000, NrPages: 3, Flags: PageLazy},
	}
	src := PageSource{
		Local: func(pid uint32, addr uint64, dst []byte) bool {
			copy(dst, pageOf(pid, addr))
			return true
		},
		ParentRun: func(_ uint32, addr, _ uint64) uint64 {
			if addr == 0x31000 {
				return 1
			}
			return 0
		},
	}
	plain, lazy := t.TempDir(), t.TempDir()
	for _, dir := range []string{plain, lazy} {
		writeLazyDump(t, dir, Pagemap{PID: 7, PagesID: 1, Entries: entries})
	}
	if _, err := FillLazy(plain, src); err != nil {
		t.Fatal(err)
	}
	st, err := FillForLazyRestore(lazy, src)
	if err != nil {
		t.Fatal(err)
	}
	if st.Local != 6 || st.Parent != 1 || st.Dumped != 2 {
		t.Errorf("stats %+v, want 6 local, 1 in the parent, 2 dumped", st)
	}
	pms, err := ReadPagemaps(lazy)
	if err != nil || len(pms) != 1 {
		t.Fatalf("read back: %v %v", pms, err)
	}
	want := []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 2, Flags: PagePresent},
		{Vaddr: 0x10000, NrPages: 4, Flags: PagePresent | PageLazy},
		{Vaddr: 0x30000, NrPages: 1, Flags: PagePresent | PageLazy},
		{Vaddr: 0x31000, NrPages: 1, Flags: PageParent | PageLazy},
		{Vaddr: 0x32000, NrPages: 1, Flags: PagePresent | PageLazy},
	}
	if fmt.Sprint(pms[0].Entries) != fmt.Sprint(want) {
		t.Errorf("entries %v, want %v", pms[0].Entries, want)
	}
	a, _ := os.ReadFile(filepath.Join(plain, "pages-1.img"))
	b, _ := os.ReadFile(filepath.Join(lazy, "pages-1.img"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("pages images differ: %d and %d bytes", len(a), len(b))
	}
}

func TestLinkDirKeepsTheDumpAsItCame(t *testing.T) {
	entries := []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 2, Flags: PagePresent},
		{Vaddr: 0x10000, NrPages: 4, Flags: PageLazy},
	}
	root := t.TempDir()
	dump, lazy := filepath.Join(root, "images"), filepath.Join(root, "lazy-images")
	if err := os.Mkdir(dump, 0o700); err != nil {
		t.Fatal(err)
	}
	writeLazyDump(t, dump, Pagemap{PID: 7, PagesID: 1, Entries: entries})
	if err := os.Symlink("../parent", filepath.Join(dump, "parent")); err != nil {
		t.Fatal(err)
	}
	before := map[string][]byte{}
	for _, n := range []string{"pagemap-7.img", "pages-1.img"} {
		before[n], _ = os.ReadFile(filepath.Join(dump, n))
	}
	if err := LinkDir(dump, lazy); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(filepath.Join(lazy, "parent")); err != nil || l != "../parent" {
		t.Errorf("parent link %q, %v; want ../parent", l, err)
	}
	src := PageSource{Local: func(pid uint32, addr uint64, dst []byte) bool {
		copy(dst, pageOf(pid, addr))
		return true
	}}
	if _, err := FillForLazyRestore(lazy, src); err != nil {
		t.Fatal(err)
	}
	for n, b := range before {
		if got, _ := os.ReadFile(filepath.Join(dump, n)); !bytes.Equal(got, b) {
			t.Errorf("%s changed in the dump (%d -> %d bytes) when its linked copy was filled", n, len(b), len(got))
		}
	}
	filled, _ := os.ReadFile(filepath.Join(lazy, "pages-1.img"))
	if want := len(before["pages-1.img"]) + 4*PageSize; len(filled) != want {
		t.Errorf("the filled copy's pages image has %d bytes, want %d", len(filled), want)
	}
	if err := LinkDir(dump, lazy); err == nil {
		t.Error("linking into a directory that holds the files already succeeded")
	}
	if err := os.Mkdir(filepath.Join(dump, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := LinkDir(dump, filepath.Join(root, "other")); err == nil {
		t.Error("a directory among the images was linked")
	}
}

// FillPicked writes the picked pages it holds into the images, present and
// no longer lazy, and leaves every other lazy page as the dump did.
func TestFillPicked(t *testing.T) {
	dir := t.TempDir()
	writeLazyDump(t, dir, Pagemap{PID: 7, PagesID: 1, Entries: []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 2, Flags: PagePresent},
		{Vaddr: 0x10000, NrPages: 8, Flags: PageLazy},
		{Vaddr: 0x20000, NrPages: 1, Flags: PagePresent},
		{Vaddr: 0x30000, NrPages: 2, Flags: PageLazy},
	}})
	picked := map[uint32][]uint64{
		// Two adjacent, one not held, one listed twice, the run's last,
		// one outside every lazy run; another task's are not looked at.
		7: {0x2000, 0x11000, 0x12000, 0x14000, 0x15000, 0x15000, 0x17000, 0x31000},
		9: {0x10000},
	}
	var asked []uint64
	st, err := FillPicked(dir, picked, func(pid uint32, addr uint64, dst []byte) bool {
		if pid != 7 {
			t.Errorf("asked for task %d's page", pid)
		}
		asked = append(asked, addr)
		if addr == 0x14000 {
			return false
		}
		copy(dst, pageOf(pid, addr))
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Local != 5 || st.Dumped != 3 {
		t.Errorf("stats %+v, want 5 local, 3 dumped", st)
	}
	if fmt.Sprint(asked) != fmt.Sprint([]uint64{0x11000, 0x12000, 0x14000, 0x15000, 0x17000, 0x31000}) {
		t.Errorf("asked for %#x", asked)
	}
	pms, err := ReadPagemaps(dir)
	if err != nil || len(pms) != 1 {
		t.Fatalf("read back: %v %v", pms, err)
	}
	want := []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 2, Flags: PagePresent},
		{Vaddr: 0x10000, NrPages: 1, Flags: PageLazy},
		{Vaddr: 0x11000, NrPages: 2, Flags: PagePresent},
		{Vaddr: 0x13000, NrPages: 2, Flags: PageLazy},
		{Vaddr: 0x15000, NrPages: 1, Flags: PagePresent},
		{Vaddr: 0x16000, NrPages: 1, Flags: PageLazy},
		{Vaddr: 0x17000, NrPages: 1, Flags: PagePresent},
		{Vaddr: 0x20000, NrPages: 1, Flags: PagePresent},
		{Vaddr: 0x30000, NrPages: 1, Flags: PageLazy},
		{Vaddr: 0x31000, NrPages: 1, Flags: PagePresent},
	}
	if fmt.Sprint(pms[0].Entries) != fmt.Sprint(want) {
		t.Errorf("entries\n%v\nwant\n%v", pms[0].Entries, want)
	}
	// The pages image holds the present pages in pagemap order.
	var img bytes.Buffer
	for _, e := range want {
		if e.Flags == PagePresent {
			for p := uint64(0); p < uint64(e.NrPages); p++ {
				img.Write(pageOf(7, e.Vaddr+p*PageSize))
			}
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "pages-1.img")); !bytes.Equal(got, img.Bytes()) {
		t.Errorf("pages image: %d bytes, want %d", len(got), img.Len())
	}
	// Nothing picked: the images stay as they are.
	before, _ := os.ReadFile(filepath.Join(dir, "pagemap-7.img"))
	if _, err := FillPicked(dir, map[uint32][]uint64{7: nil}, nil); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "pagemap-7.img")); !bytes.Equal(before, after) {
		t.Error("an empty pick rewrote the pagemap")
	}
}

package images

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// memPages is a page store for tests: pageOf contents with a version.
type memPages struct {
	mu sync.Mutex
	m  map[PageRef][]byte
}

func (s *memPages) put(r PageRef, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[r] = b
}

func (s *memPages) read(r PageRef, dst []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[r]
	if ok {
		copy(dst, b)
	}
	return ok
}

// resolve reads every page a (possibly parent-linked) dump holds for task
// pid the way CRIU's restore does: present pages from the dump's pages
// image in pagemap order, parent ones from the parent's.
func resolve(t *testing.T, dir, parent string, pid uint32) map[uint64][]byte {
	t.Helper()
	read := func(d string) (Pagemap, []byte) {
		pms, err := ReadPagemaps(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, pm := range pms {
			if pm.PID == pid {
				b, err := os.ReadFile(filepath.Join(d, fmt.Sprintf("pages-%d.img", pm.PagesID)))
				if err != nil {
					t.Fatal(err)
				}
				return pm, b
			}
		}
		t.Fatalf("no pagemap for %d in %s", pid, d)
		return Pagemap{}, nil
	}
	out := map[uint64][]byte{}
	parentPages := map[uint64][]byte{}
	if parent != "" {
		pm, b := read(parent)
		var off int
		for _, e := range pm.Entries {
			for p := 0; p < int(e.NrPages); p++ {
				parentPages[e.Vaddr+uint64(p)*PageSize] = b[off : off+PageSize]
				off += PageSize
			}
		}
	}
	pm, b := read(dir)
	var off int
	for _, e := range pm.Entries {
		for p := 0; p < int(e.NrPages); p++ {
			addr := e.Vaddr + uint64(p)*PageSize
			switch e.Flags {
			case PagePresent:
				out[addr] = b[off : off+PageSize]
				off += PageSize
			case PageParent:
				pp, ok := parentPages[addr]
				if !ok {
					t.Fatalf("page %#x refers to the parent, which lacks it", addr)
				}
				out[addr] = pp
			default:
				t.Fatalf("entry at %#x has flags %#x", e.Vaddr, e.Flags)
			}
		}
	}
	return out
}

func TestParentImage(t *testing.T) {
	work := t.TempDir()
	const pid = 9
	store := &memPages{m: map[PageRef][]byte{}}
	parent, err := NewParent(filepath.Join(work, "parent"))
	if err != nil {
		t.Fatal(err)
	}
	put := func(r PageRef, b []byte) {
		t.Helper()
		store.put(r, b)
		if err := parent.Put(r, b); err != nil {
			t.Fatal(err)
		}
	}
	// The first round: 0x10000-0x4f000 (64 pages) and 0x80000-0x83000 in
	// address order, then one page out of order (left out of the layout).
	var refs []PageRef
	for i := uint64(0); i < 64; i++ {
		refs = append(refs, PageRef{pid, 0x10000 + i*PageSize})
	}
	for i := uint64(0); i < 4; i++ {
		refs = append(refs, PageRef{pid, 0x80000 + i*PageSize})
	}
	for _, r := range refs {
		put(r, pageOf(pid, r.Addr))
	}
	put(PageRef{pid, 0x5000}, pageOf(pid, 0x5000))
	if parent.Has(pid, refs[0].Addr) {
		t.Fatal("an unsealed image offers pages")
	}
	// A page changes again before the round ends (still buffered).
	changed := bytes.Repeat([]byte{0xAB}, PageSize)
	put(refs[3], changed)
	if err := parent.Seal(); err != nil {
		t.Fatal(err)
	}
	// Later rounds: a page changes, one is forgotten.
	later := bytes.Repeat([]byte{0xCD}, PageSize)
	put(refs[7], later)
	delete(store.m, refs[5])
	parent.Forget(refs[5])
	if parent.Has(pid, refs[5].Addr) || !parent.Has(pid, refs[6].Addr) || parent.Has(pid, 0x5000) || parent.Has(pid, 0x90000) {
		t.Fatal("Has disagrees with what the image holds")
	}
	// HeldRun says for a run what Has says page by page.
	for addr := uint64(0x4000); addr < 0x86000; addr += PageSize {
		for _, n := range []uint64{1, 3, 200} {
			var want uint64
			for want < n && parent.Has(pid, addr+want*PageSize) {
				want++
			}
			if got := parent.HeldRun(pid, addr, n); got != want {
				t.Fatalf("HeldRun(%#x, %d) = %d, Has says %d", addr, n, got, want)
			}
		}
	}
	if parent.HeldRun(pid+1, refs[0].Addr, 4) != 0 {
		t.Fatal("HeldRun answers for a task the image does not hold")
	}

	// The lazy dump: one present page (say, the vdso), a run from 0x5000
	// the image left out (written from the store), the held run, and a run
	// partly held: refs[5] and 0x84000-0x85000 are fetched.
	dir := filepath.Join(work, "images")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeLazyDump(t, dir, Pagemap{PID: pid, PagesID: 1, Entries: []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 1, Flags: PagePresent},
		{Vaddr: 0x5000, NrPages: 1, Flags: PageLazy},
		{Vaddr: 0x10000, NrPages: 64, Flags: PageLazy},
		{Vaddr: 0x80000, NrPages: 6, Flags: PageLazy},
	}})
	st, err := FillLazy(dir, PageSource{
		ParentRun: parent.HeldRun,
		Local: func(pid uint32, addr uint64, dst []byte) bool {
			return store.read(PageRef{pid, addr}, dst)
		},
		Fetch: func(pid uint32, addr uint64, dst []byte) error {
			for i := 0; i < len(dst); i += PageSize {
				copy(dst[i:], pageOf(pid, addr+uint64(i)))
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Close(); err != nil {
		t.Fatal(err)
	}
	// 63 + 4 pages from the parent, 0x5000 from the store, refs[5] and
	// 0x84000-0x85000 fetched.
	if st.Parent != 67 || st.Fetched != 3 || st.Dumped != 1 || st.Local != 1 {
		t.Errorf("stats %+v", st)
	}
	got := resolve(t, dir, parent.Dir(), pid)
	want := func(addr uint64) []byte {
		switch addr {
		case refs[3].Addr:
			return changed
		case refs[7].Addr:
			return later
		}
		return pageOf(pid, addr)
	}
	if len(got) != 1+1+64+6 {
		t.Fatalf("the dump resolves to %d pages, want 72", len(got))
	}
	for addr, b := range got {
		if !bytes.Equal(b, want(addr)) {
			t.Errorf("page %#x does not hold its current contents", addr)
		}
	}
	if parent.Put(refs[0], later) == nil {
		t.Error("a closed image took a page")
	}
}

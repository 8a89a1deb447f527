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
	var refs []PageRef
	// 0x10000-0x4f000 (64 pages) and 0x80000-0x83000 held before the switchover.
	for i := uint64(0); i < 64; i++ {
		refs = append(refs, PageRef{pid, 0x10000 + i*PageSize})
	}
	for i := uint64(0); i < 4; i++ {
		refs = append(refs, PageRef{pid, 0x80000 + i*PageSize})
	}
	for _, r := range refs {
		store.put(r, pageOf(pid, r.Addr))
	}
	parent, err := StartParent(filepath.Join(work, "parent"), refs, store.read)
	if err != nil {
		t.Fatal(err)
	}
	// Rounds go on meanwhile: a page changes (before or after the image is
	// written, both must end up current), one is forgotten.
	changed := bytes.Repeat([]byte{0xAB}, PageSize)
	store.put(refs[3], changed)
	if err := parent.Update(refs[3], changed); err != nil {
		t.Fatal(err)
	}
	delete(store.m, refs[5])
	parent.Forget(refs[5])
	if err := parent.Wait(); err != nil {
		t.Fatal(err)
	}
	later := bytes.Repeat([]byte{0xCD}, PageSize)
	store.put(refs[7], later)
	if err := parent.Update(refs[7], later); err != nil {
		t.Fatal(err)
	}
	if parent.Has(pid, refs[5].Addr) || !parent.Has(pid, refs[6].Addr) || parent.Has(pid, 0x90000) {
		t.Fatal("Has disagrees with what the image holds")
	}

	// The lazy dump: one present page (say, the vdso), the held run, a page
	// the image forgot (fetched), and a run nobody held (fetched).
	dir := filepath.Join(work, "images")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeLazyDump(t, dir, Pagemap{PID: pid, PagesID: 1, Entries: []PagemapEntry{
		{Vaddr: 0x1000, NrPages: 1, Flags: PagePresent},
		{Vaddr: 0x10000, NrPages: 64, Flags: PageLazy},
		{Vaddr: 0x80000, NrPages: 6, Flags: PageLazy},
	}})
	st, err := FillLazy(dir, PageSource{
		Parent: parent.Has,
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
	// 63 + 4 pages from the parent, refs[5] and 0x84000-0x85000 fetched.
	if st.Parent != 67 || st.Fetched != 3 || st.Dumped != 1 || st.Local != 0 {
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
	if len(got) != 1+64+6 {
		t.Fatalf("the dump resolves to %d pages, want 71", len(got))
	}
	for addr, b := range got {
		if !bytes.Equal(b, want(addr)) {
			t.Errorf("page %#x does not hold its current contents", addr)
		}
	}
}

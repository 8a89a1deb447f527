package pages

import (
	"bytes"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

func pageOf(v byte) []byte { return bytes.Repeat([]byte{v}, PageSize) }

func TestStore(t *testing.T) {
	s := NewStore()
	const n = 3*slabPages + 7 // several slabs
	for i := 0; i < n; i++ {
		k := Key{PID: uint32(i % 3), Addr: uint64(i) * PageSize}
		if h := s.Put(k, pageOf(byte(i))); h != xxh3.Hash128(pageOf(byte(i))) {
			t.Fatalf("Put %d: wrong hash", i)
		}
	}
	if s.Len() != n || s.Bytes() != n*PageSize {
		t.Fatalf("Len %d Bytes %d", s.Len(), s.Bytes())
	}
	for i := 0; i < n; i++ {
		k := Key{PID: uint32(i % 3), Addr: uint64(i) * PageSize}
		d, h, ok := s.Get(k)
		if !ok || !bytes.Equal(d, pageOf(byte(i))) || h != xxh3.Hash128(d) {
			t.Fatalf("Get %d: ok %v", i, ok)
		}
	}
	if _, _, ok := s.Get(Key{PID: 9, Addr: 0}); ok {
		t.Fatal("Get of a missing key succeeded")
	}

	// Replacing keeps the count and changes data and hash.
	k := Key{PID: 1, Addr: PageSize}
	s.Put(k, pageOf(0xaa))
	if d, h, _ := s.Get(k); d[0] != 0xaa || h != xxh3.Hash128(pageOf(0xaa)) || s.Len() != n {
		t.Fatal("replace failed")
	}
	// The returned slice cannot be appended into the neighbour page.
	d, _, _ := s.Get(k)
	if cap(d) != PageSize {
		t.Fatalf("Get returned cap %d", cap(d))
	}

	buf := make([]byte, PageSize)
	if h, ok := s.ReadInto(k, buf); !ok || buf[0] != 0xaa || h != xxh3.Hash128(buf) {
		t.Fatal("ReadInto")
	}
	if h, ok := s.Hash(k); !ok || h != xxh3.Hash128(buf) {
		t.Fatal("Hash")
	}

	// Delete frees the slot for the next new key.
	used := s.used
	s.Delete(k)
	if _, _, ok := s.Get(k); ok || s.Len() != n-1 {
		t.Fatal("Delete")
	}
	s.Put(Key{PID: 7, Addr: 0}, pageOf(1))
	if s.used != used {
		t.Fatal("slot of a deleted page not reused")
	}

	count := 0
	s.Range(func(k Key, h xxh3.Uint128) bool {
		if got, _ := s.Hash(k); got != h {
			t.Fatalf("Range hash of %v", k)
		}
		count++
		return true
	})
	if count != s.Len() {
		t.Fatalf("Range visited %d of %d", count, s.Len())
	}

	s.Release()
	if s.Len() != 0 || s.Bytes() != 0 || len(s.slabs) != 0 {
		t.Fatal("Release left pages")
	}
	s.Put(k, pageOf(3))
	if s.Len() != 1 {
		t.Fatal("store unusable after Release")
	}
}

func TestStorePutPanicsOnWrongSize(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	NewStore().Put(Key{}, make([]byte, 10))
}

// One writer and readers at once; run with -race.
func TestStoreConcurrent(t *testing.T) {
	s := NewStore()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, PageSize)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := 0; i < 64; i++ {
					if h, ok := s.ReadInto(Key{Addr: uint64(i) * PageSize}, buf); ok && h != xxh3.Hash128(buf) {
						t.Error("torn page")
						return
					}
				}
				_ = s.Len()
			}
		}()
	}
	for n := 0; n < 2000; n++ {
		s.Put(Key{Addr: uint64(n%64) * PageSize}, pageOf(byte(n)))
	}
	close(stop)
	wg.Wait()
}

func BenchmarkStorePut(b *testing.B) {
	s := NewStore()
	p := pageOf(7)
	b.SetBytes(PageSize)
	i := 0
	for b.Loop() {
		// 256 MiB worth of distinct keys, then overwrites.
		s.Put(Key{PID: 1, Addr: uint64(i%65536) * PageSize}, p)
		i++
	}
}

// TestStoreObserve: observers see every change once the store holds it.
func TestStoreObserve(t *testing.T) {
	s := NewStore()
	k := Key{PID: 1, Addr: 0x1000}
	var puts, dels []Key
	s.Observe(func(got Key, data []byte) {
		if b, _, ok := s.Get(got); !ok || !bytes.Equal(b, data) {
			t.Error("observer called before the store held the page")
		}
		puts = append(puts, got)
	}, func(got Key) {
		if _, _, ok := s.Get(got); ok {
			t.Error("observer called before the page was gone")
		}
		dels = append(dels, got)
	})
	page := make([]byte, PageSize)
	s.Put(k, page)
	page[0] = 1
	s.Put(k, page)
	s.Delete(k)
	if len(puts) != 2 || len(dels) != 1 {
		t.Fatalf("observed %d puts and %d deletes, want 2 and 1", len(puts), len(dels))
	}
}

func mincore(mem, vec []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(len(mem)), uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
	if errno != 0 {
		return errno
	}
	return nil
}

// resident counts the pages of mem in memory (mincore).
func resident(t *testing.T, mem []byte) int {
	t.Helper()
	vec := make([]byte, len(mem)/PageSize)
	if err := mincore(mem, vec); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestStoreGivesBackEmptySlabs: once asked, a slab whose pages are all
// deleted leaves memory at once; one with a page left stays; a slot of a
// given-back slab reused holds what was put, not zeros.
func TestStoreGivesBackEmptySlabs(t *testing.T) {
	s := NewStore()
	defer s.Release()
	key := func(i int) Key { return Key{PID: 1, Addr: uint64(i) * PageSize} }
	for i := range 3 * slabPages {
		s.Put(key(i), pageOf(byte(i)))
	}
	for i := range s.slabs {
		if !s.slabs[i].mapped {
			t.Fatal("slab not mapped outside the heap")
		}
		if n := resident(t, s.slabs[i].mem); n != slabPages {
			t.Fatalf("slab %d: %d of %d pages resident after the puts", i, n, slabPages)
		}
	}
	// Slab 0 emptied before the store is asked: kept until then.
	for i := range slabPages {
		s.Delete(key(i))
	}
	if n := resident(t, s.slabs[0].mem); n != slabPages {
		t.Fatalf("an empty slab went back before GiveBackEmpty: %d resident", n)
	}
	s.GiveBackEmpty()
	if n := resident(t, s.slabs[0].mem); n != 0 {
		t.Fatalf("GiveBackEmpty left %d pages of an empty slab", n)
	}
	// Slab 1 emptied but for one page, slab 2 wholly.
	for i := slabPages; i < 3*slabPages; i++ {
		if i != slabPages+5 {
			s.Delete(key(i))
		}
	}
	if n := resident(t, s.slabs[1].mem); n != slabPages {
		t.Fatalf("a slab with a page left lost memory: %d resident", n)
	}
	if n := resident(t, s.slabs[2].mem); n != 0 {
		t.Fatalf("a slab emptied after GiveBackEmpty kept %d pages", n)
	}
	left := slabPages + 5
	if d, _, ok := s.Get(key(left)); !ok || !bytes.Equal(d, pageOf(byte(left))) {
		t.Fatal("the page left in slab 1 changed")
	}
	// Slots reused: the data put is there, whichever slab they fall in.
	for i := range 2 * slabPages {
		k := Key{PID: 2, Addr: uint64(i) * PageSize}
		s.Put(k, pageOf(byte(i+1)))
		if d, h, ok := s.Get(k); !ok || !bytes.Equal(d, pageOf(byte(i+1))) || h != xxh3.Hash128(d) {
			t.Fatalf("reused slot %d lost its page", i)
		}
	}
	if s.used != 3*slabPages {
		t.Fatalf("store grew to %d slots instead of reusing the %d it had", s.used, 3*slabPages)
	}
}

// TestStoreReleaseGivesBack: Release gives the slabs' memory back to the
// kernel at once; a slice taken before it reads zeros, not a fault.
func TestStoreReleaseGivesBack(t *testing.T) {
	s := NewStore()
	for i := range slabPages + 1 {
		s.Put(Key{Addr: uint64(i) * PageSize}, pageOf(1))
	}
	stale, _, _ := s.Get(Key{})
	mems := [][]byte{s.slabs[0].mem, s.slabs[1].mem}
	s.Release()
	for i, mem := range mems {
		if n := resident(t, mem); n != 0 {
			t.Fatalf("slab %d: %d pages still resident after Release", i, n)
		}
	}
	if !bytes.Equal(stale, make([]byte, PageSize)) {
		t.Fatal("a page taken before Release does not read as zeros")
	}
	if _, _, ok := s.Get(Key{}); ok {
		t.Fatal("Get found a page after Release")
	}
}

// TestStoreDroppedIsUnmapped: a store no one released is unmapped once the
// garbage collector finds it unreachable.
func TestStoreDroppedIsUnmapped(t *testing.T) {
	s := NewStore()
	s.Put(Key{}, pageOf(1))
	mem := s.slabs[0].mem // outside Go's heap: keeps nothing alive
	s = nil
	vec := make([]byte, slabPages)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		if err := mincore(mem, vec); errors.Is(err, unix.ENOMEM) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a dropped store's slab is still mapped")
		}
	}
}

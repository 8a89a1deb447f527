package pages

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

const (
	slabSize  = 1 << 20 // pages live in slabs this big, not one allocation each
	slabPages = slabSize / PageSize
)

// Store is the destination's copy of the pages received, by Key. It is safe
// for concurrent use; a slice from Get is valid only as long as its key
// is neither Put nor Deleted again (post-copy's pull deletes a page once
// the daemon has it, while the push Puts the next ones).
//
// Its slabs are mapped outside Go's heap, so that the memory goes back to
// the kernel when the store says so (Release, GiveBackEmpty), not when the
// garbage collector and the scavenger get to it (they only unmap the
// slabs, once the store is unreachable): on a VM whose balloon
// reports free pages, memory the host took back costs several µs a page
// on its next first touch, and the restored container's own pages are
// best made of the pages the store has just let go.
type Store struct {
	mu     sync.RWMutex
	index  map[Key]uint32 // slot of each key
	slabs  []slab
	hashes []xxh3.Uint128 // by slot
	free   []uint32       // slots of deleted pages, reused first
	used   uint32         // slots handed out so far
	// giveBack: a slab whose pages are all deleted goes back to the kernel.
	giveBack bool
	// mapped is every mapping the slabs hold, apart from the store so that
	// a store dropped without Release is unmapped once unreachable.
	mapped *mappings
	// limit bounds the pages a peer may have the store hold (0: none).
	limit int
	// Observers, called by the writer after each change (see Observe).
	onPut    func(Key, []byte)
	onDelete func(Key)
}

// Observe has put called after every Put (with the stored data, valid
// during the call) and del after every Delete, by the writer, once the
// store holds the change. Set it from the writer's goroutine.
func (s *Store) Observe(put func(Key, []byte), del func(Key)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onPut, s.onDelete = put, del
}

// Limit bounds the distinct pages the wire decoder (a peer) may have the
// store hold: what the source announced, not what it chooses to send.
func (s *Store) Limit(pages int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = pages
}

// roomFor refuses a new page beyond the limit.
func (s *Store) roomFor(k Key) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, ok := s.index[k]; ok || s.limit == 0 || len(s.index) < s.limit {
		return nil
	}
	return fmt.Errorf("pages: more than the %d pages announced (%d MiB) sent", s.limit, s.limit*PageSize>>20)
}

// NewStore returns an empty store.
func NewStore() *Store {
	s := &Store{index: map[Key]uint32{}, mapped: &mappings{}}
	runtime.AddCleanup(s, (*mappings).unmap, s.mapped)
	return s
}

// mappings are a store's slabs' memory maps.
type mappings struct{ mems [][]byte }

func (m *mappings) unmap() {
	for _, mem := range m.mems {
		_ = unix.Munmap(mem)
	}
	m.mems = nil
}

// slab is 1 MiB of pages and how many of them hold a stored page.
type slab struct {
	mem    []byte
	mapped bool // by mmap (else Go's heap, where mapping failed)
	live   uint16
	// resident: its memory has not been given back since it was last
	// written (a slab given back reads as zeros until written again).
	resident bool
}

func (s *Store) newSlab() slab {
	mem, err := unix.Mmap(-1, 0, slabSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return slab{mem: make([]byte, slabSize)}
	}
	s.mapped.mems = append(s.mapped.mems, mem)
	return slab{mem: mem, mapped: true}
}

// release hands the slab's memory back to the kernel; it reads as zeros
// until written again (a slot reused is written whole first).
func (sl *slab) release() {
	if sl.mapped && sl.resident {
		_ = unix.Madvise(sl.mem, unix.MADV_DONTNEED)
		sl.resident = false
	}
}

func (s *Store) slot(i uint32) []byte {
	off := int(i%slabPages) * PageSize
	return s.slabs[i/slabPages].mem[off : off+PageSize : off+PageSize]
}

// Put stores a copy of data (PageSize bytes) under k, replacing what was
// there, and returns its hash.
func (s *Store) Put(k Key, data []byte) (h xxh3.Uint128) {
	if len(data) != PageSize {
		panic(fmt.Sprintf("pages: Store.Put of %d bytes", len(data)))
	}
	h = xxh3.Hash128(data)
	s.mu.Lock()
	i, ok := s.index[k]
	if !ok {
		i = s.alloc()
		s.index[k] = i
		sl := &s.slabs[i/slabPages]
		sl.live++
		sl.resident = true
	}
	copy(s.slot(i), data)
	s.hashes[i] = h
	put := s.onPut
	s.mu.Unlock()
	if put != nil {
		put(k, data)
	}
	return h
}

func (s *Store) alloc() uint32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		return i
	}
	i := s.used
	s.used++
	if int(i/slabPages) == len(s.slabs) {
		s.slabs = append(s.slabs, s.newSlab())
	}
	s.hashes = append(s.hashes, xxh3.Uint128{})
	return i
}

// Get returns the page stored under k and its hash. The slice aliases the
// store: it stays valid until k is Put or Deleted again or the store is
// Released, so a reader racing with the writer on the same key must use
// ReadInto instead.
func (s *Store) Get(k Key) (data []byte, h xxh3.Uint128, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := s.index[k]
	if !ok {
		return nil, h, false
	}
	return s.slot(i), s.hashes[i], true
}

// ReadInto copies the page stored under k into dst (PageSize bytes).
func (s *Store) ReadInto(k Key, dst []byte) (h xxh3.Uint128, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := s.index[k]
	if !ok {
		return h, false
	}
	copy(dst, s.slot(i))
	return s.hashes[i], true
}

// Hash returns the hash of the page stored under k.
func (s *Store) Hash(k Key) (h xxh3.Uint128, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := s.index[k]
	if !ok {
		return h, false
	}
	return s.hashes[i], true
}

// Delete forgets the page under k; its room is reused by later Puts.
func (s *Store) Delete(k Key) {
	s.mu.Lock()
	if i, ok := s.index[k]; ok {
		delete(s.index, k)
		s.free = append(s.free, i)
		sl := &s.slabs[i/slabPages]
		if sl.live--; s.giveBack && sl.live == 0 {
			sl.release()
		}
	}
	del := s.onDelete
	s.mu.Unlock()
	if del != nil {
		del(k)
	}
}

// Range calls fn for every stored page's key and hash, in no particular
// order, until fn returns false. fn must not call the store's writing methods.
func (s *Store) Range(fn func(k Key, h xxh3.Uint128) bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for k, i := range s.index {
		if !fn(k, s.hashes[i]) {
			return
		}
	}
}

// Len returns the number of pages stored.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.index)
}

// Bytes returns the size of the page data stored (Len pages).
func (s *Store) Bytes() int64 {
	return int64(s.Len()) * PageSize
}

// GiveBackEmpty has every slab whose pages are all deleted, from now on,
// go back to the kernel at once: for a store that only empties from here
// (hybrid's, served to the lazy-pages daemon), whose pages then become
// the restored container's. A store that keeps filling as it empties
// (post-copy's push) would only pay for its pages again.
func (s *Store) GiveBackEmpty() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.giveBack = true
	for i := range s.slabs {
		if s.slabs[i].live == 0 {
			s.slabs[i].release()
		}
	}
}

// Release frees everything now; the store is empty and usable afterwards.
// The memory goes back to the kernel at once; its mappings stay until the
// store is unreachable, so that a slice from Get still held by a reader
// that lost the race with Release reads zeros instead of faulting.
func (s *Store) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.slabs {
		s.slabs[i].release()
	}
	s.index = map[Key]uint32{}
	s.slabs, s.hashes, s.free, s.used = nil, nil, nil, 0
}

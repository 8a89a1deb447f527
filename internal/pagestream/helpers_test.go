package pagestream

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
)

const (
	peParent = 1
	peLazy   = 2
)

// dstPID and dstShmem build the dst_id CRIU's encode_pm makes.
func dstPID(pid uint64) uint64  { return pid<<psTypeBits | psTypePID }
func dstShmem(id uint64) uint64 { return id<<psTypeBits | 2 }

// criuHeader builds a page_server_iov. The padding bytes are set on purpose:
// they must pass through untouched.
func criuHeader(cmd, flags uint32, nr, vaddr, dst uint64) []byte {
	b := make([]byte, headerSize)
	binary.LittleEndian.PutUint32(b, flags<<psCmdBits|cmd)
	copy(b[4:8], []byte{0xa5, 0x5a, 0x01, 0x02})
	binary.LittleEndian.PutUint64(b[8:], nr)
	binary.LittleEndian.PutUint64(b[16:], vaddr)
	binary.LittleEndian.PutUint64(b[24:], dst)
	return b
}

// store is a destination's set of held pages.
type store map[PageKey][]byte

func (s store) lookup(k PageKey) (Hash, bool) {
	p, ok := s[k]
	if !ok {
		return Hash{}, false
	}
	return HashPage(p), true
}

func (s store) source(k PageKey) ([]byte, Hash, bool) {
	p, ok := s[k]
	if !ok {
		return nil, Hash{}, false
	}
	return p, HashPage(p), true
}

// step is one message of a synthetic CRIU client: a header, its payload and
// the size of the reply the client then waits for.
type step struct {
	hdr   []byte
	data  []byte
	reply int
}

// synthStream is a CRIU client session covering every command the dump side
// sends, plus the destination's store: some pages held identical, some held
// stale, some not held, and a shmem page whose id collides with a held key.
type synthStream struct {
	steps      []step
	held       store
	referenced uint64 // pages Dedup should turn into references
	pages      uint64 // pages with payload
}

func newSynthStream(seed uint64) *synthStream {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := &synthStream{held: store{}}
	page := func() []byte {
		p := make([]byte, PageSize)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	add := func(cmd, flags uint32, pid uint64, shmem bool, vaddr uint64, n int, plan func(i int) int) {
		dst := dstPID(pid)
		if shmem {
			dst = dstShmem(pid)
		}
		var data []byte
		present := cmd == psIOVAdd || flags&pePresent != 0
		for i := 0; present && i < n; i++ {
			p := page()
			data = append(data, p...)
			k := PageKey{PID: uint32(pid), Addr: vaddr + uint64(i)*PageSize}
			switch plan(i) {
			case 1: // held as is
				s.held[k] = p
				if !shmem {
					s.referenced++
				}
			case 2: // held, but changed since
				s.held[k] = page()
			}
			s.pages++
		}
		s.steps = append(s.steps, step{hdr: criuHeader(cmd, flags, uint64(n), vaddr, dst), data: data})
	}
	ctl := func(cmd uint32, dst uint64, reply int) {
		s.steps = append(s.steps, step{hdr: criuHeader(cmd, 0, 0, 0, dst), reply: reply})
	}
	mixed := func(i int) int { return i % 3 }
	all := func(int) int { return 1 }

	ctl(psIOVParent, dstPID(1), 4)
	ctl(psIOVOpen2, dstPID(1), 1)
	add(psIOVAddF, pePresent, 1, false, 0x400000, 9, mixed)
	add(psIOVAddF, peLazy, 1, false, 0x500000, 4, all)
	add(psIOVHole, 0, 1, false, 0x600000, 3, all)
	add(psIOVAddF, peParent, 1, false, 0x700000, 2, all)
	add(psIOVAddF, pePresent, 1, false, 0x800000, 40, all)
	add(psIOVAdd, 0, 1, false, 0x900000, 2, mixed)
	add(psIOVAddF, pePresent|peLazy, 1, false, 0xa00000, 5, func(i int) int { return (i + 1) % 3 })
	ctl(psIOVOpen2, dstShmem(7), 1)
	add(psIOVAddF, pePresent, 7, true, 0, 3, all)
	ctl(psIOVParent, dstPID(7), 4)
	ctl(psIOVOpen2, dstPID(7), 1)
	add(psIOVAddF, pePresent, 7, false, 0x10000, 6, mixed)
	ctl(psIOVOpen, dstPID(8), 0)
	add(psIOVAddF, pePresent, 8, false, 0x20000, 1, func(int) int { return 0 })
	ctl(psIOVClose, 0, 4)
	return s
}

func (s *synthStream) bytes() []byte {
	var b bytes.Buffer
	for _, st := range s.steps {
		b.Write(st.hdr)
		b.Write(st.data)
	}
	return b.Bytes()
}

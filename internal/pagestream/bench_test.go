package pagestream

import (
	"bytes"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
)

const benchPages = 256 << 20 / PageSize

// benchDump is a 256 MiB dump of one task: OPEN2, one add of every page,
// CLOSE. benchHashes is what a destination holding all of it would know.
var (
	benchOnce   sync.Once
	benchDump   []byte
	benchData   []byte // the pages alone, a view into benchDump
	benchHashes map[PageKey]Hash
)

const benchBase = 0x7f0000000000

func benchSetup(b *testing.B) {
	b.Helper()
	benchOnce.Do(func() {
		var buf bytes.Buffer
		buf.Grow(benchPages*PageSize + 3*headerSize)
		buf.Write(criuHeader(psIOVOpen2, 0, 0, 0, dstPID(1)))
		buf.Write(criuHeader(psIOVAddF, pePresent, benchPages, benchBase, dstPID(1)))
		data := make([]byte, benchPages*PageSize)
		rand.NewChaCha8([32]byte{1}).Read(data)
		buf.Write(data)
		buf.Write(criuHeader(psIOVClose, 0, 0, 0, 0))
		benchDump = buf.Bytes()
		benchData = benchDump[2*headerSize : 2*headerSize+len(data)]
		benchHashes = make(map[PageKey]Hash, benchPages)
		for i := 0; i < benchPages; i++ {
			benchHashes[benchKey(i)] = HashPage(benchPage(i))
		}
	})
}

func benchKey(i int) PageKey    { return PageKey{PID: 1, Addr: benchBase + uint64(i)*PageSize} }
func benchPage(i int) []byte    { return benchData[i*PageSize : (i+1)*PageSize] }
func benchPageOf(k PageKey) int { return int((k.Addr - benchBase) / PageSize) }

// benchLookup holds every page, with every held'th page up to date.
func benchLookup(held int) Lookup {
	return func(k PageKey) (Hash, bool) {
		h, ok := benchHashes[k]
		if ok && benchPageOf(k)%held != 0 {
			h.Lo++ // changed since the destination got it
		}
		return h, ok
	}
}

func benchSource(k PageKey) ([]byte, Hash, bool) {
	h, ok := benchHashes[k]
	if !ok {
		return nil, Hash{}, false
	}
	return benchPage(benchPageOf(k)), h, true
}

var benchCases = []struct {
	name string
	have Lookup
}{
	{"none-held", nil},
	{"all-stale", benchLookup(1 << 30)},
	{"half-referenced", benchLookup(2)},
	{"all-referenced", benchLookup(1)},
}

// BenchmarkDedup reports MB/s of CRIU stream consumed.
func BenchmarkDedup(b *testing.B) {
	benchSetup(b)
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(benchDump)))
			for b.Loop() {
				if _, err := Dedup(io.Discard, bytes.NewReader(benchDump), c.have); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkExpand reports MB/s of CRIU stream produced.
func BenchmarkExpand(b *testing.B) {
	benchSetup(b)
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			var enc bytes.Buffer
			if _, err := Dedup(&enc, bytes.NewReader(benchDump), c.have); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(benchDump)))
			for b.Loop() {
				if _, err := Expand(io.Discard, bytes.NewReader(enc.Bytes()), benchSource); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package engine

import (
	"fmt"
	"testing"

	"github.com/ferry-migrate/ferry/internal/pages"
)

// The pages both of the last two rounds brought are picked (the first
// round, all of memory, never counts; all of the only one that does), each
// once, at most as many as asked.
func TestLastWritesPicked(t *testing.T) {
	l := lastWrites{first: 1}
	round := func(keys ...pages.Key) {
		for _, k := range keys {
			l.put(k, nil)
		}
		l.roundEnded()
	}
	a := func(addr uint64) pages.Key { return pages.Key{PID: 1, Addr: addr} }
	b := func(addr uint64) pages.Key { return pages.Key{PID: 2, Addr: addr} }
	round(a(0x1000), a(0x2000), a(0x3000), b(0x1000)) // round 0
	if got := l.picked(10); len(got) != 0 {
		t.Fatalf("after the first round: %v", got)
	}
	round(a(0x3000), a(0x2000), b(0x1000))
	// One round counts: all of it.
	if got, want := l.picked(10), map[uint32][]uint64{1: {0x2000, 0x3000}, 2: {0x1000}}; fmt.Sprintf("%#x", got) != fmt.Sprintf("%#x", want) {
		t.Fatalf("after one round past the first: %#x, want %#x", got, want)
	}
	round(a(0x9000), a(0x3000), a(0x2000), b(0x1000), a(0x5000))
	round(a(0x2000), a(0x7000), a(0x9000), a(0x2000), b(0x1000), a(0x3000)) // the frozen round
	want := map[uint32][]uint64{1: {0x2000, 0x3000, 0x9000}, 2: {0x1000}}
	if got := l.picked(10); fmt.Sprintf("%#x", got) != fmt.Sprintf("%#x", want) {
		t.Errorf("picked %#x, want %#x", got, want)
	}
	if got, want := l.picked(2), map[uint32][]uint64{1: {0x2000, 0x9000}}; fmt.Sprintf("%#x", got) != fmt.Sprintf("%#x", want) {
		t.Errorf("picked at most 2: %#x, want %#x", got, want)
	}
}

// Post-copy's only round counts whole (each page once, at most max).
func TestLastWritesOneRound(t *testing.T) {
	var l lastWrites
	for _, a := range []uint64{0x3000, 0x1000, 0x3000, 0x2000} {
		l.put(pages.Key{PID: 4, Addr: a}, nil)
	}
	l.roundEnded()
	if got, want := l.picked(10), map[uint32][]uint64{4: {0x1000, 0x2000, 0x3000}}; fmt.Sprintf("%#x", got) != fmt.Sprintf("%#x", want) {
		t.Errorf("picked %#x, want %#x", got, want)
	}
	if got, want := l.picked(1), map[uint32][]uint64{4: {0x3000}}; fmt.Sprintf("%#x", got) != fmt.Sprintf("%#x", want) {
		t.Errorf("picked at most 1: %#x, want %#x", got, want)
	}
}

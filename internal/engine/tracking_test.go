package engine

import (
	"fmt"
	"testing"

	"github.com/ferry-migrate/ferry/internal/pages"
)

func TestPageSet(t *testing.T) {
	s := newPageSet()
	s.add(pages.Key{PID: 1, Addr: 0x5000})
	s.addRange(pages.Range{PID: 2, Start: 0x1000, End: 0x3000})
	s.addRange(pages.Range{PID: 1, Start: 0x8000, End: 0x9000})
	s.addRange(pages.Range{PID: 1, Start: 0x1000, End: 0x2000})
	for _, c := range []struct {
		k    pages.Key
		want bool
	}{
		{pages.Key{PID: 1, Addr: 0x5000}, true},  // added alone
		{pages.Key{PID: 1, Addr: 0x1000}, true},  // a range's first page
		{pages.Key{PID: 1, Addr: 0x2000}, false}, // its end
		{pages.Key{PID: 1, Addr: 0x8000}, true},
		{pages.Key{PID: 1, Addr: 0x0000}, false}, // before every range
		{pages.Key{PID: 1, Addr: 0x9000}, false},
		{pages.Key{PID: 2, Addr: 0x2000}, true},  // another process's range
		{pages.Key{PID: 2, Addr: 0x8000}, false}, // not one of its ranges
		{pages.Key{PID: 3, Addr: 0x1000}, false}, // no ranges at all
	} {
		if got := s.has(c.k); got != c.want {
			t.Errorf("has(%d, %#x) = %v, want %v", c.k.PID, c.k.Addr, got, c.want)
		}
	}
}

func TestPageSetHeldParts(t *testing.T) {
	var none *pageSet
	if got := none.heldParts(pages.Range{PID: 1, Start: 0, End: 0x10000}); got != nil {
		t.Errorf("a nil set holds %v", got)
	}
	s := newPageSet()
	s.add(pages.Key{PID: 1, Addr: 0x3000})
	s.add(pages.Key{PID: 1, Addr: 0x9000})
	s.addRange(pages.Range{PID: 1, Start: 0x4000, End: 0x6000}) // touches 0x3000: merged
	s.addRange(pages.Range{PID: 1, Start: 0x1000, End: 0x2000})
	s.addRange(pages.Range{PID: 2, Start: 0x0000, End: 0x9000})
	for _, c := range []struct {
		q    pages.Range
		want []pages.Range
	}{
		{pages.Range{PID: 1, Start: 0x0000, End: 0xa000}, []pages.Range{{PID: 1, Start: 0x1000, End: 0x2000}, {PID: 1, Start: 0x3000, End: 0x6000}, {PID: 1, Start: 0x9000, End: 0xa000}}},
		{pages.Range{PID: 1, Start: 0x5000, End: 0x9000}, []pages.Range{{PID: 1, Start: 0x5000, End: 0x6000}}}, // clipped
		{pages.Range{PID: 1, Start: 0x6000, End: 0x9000}, nil},                                                 // a gap
		{pages.Range{PID: 3, Start: 0x0000, End: 0x9000}, nil},                                                 // another process
		{pages.Range{PID: 2, Start: 0x2000, End: 0x4000}, []pages.Range{{PID: 2, Start: 0x2000, End: 0x4000}}},
	} {
		if got := s.heldParts(c.q); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("heldParts(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	// A page added after a lookup is seen by the next.
	s.add(pages.Key{PID: 1, Addr: 0x7000})
	if got := s.heldParts(pages.Range{PID: 1, Start: 0x6000, End: 0x9000}); fmt.Sprint(got) != fmt.Sprint([]pages.Range{{PID: 1, Start: 0x7000, End: 0x8000}}) {
		t.Errorf("after add: %v", got)
	}
}

// A round reads pages in address order: neighbours make one range.
func TestPageSetCoalesces(t *testing.T) {
	s := newPageSet()
	for a := uint64(0x1000); a < 0x101000; a += pageSize {
		s.add(pages.Key{PID: 7, Addr: a})
	}
	s.addRange(pages.Range{PID: 7, Start: 0x101000, End: 0x200000})
	s.add(pages.Key{PID: 8, Addr: 0x200000}) // another process: a range of its own
	if len(s.ranges) != 2 || !s.has(pages.Key{PID: 7, Addr: 0x1ff000}) || s.has(pages.Key{PID: 7, Addr: 0x200000}) {
		t.Errorf("ranges %v", s.ranges)
	}
}

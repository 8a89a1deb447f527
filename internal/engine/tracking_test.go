package engine

import (
	"testing"

	"github.com/ferry-migrate/ferry/internal/pages"
)

func TestPageSet(t *testing.T) {
	s := newPageSet(100, true)
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

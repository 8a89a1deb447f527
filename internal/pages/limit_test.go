package pages

import (
	"bytes"
	"strings"
	"testing"
)

// A peer cannot have the store hold more distinct pages than its limit;
// pages it already holds may be sent again.
func TestStoreLimit(t *testing.T) {
	var buf bytes.Buffer
	e, err := NewEncoder(&buf, false)
	if err != nil {
		t.Fatal(err)
	}
	page := make([]byte, PageSize)
	for _, addr := range []uint64{0, PageSize, 0, 2 * PageSize} {
		if err := e.Page(Key{PID: 1, Addr: addr}, page); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	d, err := NewDecoder(&buf)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore()
	defer s.Release()
	s.Limit(2)
	for i := 0; i < 3; i++ {
		if _, _, err := d.Next(s); err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
	}
	if _, _, err := d.Next(s); err == nil || !strings.Contains(err.Error(), "more than the 2 pages announced") {
		t.Errorf("a third distinct page: %v", err)
	}
	if s.Len() != 2 {
		t.Errorf("store holds %d pages", s.Len())
	}
}

package pages

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func randPage(r *rand.Rand) []byte {
	p := make([]byte, PageSize)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

func TestDeltaRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	old := randPage(r)
	edit := func(f func(p []byte)) []byte {
		p := bytes.Clone(old)
		f(p)
		return p
	}
	cases := map[string]struct {
		page []byte
		ok   bool
		max  int // expected delta size at most, when ok
	}{
		"same":       {bytes.Clone(old), true, 0},
		"first byte": {edit(func(p []byte) { p[0]++ }), true, 3},
		"last byte":  {edit(func(p []byte) { p[PageSize-1]++ }), true, 4},
		"word in the middle": {edit(func(p []byte) {
			for i := 2000; i < 2008; i++ {
				p[i] ^= 0xff
			}
		}), true, 12},
		"short gaps": {edit(func(p []byte) { p[100]++; p[102]++; p[105]++; p[109]++ }), true, 14},
		"scattered": {edit(func(p []byte) {
			for i := 0; i < PageSize; i += 97 {
				p[i]++
			}
		}), true, 43 * 4},
		"all new":        {randPage(r), false, 0},
		"three quarters": {edit(func(p []byte) { copy(p[:MaxDelta], randPage(r)) }), false, 0},
	}
	for name, c := range cases {
		d, ok := EncodeDelta(old, c.page, nil)
		if ok != c.ok {
			t.Errorf("%s: ok = %v, want %v (%d bytes)", name, ok, c.ok, len(d))
			continue
		}
		if !ok {
			continue
		}
		if len(d) > c.max {
			t.Errorf("%s: delta of %d bytes, want at most %d", name, len(d), c.max)
		}
		got, err := ApplyDelta(old, d, nil)
		if err != nil || !bytes.Equal(got, c.page) {
			t.Errorf("%s: ApplyDelta: %v, equal %v", name, err, bytes.Equal(got, c.page))
		}
	}
}

func TestDeltaReusesBuffers(t *testing.T) {
	old := make([]byte, PageSize)
	cur := bytes.Clone(old)
	cur[10] = 1
	dst := make([]byte, 0, 64)
	d, ok := EncodeDelta(old, cur, dst)
	if !ok || &d[0] != &dst[:1][0] {
		t.Fatal("EncodeDelta did not use dst")
	}
	out := make([]byte, PageSize)
	got, err := ApplyDelta(old, d, out)
	if err != nil || &got[0] != &out[0] || !bytes.Equal(got, cur) {
		t.Fatalf("ApplyDelta: %v", err)
	}
	if _, ok := EncodeDelta(old[:100], cur[:100], nil); ok {
		t.Fatal("EncodeDelta of short pages succeeded")
	}
	if _, err := ApplyDelta(old[:100], nil, nil); err == nil {
		t.Fatal("ApplyDelta to a short page succeeded")
	}
}

func TestApplyDeltaRejects(t *testing.T) {
	old := make([]byte, PageSize)
	bad := map[string][]byte{
		"lone varint":         {5},
		"empty literal":       {5, 0},
		"missing literal":     {0, 3, 1, 2},
		"non-minimal varint":  {0x80, 0x00, 1, 7},
		"three-byte varint":   {0x80, 0x80, 0x01, 1, 7},
		"skip past the page":  {0x80, 0x20, 1, 7}, // skip 4096
		"literal past page":   {0xff, 0x1f, 2, 7, 7},
		"trailing garbage":    {0, 1, 7, 9},
		"truncated 2nd pair":  {0, 1, 7, 0x80},
		"huge literal length": {0, 0xff, 0x7f},
	}
	for name, d := range bad {
		if _, err := ApplyDelta(old, d, nil); err == nil {
			t.Errorf("%s: accepted %x", name, d)
		}
	}
	// The largest valid skip: the last byte.
	got, err := ApplyDelta(old, []byte{0xff, 0x1f, 1, 7}, nil)
	if err != nil || got[PageSize-1] != 7 {
		t.Fatalf("skip to the last byte: %v", err)
	}
}

// fuzzPages turns fuzz input into two pages: old repeats a, and the new page
// differs from old by the XOR pattern b (zero-padded).
func fuzzPages(a, b []byte) (old, cur []byte) {
	old = make([]byte, PageSize)
	if len(a) > 0 {
		for i := range old {
			old[i] = a[i%len(a)]
		}
	}
	cur = bytes.Clone(old)
	for i := 0; i < len(b) && i < PageSize; i++ {
		cur[i] ^= b[i]
	}
	return old, cur
}

func FuzzApplyDelta(f *testing.F) {
	f.Add([]byte("old"), []byte("\x00\x00\x01"), []byte{0, 1, 7})
	f.Fuzz(func(t *testing.T, a, b, delta []byte) {
		old, cur := fuzzPages(a, b)
		d, ok := EncodeDelta(old, cur, nil)
		if ok {
			if len(d) >= MaxDelta {
				t.Fatalf("delta of %d bytes accepted", len(d))
			}
			got, err := ApplyDelta(old, d, nil)
			if err != nil || !bytes.Equal(got, cur) {
				t.Fatalf("round trip failed: %v", err)
			}
		}
		got, err := ApplyDelta(old, delta, nil)
		if err == nil && len(got) != PageSize {
			t.Fatalf("ApplyDelta gave %d bytes", len(got))
		}
	})
}

func benchPages() (old, cur []byte) {
	r := rand.New(rand.NewPCG(3, 4))
	old = randPage(r)
	cur = bytes.Clone(old)
	// A few counters and a small struct changed, as in a typical dirty page.
	for _, off := range []int{8, 640, 1288, 3000} {
		for i := 0; i < 16; i++ {
			cur[off+i] ^= byte(i + 1)
		}
	}
	return old, cur
}

func BenchmarkEncodeDelta(b *testing.B) {
	old, cur := benchPages()
	dst := make([]byte, 0, PageSize)
	b.SetBytes(PageSize)
	for b.Loop() {
		dst, _ = EncodeDelta(old, cur, dst)
	}
	b.ReportMetric(float64(len(dst)), "delta-bytes")
}

func BenchmarkApplyDelta(b *testing.B) {
	old, cur := benchPages()
	d, _ := EncodeDelta(old, cur, nil)
	dst := make([]byte, PageSize)
	b.SetBytes(PageSize)
	for b.Loop() {
		var err error
		if dst, err = ApplyDelta(old, d, dst); err != nil {
			b.Fatal(err)
		}
	}
}

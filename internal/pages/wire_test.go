package pages

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

// sentPages is what a test sends: the expected content by key.
type sentPages map[Key][]byte

// writeRounds encodes two rounds: full pages (compressible ones and random
// ones, in runs and scattered), then deltas and new pages.
func writeRounds(t testing.TB, w io.Writer, compress bool) (sentPages, *Encoder) {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 6))
	e, err := NewEncoder(w, compress)
	if err != nil {
		t.Fatal(err)
	}
	want := sentPages{}
	page := func(k Key, p []byte) {
		if err := e.Page(k, p); err != nil {
			t.Fatal(err)
		}
		want[k] = bytes.Clone(p)
	}
	// Round 0: 600 pages (more than a chunk) in runs, for three processes.
	for i := 0; i < 600; i++ {
		k := Key{PID: uint32(1 + i%3), Addr: 0x7f0000000000 + uint64(i/3)*PageSize}
		p := pageOf(byte(i))
		if i%4 == 0 {
			p = randPage(r)
		}
		page(k, p)
	}
	page(Key{PID: 1 << 31, Addr: 0xfffffffffffff000}, pageOf(9))
	if err := e.EndRound(0); err != nil {
		t.Fatal(err)
	}
	// Round 1: deltas for some pages, one new page.
	for i := 0; i < 600; i += 7 {
		k := Key{PID: uint32(1 + i%3), Addr: 0x7f0000000000 + uint64(i/3)*PageSize}
		cur := bytes.Clone(want[k])
		cur[100] ^= 0x55
		cur[4000] ^= 0x11
		d, ok := EncodeDelta(want[k], cur, nil)
		if !ok {
			t.Fatal("delta not worth it")
		}
		if err := e.Delta(k, d); err != nil {
			t.Fatal(err)
		}
		want[k] = cur
	}
	page(Key{PID: 4, Addr: 0x1000}, randPage(r))
	if err := e.EndRound(1); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return want, e
}

func TestWireRoundTrip(t *testing.T) {
	for _, compress := range []bool{false, true} {
		var buf bytes.Buffer
		want, e := writeRounds(t, &buf, compress)
		if e.WrittenBytes() != int64(buf.Len()) {
			t.Fatalf("WrittenBytes %d, wrote %d", e.WrittenBytes(), buf.Len())
		}
		t.Logf("compress=%v: raw %d bytes, written %d", compress, e.RawBytes(), e.WrittenBytes())
		if compress && e.WrittenBytes() >= e.RawBytes()*3/4 {
			t.Errorf("compression saved little: %d of %d", e.WrittenBytes(), e.RawBytes())
		}
		// Whatever follows the stream on the channel stays unread.
		buf.WriteString("TAIL")

		s := NewStore()
		d, err := NewDecoder(&buf)
		if err != nil {
			t.Fatal(err)
		}
		var rounds []int
		for {
			round, end, err := d.Next(s)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if end {
				rounds = append(rounds, round)
			}
		}
		if len(rounds) != 2 || rounds[0] != 0 || rounds[1] != 1 {
			t.Fatalf("rounds %v", rounds)
		}
		if _, _, err := d.Next(s); !errors.Is(err, io.EOF) {
			t.Fatalf("Next after the end: %v", err)
		}
		if buf.String() != "TAIL" {
			t.Fatalf("decoder consumed past the stream: %q left", buf.String())
		}
		if s.Len() != len(want) {
			t.Fatalf("store has %d pages, sent %d", s.Len(), len(want))
		}
		for k, p := range want {
			got, _, ok := s.Get(k)
			if !ok || !bytes.Equal(got, p) {
				t.Fatalf("page %v differs (present %v)", k, ok)
			}
		}
	}
}

func TestWireTruncated(t *testing.T) {
	for _, compress := range []bool{false, true} {
		var buf bytes.Buffer
		writeRounds(t, &buf, compress)
		full := buf.Bytes()
		for _, n := range []int{0, 3, 6, 7, 9, 100, len(full) / 2, len(full) - 1} {
			d, err := NewDecoder(bytes.NewReader(full[:n]))
			if err != nil {
				continue
			}
			s := NewStore()
			for {
				_, _, err = d.Next(s)
				if err != nil {
					break
				}
			}
			if errors.Is(err, io.EOF) {
				t.Errorf("compress=%v: stream cut at %d of %d bytes ended cleanly", compress, n, len(full))
			}
		}
	}
}

// encode returns a stream made by f.
func encode(t *testing.T, compress bool, f func(e *Encoder)) []byte {
	t.Helper()
	var buf bytes.Buffer
	e, err := NewEncoder(&buf, compress)
	if err != nil {
		t.Fatal(err)
	}
	f(e)
	return buf.Bytes()
}

// decodeAll applies a whole stream and returns the first error.
func decodeAll(b []byte, s *Store) error {
	d, err := NewDecoder(bytes.NewReader(b))
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		if _, _, err := d.Next(s); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func TestWireErrors(t *testing.T) {
	k := Key{PID: 1, Addr: PageSize}
	// A delta for a page never sent.
	b := encode(t, false, func(e *Encoder) {
		e.Delta(k, []byte{0, 1, 1})
		e.EndRound(0)
		e.Close()
	})
	if err := decodeAll(b, NewStore()); err == nil {
		t.Error("delta without a page accepted")
	}
	// A malformed delta.
	b = encode(t, false, func(e *Encoder) {
		e.Page(k, pageOf(1))
		e.Delta(k, []byte{0, 0})
		e.Close()
	})
	if err := decodeAll(b, NewStore()); err == nil {
		t.Error("malformed delta accepted")
	}
	// Counts that do not match: patch the page count of the round record.
	b = encode(t, false, func(e *Encoder) {
		e.Page(k, pageOf(1))
		e.EndRound(0)
		e.Close()
	})
	i := bytes.LastIndex(b, []byte{recRound, 0, 1, 0})
	if i < 0 {
		t.Fatal("no round record found")
	}
	b[i+2] = 2
	if err := decodeAll(b, NewStore()); err == nil {
		t.Error("wrong page count accepted")
	}
	// Bad header and trailing data inside the last chunk.
	if err := decodeAll([]byte("FRPX\x01\x00"), NewStore()); err == nil {
		t.Error("bad magic accepted")
	}
	if err := decodeAll([]byte("FRPG\x01\x00\x00\x02\x00\x00"), NewStore()); err == nil {
		t.Error("data after the end record accepted")
	}
	if err := decodeAll([]byte("FRPG\x01\x00\x00\x01\x00"), NewStore()); err != nil {
		t.Errorf("empty stream: %v", err)
	}
	if err := decodeAll([]byte("FRPG\x01\x00\x01\x01\x00"), NewStore()); err == nil {
		t.Error("zstd chunk in a stream without compression accepted")
	}
	if err := decodeAll([]byte("FRPG\x01\x00\x00\x81\x00\x00"), NewStore()); err == nil {
		t.Error("non-minimal chunk length accepted")
	}
	// Sequential key without a previous one.
	if err := decodeAll(append([]byte("FRPG\x01\x00\x00\x81\x20\x05"), make([]byte, PageSize)...), NewStore()); err == nil {
		t.Error("sequential key without a previous key accepted")
	}

	e, _ := NewEncoder(io.Discard, false)
	if err := e.Page(Key{Addr: 5}, pageOf(0)); err == nil {
		t.Error("unaligned address accepted")
	}
	if err := e.Page(k, make([]byte, 5)); err == nil {
		t.Error("short page accepted")
	}
	if err := e.EndRound(-1); err == nil {
		t.Error("negative round accepted")
	}
	e.Close()
	if err := e.Page(k, pageOf(0)); err == nil {
		t.Error("Page after Close accepted")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken") }

func TestEncoderWriteError(t *testing.T) {
	if _, err := NewEncoder(failWriter{}, false); err == nil {
		t.Fatal("header write error lost")
	}
}

func FuzzDecoder(f *testing.F) {
	f.Add([]byte("FRPG\x01\x00\x00\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := NewStore()
		defer s.Release()
		d, err := NewDecoder(bytes.NewReader(b))
		if err != nil {
			return
		}
		for i := 0; i < 1<<16; i++ {
			_, _, err := d.Next(s)
			if err != nil {
				if _, _, again := d.Next(s); again != err { //nolint:errorlint // the very same error, not one like it
					t.Fatalf("error not final: %v then %v", err, again)
				}
				break
			}
		}
		s.Range(func(k Key, _ xxh3.Uint128) bool { return true })
	})
}

func BenchmarkEncoder(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	// Half random, half repetitive pages, like a heap.
	pages := make([][]byte, 256)
	for i := range pages {
		if i%2 == 0 {
			pages[i] = randPage(r)
		} else {
			pages[i] = pageOf(byte(i))
		}
	}
	for _, compress := range []bool{false, true} {
		name := "raw"
		if compress {
			name = "zstd"
		}
		b.Run(name, func(b *testing.B) {
			e, err := NewEncoder(io.Discard, compress)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(PageSize)
			i := 0
			for b.Loop() {
				e.Page(Key{PID: 1, Addr: uint64(i) * PageSize}, pages[i%len(pages)])
				i++
			}
			e.Close()
			b.ReportMetric(float64(e.WrittenBytes())/float64(e.RawBytes()), "ratio")
		})
	}
}

package main

import (
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseSize(t *testing.T) {
	good := map[string]uint64{
		"4096":   4096,
		"0":      0,
		"64B":    64,
		"512k":   512 << 10,
		"512KiB": 512 << 10,
		"64M":    64 << 20,
		"64MiB":  64 << 20,
		"64MB":   64 << 20,
		"64mib":  64 << 20,
		"1G":     1 << 30,
		"1GiB":   1 << 30,
		"2T":     2 << 40,
		" 8M ":   8 << 20,
	}
	for in, want := range good {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "-1M", "64X", "64Mi", "64iB", "99999999999T", "0x10"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

func newTestMemory(t *testing.T, size uint64) *memory {
	t.Helper()
	m, err := newMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m.region) })
	return m
}

// fullDigest recomputes every page hash from the buffer.
func fullDigest(m *memory) (hashes []uint64, total uint64) {
	hashes = make([]uint64, m.pages)
	for p := range m.pages {
		hashes[p] = hashPage(m.words[p*wordsPerPage:(p+1)*wordsPerPage], p*wordsPerPage)
		total += hashes[p]
	}
	return hashes, total
}

func TestIncrementalHashMatchesRecompute(t *testing.T) {
	m := newTestMemory(t, 1<<20+100) // rounds up to 257 pages
	if m.pages != 257 || len(m.buf) != 257*pageSize {
		t.Fatalf("pages = %d, len = %d", m.pages, len(m.buf))
	}
	m.fill(42)
	_, total := fullDigest(m)
	if total != m.digest.Load() {
		t.Fatalf("after fill: digest %x, recomputed %x", m.digest.Load(), total)
	}
	before := m.digest.Load()
	for range 50 {
		m.dirty(37)
	}
	if m.writes.Load() != 50*37 {
		t.Errorf("writes = %d", m.writes.Load())
	}
	hashes, total := fullDigest(m)
	if total != m.digest.Load() {
		t.Fatalf("after dirtying: digest %x, recomputed %x", m.digest.Load(), total)
	}
	for p := range hashes {
		if hashes[p] != m.hashes[p] {
			t.Fatalf("page %d: stored hash %x, recomputed %x", p, m.hashes[p], hashes[p])
		}
	}
	if m.digest.Load() == before {
		t.Error("dirtying did not change the digest")
	}
	if bad, ok := m.verify(func() {}); !ok || bad != 0 {
		t.Errorf("verify = %d bad, ok %v", bad, ok)
	}
}

func TestFillIsDeterministic(t *testing.T) {
	a, b, c := newTestMemory(t, 64<<10), newTestMemory(t, 64<<10), newTestMemory(t, 64<<10)
	a.fill(7)
	b.fill(7)
	c.fill(8)
	if a.digest.Load() != b.digest.Load() || string(a.buf) != string(b.buf) {
		t.Error("same seed gave different contents")
	}
	if a.digest.Load() == c.digest.Load() {
		t.Error("different seeds gave the same digest")
	}
}

func TestVerifyFindsCorruption(t *testing.T) {
	m := newTestMemory(t, 16*pageSize)
	m.fill(1)
	m.buf[5*pageSize+123] ^= 0x01
	// A later write elsewhere in the same page must not hide it.
	m.dirty(100)
	bad, ok := m.verify(func() {})
	if ok || bad != 1 {
		t.Errorf("verify = %d bad, ok %v; want 1 bad page", bad, ok)
	}

	// Moving a word to another place is caught too: hashes are positional.
	m2 := newTestMemory(t, 16*pageSize)
	m2.fill(1)
	m2.words[3], m2.words[4] = m2.words[4], m2.words[3]
	if bad, ok := m2.verify(func() {}); ok || bad != 1 {
		t.Errorf("swapped words: verify = %d bad, ok %v", bad, ok)
	}
}

func TestStrideVisitsEveryPage(t *testing.T) {
	for _, pages := range []uint64{1, 2, 3, 10, 64, 257, 1000, 4096} {
		s := strideFor(pages)
		seen := make(map[uint64]bool)
		var idx uint64
		for range pages {
			seen[idx] = true
			idx = (idx + s) % pages
		}
		if uint64(len(seen)) != pages {
			t.Errorf("pages %d stride %d: visited %d pages", pages, s, len(seen))
		}
	}
}

func TestMappingHasGuards(t *testing.T) {
	m := newTestMemory(t, 8*pageSize)
	if len(m.region) != 10*pageSize || &m.region[pageSize] != &m.buf[0] {
		t.Fatal("buffer is not between two guard pages")
	}
}

// TestServe runs the UDP server in-process on a loopback port.
func TestServe(t *testing.T) {
	m := newTestMemory(t, 32*pageSize)
	h := &hog{mem: m, boot: "00000000deadbeef"}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go h.serve(conn)

	ask := func(req string) map[string]any {
		t.Helper()
		c, err := net.Dial("udp", conn.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("%s: %v", req, err)
		}
		var r map[string]any
		if err := json.Unmarshal(buf[:n], &r); err != nil {
			t.Fatalf("%s: %v in %q", req, err, buf[:n])
		}
		return r
	}

	if r := ask("STAT"); r["ready"] != false || r["boot"] != "00000000deadbeef" {
		t.Errorf("STAT before fill = %v", r)
	}
	if r := ask("VERIFY"); r["verify_ok"] != false {
		t.Errorf("VERIFY before fill = %v", r)
	}
	m.fill(3)
	m.dirty(10)
	h.counter.Store(99)
	r := ask("STAT")
	if r["ready"] != true || r["counter"] != 99.0 || r["writes"] != 10.0 || r["pages"] != 32.0 ||
		r["memory_bytes"] != float64(32*pageSize) || len(r["digest"].(string)) != 16 {
		t.Errorf("STAT = %v", r)
	}
	if _, has := r["verify_ok"]; has {
		t.Errorf("STAT carries verify fields: %v", r)
	}
	if r := ask("verify\n"); r["verify_ok"] != true || r["bad_pages"] != 0.0 || r["ready"] != true {
		t.Errorf("VERIFY = %v", r)
	}
	if r := ask("HELLO"); !strings.Contains(r["error"].(string), "unknown request") {
		t.Errorf("HELLO = %v", r)
	}
}

func BenchmarkHashPage(b *testing.B) {
	m, err := newMemory(1 << 20)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m.region)
	m.fill(1)
	b.SetBytes(pageSize)
	var sink uint64
	for i := 0; b.Loop(); i++ {
		p := uint64(i) % m.pages
		sink += hashPage(m.words[p*wordsPerPage:(p+1)*wordsPerPage], p*wordsPerPage)
	}
	_ = sink
}

// BenchmarkFill256MiB maps, fills and hashes 256 MiB, page faults included.
func BenchmarkFill256MiB(b *testing.B) {
	b.SetBytes(256 << 20)
	for b.Loop() {
		m, err := newMemory(256 << 20)
		if err != nil {
			b.Fatal(err)
		}
		m.fill(1)
		unix.Munmap(m.region)
	}
}

func BenchmarkVerify256MiB(b *testing.B) {
	m, err := newMemory(256 << 20)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m.region)
	m.fill(1)
	b.SetBytes(256 << 20)
	for b.Loop() {
		if _, ok := m.verify(func() {}); !ok {
			b.Fatal("verify failed")
		}
	}
}

// TestJournalCheck: the journal's check passes what was written and finds
// a record torn, lost at the end, or stale.
func TestJournalCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	j, err := openJournal(path, 42)
	if err != nil {
		t.Fatal(err)
	}
	defer j.f.Close()
	if err := j.fill(5 * recordSize); err != nil {
		t.Fatal(err)
	}
	if n, bad, ok := j.check(); !ok || n != 5 || bad != 0 {
		t.Fatalf("intact journal: %d records, %d bad, ok %v", n, bad, ok)
	}
	if _, err := j.f.WriteAt([]byte{0xff}, 2*recordSize+100); err != nil {
		t.Fatal(err)
	}
	if _, bad, ok := j.check(); ok || bad != 1 {
		t.Fatalf("torn record: %d bad, ok %v", bad, ok)
	}
	if err := j.f.Truncate(4 * recordSize); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := j.check(); ok {
		t.Fatal("a journal missing its last record passed")
	}
}

// TestWatchCheck: the watch reports a write to its file, and one whose
// inotify descriptor is gone does not.
func TestWatchCheck(t *testing.T) {
	w, err := newWatch(filepath.Join(t.TempDir(), "watched"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if !w.check() {
			t.Fatalf("a live watch did not report write %d", i+1)
		}
	}
	unix.Close(w.fd)
	if w.check() {
		t.Fatal("a closed watch reported a write")
	}
}

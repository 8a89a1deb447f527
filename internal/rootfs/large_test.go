package rootfs

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/transport/transporttest"
	"golang.org/x/sys/unix"
)

// largeTree fills dir with files small files (100 to a directory, ten
// directories to a parent, up to 200 bytes each) and, when bigSize > 0, one
// big file of random bytes: the shape of a distribution's root filesystem.
// It returns the number of entries Scan finds.
func largeTree(tb testing.TB, dir string, files int, bigSize int64) int {
	tb.Helper()
	const perDir, perParent = 100, 10
	dirs := (files + perDir - 1) / perDir
	parents := (dirs + perParent - 1) / perParent
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("p%03d/d%02d", d/perParent, d%perParent)), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	// Two writers: creating files is mostly waiting for the filesystem.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := range 2 {
		wg.Go(func() {
			data := make([]byte, 200)
			for i := w; i < files; i += 2 {
				d := i / perDir
				p := filepath.Join(dir, fmt.Sprintf("p%03d/d%02d/f%05d", d/perParent, d%perParent, i))
				for j := range data {
					data[j] = byte(i + j)
				}
				if err := os.WriteFile(p, data[:i%201], 0o644); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	entries := files + dirs + parents
	if bigSize > 0 {
		f, err := os.Create(filepath.Join(dir, "big.img"))
		if err != nil {
			tb.Fatal(err)
		}
		rng := rand.NewChaCha8([32]byte{1})
		buf := make([]byte, 1<<20)
		for left := bigSize; left > 0; left -= int64(len(buf)) {
			rng.Read(buf)
			if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
				tb.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
		entries++
	}
	return entries
}

// pipeSessions connects two transport sessions over net.Pipe.
func pipeSessions(tb testing.TB) (src, dst *transport.Session) {
	return transporttest.Pipe(tb, "src", "dst")
}

// channelPair opens one channel between the sessions.
func channelPair(tb testing.TB, src, dst *transport.Session, kind string) (*transport.Channel, *transport.Channel) {
	tb.Helper()
	acc := make(chan *transport.Channel, 1)
	go func() {
		ch, err := dst.Accept()
		if err != nil {
			tb.Error(err)
		}
		acc <- ch
	}()
	s, err := src.Open(kind)
	if err != nil {
		tb.Fatal(err)
	}
	d := <-acc
	if d == nil {
		tb.FailNow()
	}
	return s, d
}

// TestLargeManifestOverChannel: the manifest of a root filesystem with tens
// of thousands of files is several frames long; it crosses a channel whole.
func TestLargeManifestOverChannel(t *testing.T) {
	files := 60_000
	if testing.Short() {
		files = 20_000 // still more than one frame (15,000 are not)
	}
	dir := t.TempDir()
	entries := largeTree(t, dir, files, 0)
	have, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(have) != entries {
		t.Fatalf("scanned %d entries, built %d", len(have), entries)
	}
	wire, err := json.Marshal(have)
	if err != nil {
		t.Fatal(err)
	}
	if len(wire) <= transport.MaxPayload {
		t.Fatalf("a manifest of %d bytes fits one frame: the test proves nothing", len(wire))
	}
	src, dst := pipeSessions(t)
	sch, dch := channelPair(t, src, dst, "rootfs")
	errc := make(chan error, 1)
	go func() { errc <- dch.Send(have) }()
	var got Manifest
	if err := sch.Recv(&got); err != nil {
		t.Fatalf("manifest of %d bytes: %v", len(wire), err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if len(got) != len(have) {
		t.Fatalf("%d entries came back as %d", len(have), len(got))
	}
	for p, e := range have {
		if got[p] != e {
			t.Fatalf("%s: %+v came back as %+v", p, e, got[p])
		}
	}
	t.Logf("%d entries, manifest of %d bytes", len(have), len(wire))
}

// TestScanWalkersAgree: however many goroutines walk, a scan finds the
// same entries.
func TestScanWalkersAgree(t *testing.T) {
	dir := t.TempDir()
	buildTree(t, dir)
	largeTree(t, dir, 3000, 0)
	defer func(old int) { scanWorkers = old }(scanWorkers)
	scanWorkers = 1
	want, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 4, 16} {
		scanWorkers = n
		for range 3 {
			got, err := Scan(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%d walkers: %d entries, one walker %d", n, len(got), len(want))
			}
		}
	}
}

// TestScanDepthLimit: a tree deeper than maxDepth fails the scan, whichever
// walker meets the bottom, and no descriptor stays open.
func TestScanDepthLimit(t *testing.T) {
	dir := t.TempDir()
	largeTree(t, dir, 2000, 0) // work for the other walkers meanwhile
	fd, err := unix.Open(dir, dirFlags, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range maxDepth + 2 {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", dirFlags, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	before := openFDs(t)
	defer func(old int) { scanWorkers = old }(scanWorkers)
	for _, n := range []int{1, 4} {
		scanWorkers = n
		_, err := Scan(dir)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("deeper than %d levels", maxDepth)) {
			t.Fatalf("%d walkers: got %v", n, err)
		}
	}
	if after := openFDs(t); after != before {
		t.Fatalf("%d descriptors open before the scans, %d after", before, after)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(ents)
}

// frozenSync runs one rootfs sync the way the engine does (engine's
// receiveRootfs and syncRootfs): the destination scans and sends its
// manifest, the source scans, diffs and streams the delta, the destination
// applies it.
func frozenSync(tb testing.TB, sch, dch *transport.Channel, srcDir, dstDir string) (Delta, Stats) {
	type result struct {
		st  Stats
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { done <- r }()
		have, err := Scan(dstDir)
		if err != nil {
			r.err = err
			return
		}
		if r.err = dch.Send(have); r.err != nil {
			return
		}
		if r.st, r.err = ApplyDelta(dch, dstDir); r.err != nil {
			return
		}
		_, r.err = io.Copy(io.Discard, dch)
	}()
	var have Manifest
	if err := sch.Recv(&have); err != nil {
		tb.Fatal(err)
	}
	want, err := Scan(srcDir)
	if err != nil {
		tb.Fatal(err)
	}
	d := Diff(have, want)
	if _, err := WriteDelta(sch, srcDir, d); err != nil {
		tb.Fatal(err)
	}
	if err := sch.CloseWrite(); err != nil {
		tb.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		tb.Fatal(r.err)
	}
	return d, r.st
}

// BenchmarkLargeTree measures a rootfs sync of 60,000 small files and a
// 200 MB file: the initial copy, then the frozen sync when nothing (or one
// file) changed since, in whole and in parts.
func BenchmarkLargeTree(b *testing.B) {
	const files, big = 60_000, 200 << 20
	src, dst := b.TempDir(), b.TempDir()
	start := time.Now()
	entries := largeTree(b, src, files, big)
	b.Logf("built %d entries in %v", entries, time.Since(start))
	srcSess, dstSess := pipeSessions(b)

	synced := false
	b.Run("initial-sync", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			if err := os.RemoveAll(dst); err != nil {
				b.Fatal(err)
			}
			if err := os.Mkdir(dst, 0o755); err != nil {
				b.Fatal(err)
			}
			sch, dch := channelPair(b, srcSess, dstSess, "rootfs")
			b.StartTimer()
			d, st := frozenSync(b, sch, dch, src, dst)
			if len(d.Changed) != entries || st.Files != files+1 {
				b.Fatalf("sent %d entries, %d files", len(d.Changed), st.Files)
			}
			sch.Close()
			dch.Close()
		}
		synced = true
	})
	if !synced { // the initial sync was filtered out (-bench)
		sch, dch := channelPair(b, srcSess, dstSess, "rootfs")
		frozenSync(b, sch, dch, src, dst)
		sch.Close()
		dch.Close()
	}
	// From here on dst holds what src holds.

	b.Run("frozen-sync-no-change", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			sch, dch := channelPair(b, srcSess, dstSess, "rootfs")
			b.StartTimer()
			if d, _ := frozenSync(b, sch, dch, src, dst); !d.Empty() {
				b.Fatalf("nothing changed, yet the delta holds %d changes, %d removals", len(d.Changed), len(d.Removed))
			}
			sch.Close()
			dch.Close()
		}
	})

	// What ferry's frozen sync does since the source keeps the manifest of
	// its live sync: only the source scans, nothing crosses but the delta.
	base, err := Scan(src)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("frozen-sync-as-live", func(b *testing.B) {
		for b.Loop() {
			want, err := Scan(src)
			if err != nil {
				b.Fatal(err)
			}
			d := Diff(base, want)
			if !d.Empty() {
				b.Fatalf("nothing changed, yet the delta holds %d changes", len(d.Changed))
			}
			if _, err := SendDelta(io.Discard, src, d, nil); err != nil {
				b.Fatal(err)
			}
		}
	})

	// The same with the tree watched since before the live sync's scan:
	// the frozen pass looks at what changed (here nothing, then one file
	// written while the container ran) instead of walking 60,000 entries.
	for _, changed := range []int{0, 1} {
		b.Run(fmt.Sprintf("frozen-sync-watched-changes=%d", changed), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				w, err := Watch(src)
				if err != nil {
					b.Fatal(err)
				}
				live, err := Scan(src)
				if err != nil {
					b.Fatal(err)
				}
				if changed > 0 {
					if err := os.WriteFile(filepath.Join(src, "p000/d00/f00009"), fmt.Appendf(nil, "watched %d\n", i), 0o644); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				c, st, err := w.Rescan(live, nil)
				if err != nil || st.Full != "" {
					b.Fatalf("rescan: %v (full walk: %q)", err, st.Full)
				}
				d := c.Delta()
				if len(d.Changed) != changed {
					b.Fatalf("%d changed, yet the delta holds %d changes", changed, len(d.Changed))
				}
				if _, err := SendDelta(io.Discard, src, d, nil); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				_ = w.Close()
				b.StartTimer()
			}
		})
	}

	one := filepath.Join(src, "p000/d00/f00007")
	b.Run("frozen-sync-one-change", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			if err := os.WriteFile(one, fmt.Appendf(nil, "version %d\n", i), 0o644); err != nil {
				b.Fatal(err)
			}
			sch, dch := channelPair(b, srcSess, dstSess, "rootfs")
			b.StartTimer()
			if d, st := frozenSync(b, sch, dch, src, dst); len(d.Changed) != 1 || st.Files != 1 {
				b.Fatalf("one file changed, yet the delta holds %d changes (%d files)", len(d.Changed), st.Files)
			}
			sch.Close()
			dch.Close()
		}
	})

	// The parts of a frozen sync.
	have, err := Scan(dst)
	if err != nil {
		b.Fatal(err)
	}
	wire, err := json.Marshal(have)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("manifest: %d entries, %d bytes of JSON", len(have), len(wire))
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			if _, err := Scan(dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("scan-walkers=%d", n), func(b *testing.B) {
			defer func(old int) { scanWorkers = old }(scanWorkers)
			scanWorkers = n
			for b.Loop() {
				if _, err := Scan(dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("manifest-marshal", func(b *testing.B) {
		b.SetBytes(int64(len(wire)))
		for b.Loop() {
			if _, err := json.Marshal(have); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("manifest-unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(wire)))
		for b.Loop() {
			var m Manifest
			if err := json.Unmarshal(wire, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("manifest-send-recv", func(b *testing.B) {
		// Send and Recv as the engine calls them: encoding, frames, decoding.
		sch, dch := channelPair(b, srcSess, dstSess, "rootfs")
		b.SetBytes(int64(len(wire)))
		for b.Loop() {
			errc := make(chan error, 1)
			go func() { errc <- dch.Send(have) }()
			var m Manifest
			if err := sch.Recv(&m); err != nil {
				b.Fatal(err)
			}
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("diff", func(b *testing.B) {
		for b.Loop() {
			if d := Diff(have, have); !d.Empty() {
				b.Fatal("a manifest differs from itself")
			}
		}
	})
	b.Run("empty-delta", func(b *testing.B) {
		for b.Loop() {
			r, w := io.Pipe()
			go func() {
				_, err := WriteDelta(w, src, Delta{})
				w.CloseWithError(err)
			}()
			if _, err := ApplyDelta(r, dst); err != nil {
				b.Fatal(err)
			}
		}
	})
}

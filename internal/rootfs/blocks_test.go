package rootfs

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// syncKnown syncs src to dst as the engine's passes do: the delta from
// what dst holds, the large files it holds from the last pass patched.
func syncKnown(t *testing.T, src, dst string, known Blocks) (Sent, Stats, error) {
	t.Helper()
	have, err := Scan(dst)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Scan(src)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	sent, err := SendDelta(&buf, src, Diff(have, want), known)
	if err != nil {
		t.Fatal(err)
	}
	st, err := ApplyDelta(&buf, dst)
	return sent, st, err
}

func dirs(t *testing.T) (src, dst string) {
	base := t.TempDir()
	src, dst = filepath.Join(base, "src"), filepath.Join(base, "dst")
	for _, d := range []string{src, dst} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return src, dst
}

// A large file changed in a few places travels as those blocks: a WAL
// segment written on, a table file grown, another shrunk.
func TestPatchSendsOnlyChangedBlocks(t *testing.T) {
	src, dst := dirs(t)
	wal := randomBytes(t, 4<<20)
	write(t, filepath.Join(src, "wal"), wal, 0o600)
	write(t, filepath.Join(src, "table"), randomBytes(t, 2<<20), 0o600)
	write(t, filepath.Join(src, "small"), []byte("small"), 0o644)
	if err := unix.Setxattr(filepath.Join(src, "wal"), "user.gone", []byte("1"), 0); err != nil {
		t.Skipf("SKIP (not a pass): no user xattrs here: %v", err)
	}
	first, _, err := syncKnown(t, src, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Blocks) != 2 || len(first.Blocks["wal"].Hashes) != 64 || first.Blocks["small"].Hashes != nil {
		t.Fatalf("first sync's blocks: %d files, wal %d blocks", len(first.Blocks), len(first.Blocks["wal"].Hashes))
	}
	// Two blocks of the WAL written over, 100 KB appended, its mode and
	// an attribute changed; the table cut to 1.5 MiB.
	copy(wal[1<<20:], randomBytes(t, 1000))
	copy(wal[3<<20+10:], randomBytes(t, 1000))
	wal = append(wal, randomBytes(t, 100<<10)...)
	write(t, filepath.Join(src, "wal"), wal, 0o640)
	if err := os.Truncate(filepath.Join(src, "table"), 3<<19); err != nil {
		t.Fatal(err)
	}
	if err := unix.Removexattr(filepath.Join(src, "wal"), "user.gone"); err != nil {
		t.Fatal(err)
	}
	second, st, err := syncKnown(t, src, dst, first.Blocks)
	if err != nil {
		t.Fatal(err)
	}
	// 2 blocks written over and the 100 KB appended (the table's cut
	// sends nothing), and a few headers.
	if st.Bytes != 2*blockSize+100<<10 || second.Bytes > 256<<10 {
		t.Errorf("the patch wrote %d bytes and sent %d", st.Bytes, second.Bytes)
	}
	sameTrees(t, src, dst)
	if n, _ := unix.Getxattr(filepath.Join(dst, "wal"), "user.gone", nil); n > 0 {
		t.Error("an attribute removed at the source stayed")
	}
	// The patched copy is known as patched: the next pass builds on it.
	copy(wal[10:], []byte("again"))
	write(t, filepath.Join(src, "wal"), wal, 0o640)
	third, st, err := syncKnown(t, src, dst, second.Blocks)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != blockSize {
		t.Errorf("one changed block: %d bytes written (%d sent)", st.Bytes, third.Bytes)
	}
	sameTrees(t, src, dst)
}

// A file mostly rewritten goes whole; a copy that is not as the last
// sync left it refuses the patch.
func TestPatchFallsBackAndChecks(t *testing.T) {
	src, dst := dirs(t)
	write(t, filepath.Join(src, "f"), randomBytes(t, 2<<20), 0o644)
	first, _, err := syncKnown(t, src, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "f"), randomBytes(t, 2<<20), 0o644)
	second, st, err := syncKnown(t, src, dst, first.Blocks)
	if err != nil || st.Bytes != 2<<20 {
		t.Fatalf("a rewritten file: %d bytes, %v; want it sent whole", st.Bytes, err)
	}
	sameTrees(t, src, dst)
	b, _ := os.ReadFile(filepath.Join(src, "f"))
	b[5] ^= 1
	write(t, filepath.Join(src, "f"), b, 0o644)
	write(t, filepath.Join(dst, "f"), append(b, 'x'), 0o644) // not what was sent
	if _, _, err := syncKnown(t, src, dst, second.Blocks); err == nil {
		t.Fatal("a patch applied to a copy it was not made for")
	}
	// A patch that grows a file must carry the new blocks.
	var tw bytes.Buffer
	w := tar.NewWriter(&tw)
	hdr := &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX,
		PAXRecords: map[string]string{patchKey: fmt.Sprintf("%d 0 %d", 2<<20, 3<<20)}}
	if err := w.WriteHeader(hdr); err != nil || w.Close() != nil {
		t.Fatal(err)
	}
	if _, err := ApplyDelta(&tw, dst); err == nil || !strings.Contains(err.Error(), "leaves block 32 out") {
		t.Errorf("a patch growing a file into a hole: %v", err)
	}
}

func TestParsePatch(t *testing.T) {
	if size, mt, ns, blocks, err := parsePatch("100 -5 200000 0,2"); err != nil || size != 100 || mt != -5 || ns != 200000 || len(blocks) != 2 {
		t.Errorf("good record: %d %d %d %v %v", size, mt, ns, blocks, err)
	}
	if _, _, _, blocks, err := parsePatch("100 5 100"); err != nil || blocks != nil {
		t.Errorf("a patch of no blocks: %v %v", blocks, err)
	}
	for _, bad := range []string{"", "1 2", "a 1 2", "1 2 -3", "-1 2 3", "1 2 100 0,0", "1 2 100 1", "1 2 200000 2,1", "1 2 3 x", "1 2 3 4 5"} {
		if _, _, _, _, err := parsePatch(bad); err == nil || !strings.Contains(err.Error(), "bad patch") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

package rootfs

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// fuzzSecret is unknowable to the fuzzer: finding it inside the root means
// a stream got something copied in from outside.
var fuzzSecret = func() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "secret-" + hex.EncodeToString(b)
}()

// FuzzApplyDelta feeds arbitrary streams to ApplyDelta over a root that
// holds symlinks leading out of it, and checks that nothing outside the
// root changed and nothing from outside was copied in. Seeds are in
// testdata/fuzz/FuzzApplyDelta.
func FuzzApplyDelta(f *testing.F) {
	f.Add(tarOf(f,
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
		&tar.Header{Name: "up/evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
	))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		// Runs before TempDir's removal: a stream may leave directories
		// that the owner cannot enter.
		t.Cleanup(func() { makeRemovable(base) })
		root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
		write(t, filepath.Join(outside, "secret"), []byte(fuzzSecret), 0o600)
		write(t, filepath.Join(root, "d/f"), []byte("inside"), 0o644)
		symlink(t, "../outside", filepath.Join(root, "up"))
		symlink(t, outside, filepath.Join(root, "abs"))
		symlink(t, "..", filepath.Join(root, "d/dotdot"))
		before := snapshot(t, base, root)

		ApplyDelta(bytes.NewReader(data), root) // errors are expected

		if after := snapshot(t, base, root); after != before {
			t.Fatalf("outside root changed:\n%s\n%s", before, after)
		}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(fuzzSecret)) {
				t.Fatalf("%s holds a copy of a file outside the root", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

func makeRemovable(dir string) {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
}

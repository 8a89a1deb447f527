package images

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSendReceiveDir(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "img")
	os.WriteFile(filepath.Join(src, "core-1.img"), []byte("core"), 0o600)
	os.WriteFile(filepath.Join(src, "pstree.img"), bytes.Repeat([]byte{7}, 100000), 0o600)
	os.WriteFile(filepath.Join(src, "dump.log"), []byte("log"), 0o600)
	os.Mkdir(filepath.Join(src, "sub"), 0o700)
	var buf bytes.Buffer
	n, err := SendDir(&buf, src, func(n string) bool { return strings.HasSuffix(n, ".log") })
	if err != nil || n != 100004 {
		t.Fatalf("sent %d, %v", n, err)
	}
	if _, err := ReceiveDir(&buf, dst); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dst, "pstree.img"))
	if len(got) != 100000 {
		t.Fatalf("pstree.img has %d bytes", len(got))
	}
	if _, err := os.Stat(filepath.Join(dst, "dump.log")); err == nil {
		t.Fatal("skipped file was sent")
	}
}

func TestReceiveDirRefusesPaths(t *testing.T) {
	for _, name := range []string{"../evil", "/etc/passwd", "a/b", ".."} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte("x"))
		tw.Close()
		if _, err := ReceiveDir(&buf, t.TempDir()); err == nil {
			t.Errorf("entry %q accepted", name)
		}
	}
}

// FuzzReceiveDir feeds arbitrary bytes to the receiving side of an images
// transfer: it must never panic nor write outside its directory.
func FuzzReceiveDir(f *testing.F) {
	var ok bytes.Buffer
	src := f.TempDir()
	os.WriteFile(filepath.Join(src, "core-1.img"), []byte("core"), 0o600)
	SendDir(&ok, src, nil)
	f.Add(ok.Bytes())
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escape", Mode: 0o600, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	f.Add(evil.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "img")
		ReceiveDir(bytes.NewReader(b), dir)
		ents, _ := os.ReadDir(parent)
		for _, e := range ents {
			if e.Name() != "img" {
				t.Fatalf("wrote %q outside the images directory", e.Name())
			}
		}
	})
}

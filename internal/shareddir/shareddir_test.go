package shareddir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// One directory is itself whatever is written in it; a copy beside it,
// a missing path and a file are not.
func TestCheck(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	id, err := Identity(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "new"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Check(Dir{Source: a, Path: "/data", Identity: id}); err != nil {
		t.Errorf("the same directory, written to since: %v", err)
	}
	// b at a's path: the same path names another directory.
	if err := os.Rename(a, filepath.Join(root, "old-a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(b, a); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d    Dir
		want string
	}{
		{Dir{Source: a, Path: "/data", Identity: id}, "another directory than the source's"},
		{Dir{Source: a, Path: "/data"}, "another directory"},
		{Dir{Source: filepath.Join(root, "none"), Path: "/data", Identity: id}, "no such directory on this host"},
	} {
		if err := Check(c.d); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.d, err, c.want)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Identity(filepath.Join(root, "f")); err == nil {
		t.Error("a file has an identity")
	}
}

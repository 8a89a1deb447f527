package tail

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLines(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"  a\nb  \n\n", 5, "a\nb"},
		{"", 3, ""},
		{"one", 1, "one"},
	} {
		if got := Lines(c.s, c.n); got != c.want {
			t.Errorf("Lines(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
	p := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(p, []byte("1\n2\n3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := File(p, 2); got != "2\n3" {
		t.Errorf("File: %q", got)
	}
	if got := File(filepath.Join(t.TempDir(), "none"), 2); got != "" {
		t.Errorf("a missing file: %q", got)
	}
}

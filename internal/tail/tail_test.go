package tail

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// Run's error names the program and quotes the end of what it said; its
// output also goes to the log.
func TestRun(t *testing.T) {
	var log strings.Builder
	err := Run(exec.Command("sh", "-c", "echo one; echo two; echo three >&2; exit 3"), &log, 2)
	if err == nil || !strings.HasPrefix(err.Error(), "sh: exit status 3:\n") || !strings.HasSuffix(err.Error(), "\ntwo\nthree") || strings.Contains(err.Error(), "one") {
		t.Errorf("error %q", err)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("the exit status is not wrapped: %v", err)
	}
	if log.String() != "one\ntwo\nthree\n" {
		t.Errorf("log %q", log.String())
	}
	if err := Run(exec.Command("true"), nil, 2); err != nil {
		t.Error(err)
	}
}

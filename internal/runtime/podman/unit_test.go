package podman

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestQualify(t *testing.T) {
	for in, want := range map[string]string{
		"ferry-ptest":                "localhost/ferry-ptest:latest",
		"ferry-ptest:v1":             "localhost/ferry-ptest:v1",
		"localhost/ferry":            "localhost/ferry:latest",
		"lab/ferry:2":                "localhost/lab/ferry:2",
		"quay.io/x/y":                "quay.io/x/y:latest",
		"localhost:5000/ferry":       "localhost:5000/ferry:latest",
		"localhost:5000/ferry:v2":    "localhost:5000/ferry:v2",
		"docker.io/library/busybox":  "docker.io/library/busybox:latest",
		"localhost/ferry-ptest:last": "localhost/ferry-ptest:last",
	} {
		if got := qualify(in); got != want {
			t.Errorf("qualify(%q) = %q, want %q", in, got, want)
		}
	}
}

// Discard tries again while Podman's record of a dying copy lags the
// runtime's, and gives up at once on any other error. A podman that
// answers from a script stands in for Podman's two states.
func TestDiscardRetriesAStaleState(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	// Fails with stderr $FAIL until the FAILS-th call, then succeeds.
	script := `#!/bin/sh
n=$(($(cat ` + calls + ` 2>/dev/null || echo 0) + 1))
echo $n > ` + calls + `
if [ "$n" -le "$FAILS" ]; then echo "$FAIL" >&2; exit 2; fi
`
	if err := os.WriteFile(filepath.Join(dir, "podman"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	tg := &target{r: &Runtime{}, name: "c", id: "abc"}
	for _, c := range []struct {
		fail      string
		fails     int
		wantErr   bool
		wantCalls string
	}{
		{"", 0, false, "1"},
		{`Error: container state improper: stopped`, 2, false, "3"},
		{`level=error msg="container not running"`, 1, false, "2"},
		{`Error: no such container`, 1, true, "1"},                  // not a lag: no retry
		{`Error: container state improper: stopped`, 99, true, "5"}, // bounded
	} {
		_ = os.Remove(calls)
		t.Setenv("FAIL", c.fail)
		t.Setenv("FAILS", strconv.Itoa(c.fails))
		err := tg.Discard(context.Background())
		if (err != nil) != c.wantErr {
			t.Errorf("%q x%d: %v", c.fail, c.fails, err)
		}
		if b, _ := os.ReadFile(calls); strings.TrimSpace(string(b)) != c.wantCalls {
			t.Errorf("%q x%d: podman ran %s times, want %s", c.fail, c.fails, b, c.wantCalls)
		}
	}
}

package engine

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestKeepLogs(t *testing.T) {
	work, dir := t.TempDir(), t.TempDir()
	if got, err := keepLogs(work, dir, "none"); got != "" || err != nil {
		t.Fatalf("no logs: %q %v", got, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(work, "images"), 0o700))
	must(os.WriteFile(filepath.Join(work, "dump.log"), []byte("Error (criu/cr-dump.c:1): Can't get rlimit 0\n"), 0o600))
	big := bytes.Repeat([]byte("x"), keptLogFile+100)
	big = append(big, "the end\n"...)
	must(os.WriteFile(filepath.Join(work, "images", "restore.log"), big, 0o600))
	must(os.WriteFile(filepath.Join(work, "images", "pages-1.img"), big, 0o600))

	got, err := keepLogs(work, dir, "m1")
	if err != nil || got != filepath.Join(dir, "m1") {
		t.Fatalf("keepLogs: %q %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(got, "dump.log")); err != nil || !bytes.Contains(b, []byte("rlimit 0")) {
		t.Errorf("dump.log: %q %v", b, err)
	}
	b, err := os.ReadFile(filepath.Join(got, "images_restore.log"))
	if err != nil || len(b) != keptLogFile || !bytes.HasSuffix(b, []byte("the end\n")) {
		t.Errorf("restore.log kept %d bytes (%v), want its last %d", len(b), err, keptLogFile)
	}
	if _, err := os.Stat(filepath.Join(got, "images_pages-1.img")); err == nil {
		t.Error("an image was kept")
	}

	// Only the newest keptLogDirs migrations stay.
	older := time.Now().Add(-200 * time.Minute)
	must(os.Chtimes(got, older, older))
	for i := 0; i < keptLogDirs+3; i++ {
		id := fmt.Sprintf("n%02d", i)
		if _, err := keepLogs(work, dir, id); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(time.Duration(i-100) * time.Minute)
		must(os.Chtimes(filepath.Join(dir, id), old, old))
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != keptLogDirs {
		t.Fatalf("%d kept, want %d", len(ents), keptLogDirs)
	}
	for _, gone := range []string{"m1", "n00", "n01"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s kept, older than the newest %d", gone, keptLogDirs)
		}
	}
}

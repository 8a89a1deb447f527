package filelock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A second holder waits for the first, and gives up when its context
// ends.
func TestLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := Lock(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Lock(ctx, path); err == nil {
		t.Fatal("a second Lock got the lock while the first held it")
	}
	got := make(chan error, 1)
	go func() {
		u, err := Lock(context.Background(), path)
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Lock did not get the lock once it was released")
	}
}

// Build makes the file once however many ask at once, removes what a
// killed build left, and leaves nothing when its build fails.
func TestBuild(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "root.tar")
	stale := filepath.Join(dir, ".build-root.tar-123")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(context.Background(), target, func(string) (string, error) { return "", errors.New("no mirror") }); err == nil {
		t.Fatal("a failed build succeeded")
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("a failed build left %s: %v", target, err)
	}
	var calls atomic.Int32
	var wg sync.WaitGroup
	built := make([]bool, 4)
	for i := range built {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := Build(context.Background(), target, func(tmp string) (string, error) {
				calls.Add(1)
				time.Sleep(50 * time.Millisecond)
				out := filepath.Join(tmp, "out")
				return out, os.WriteFile(out, []byte("root"), 0o600)
			})
			if err != nil {
				t.Error(err)
			}
			built[i] = b
		}()
	}
	wg.Wait()
	reported := 0
	for _, b := range built {
		if b {
			reported++
		}
	}
	if n := calls.Load(); n != 1 || reported != 1 {
		t.Fatalf("built %d times (reported %v), want once", n, built)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "root" {
		t.Fatalf("target: %q %v", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".build-*")); len(left) != 0 {
		t.Fatalf("builds left behind: %v", left)
	}
}

package filelock

import (
	"context"
	"path/filepath"
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

// Package filelock serializes processes that build one cached thing (a
// root filesystem, an unpacked image) with an flock on a file beside it;
// Build makes such a cached file once.
package filelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/mounts"
)

// Lock takes an exclusive flock on path (created if missing), waiting
// while another process holds it, until ctx ends. The returned function
// releases it; the kernel does too when the process dies.
func Lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another holder of %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CacheDir is the directory of setup.sh's caches named name:
// $FERRY_CACHE/name, by default /var/cache/ferry/name.
func CacheDir(name string) string {
	base := os.Getenv("FERRY_CACHE")
	if base == "" {
		base = "/var/cache/ferry"
	}
	return filepath.Join(base, name)
}

// Build makes the cached file target once: if it is not there, build
// writes it in a fresh directory beside it and returns its path there,
// which is renamed to target, so that a reader never sees half of it.
// Concurrent builders (other processes too) wait on target's lock and
// find it built; what a killed build left is removed first (mounts
// detached). It reports whether this call built it.
func Build(ctx context.Context, target string, build func(tmp string) (string, error)) (bool, error) {
	if st, err := os.Stat(target); err == nil && st.Mode().IsRegular() {
		return false, nil
	}
	dir, name := filepath.Dir(target), filepath.Base(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	unlock, err := Lock(ctx, target+".lock")
	if err != nil {
		return false, err
	}
	defer unlock()
	if _, err := os.Stat(target); err == nil {
		return false, nil // built by whoever held the lock before us
	}
	// We hold the lock: no build of this file runs.
	stale, _ := filepath.Glob(filepath.Join(dir, ".build-"+name+"-*"))
	for _, s := range stale {
		if err := mounts.RemoveAll(s); err != nil {
			return false, fmt.Errorf("remove the leftover build %s: %w", s, err)
		}
	}
	tmp, err := os.MkdirTemp(dir, ".build-"+name+"-")
	if err != nil {
		return false, err
	}
	defer func() { _ = mounts.RemoveAll(tmp) }()
	out, err := build(tmp)
	if err != nil {
		return false, err
	}
	if err := os.Chmod(out, 0o644); err != nil {
		return false, err
	}
	return true, os.Rename(out, target)
}

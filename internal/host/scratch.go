package host

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// SecureWorkRoot makes the scratch root (CRIU's images and the daemons'
// sockets live there) this process's alone before anything is put in it:
// created 0700 where missing, its mode narrowed where it is ours, and
// refused where someone else made it, or could swap a directory on its
// path (a local user who makes /dev/shm/ferry first would otherwise read
// and write every migration's images).
func (c Config) SecureWorkRoot() error {
	if err := secureDir(c.WorkRoot()); err != nil {
		return err
	}
	return secureDir(c.RescueDir())
}

func secureDir(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	euid := uint32(os.Geteuid())
	// Every directory above must be ours (or root's), or sticky where
	// others may write (/tmp, /dev/shm): else its owner could rename ours
	// away and put theirs in its place.
	parts := strings.Split(strings.TrimPrefix(filepath.Dir(dir), "/"), "/")
	p := "/"
	for _, part := range parts {
		p = filepath.Join(p, part)
		st, err := lstat(p)
		if os.IsNotExist(err) {
			if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if st.Uid != 0 && st.Uid != euid {
			return fmt.Errorf("scratch directory %s: %s belongs to uid %d, who could replace what ferry keeps below it", dir, p, st.Uid)
		}
		if st.Mode&0o022 != 0 && st.Mode&syscall.S_ISVTX == 0 && st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return fmt.Errorf("scratch directory %s: anyone may rename entries of %s (mode %o, not sticky)", dir, p, st.Mode&0o7777)
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	st, err := lstat(dir)
	if err != nil {
		return err
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
		return fmt.Errorf("scratch directory %s is not a directory (a link?): remove it", dir)
	case st.Uid != euid:
		return fmt.Errorf("scratch directory %s belongs to uid %d, not this agent's %d: someone else made it first; remove it", dir, st.Uid, euid)
	case st.Mode&0o077 != 0:
		return os.Chmod(dir, 0o700)
	}
	return nil
}

func lstat(p string) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: p, Err: err}
	}
	return &st, nil
}

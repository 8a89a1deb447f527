// Package shareddir tells whether a directory at the destination is the
// same storage as the source's directory of that path: a bind mount of a
// host directory is never copied with its container (it is the host's,
// not the container's), so it can only follow where the destination
// mounts the same storage there (a network filesystem, a cluster
// filesystem, one host).
package shareddir

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/api"
)

// Dir is a directory of a host's that a container bind-mounts; its
// Identity is Identity(Source) at the source host.
type Dir = api.SharedDir

// Identity names the storage a directory is: its filesystem's type and
// ID and the directory's inode. The same storage mounted at two hosts
// gives the same (a network filesystem reports the server's numbers);
// a copy, even a faithful one, gives another. It does not change while
// files inside are written, created or removed.
func Identity(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return "", err
	}
	return fmt.Sprintf("%x:%x.%x:%d", fs.Type, uint32(fs.Fsid.Val[0]), uint32(fs.Fsid.Val[1]), st.Ino), nil
}

// Identify fills each of dirs' Identity at the source, for the
// destination's Check.
func Identify(dirs []Dir) error {
	for i, d := range dirs {
		id, err := Identity(d.Source)
		if err != nil {
			return fmt.Errorf("bind mount %s (at %s in the container): %w: ferry remounts host directories of storage the destination shares, and copies none", d.Source, d.Path, err)
		}
		dirs[i].Identity = id
	}
	return nil
}

// Check says whether d, as the source found it, is the same storage here:
// an error says what is missing or different, and what to do.
func Check(d Dir) error {
	id, err := Identity(d.Source)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("bind mount %s (at %s in the container): no such directory on this host; ferry does not copy a host's directory: mount the same storage here, or use a volume", d.Source, d.Path)
	}
	if err != nil {
		return fmt.Errorf("bind mount %s (at %s in the container): %w", d.Source, d.Path, err)
	}
	if d.Identity == "" || id != d.Identity {
		return fmt.Errorf("bind mount %s (at %s in the container): this host's %s is another directory than the source's (storage %s here, %s there); ferry does not copy a host's directory: mount the same storage here, or use a volume",
			d.Source, d.Path, d.Source, id, d.Identity)
	}
	return nil
}

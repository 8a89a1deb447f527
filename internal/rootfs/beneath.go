package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnsafePath is wrapped by errors for paths that are malformed, absolute,
// climb with "..", or lead through a symlink or non-directory.
var ErrUnsafePath = errors.New("unsafe path")

const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

func openat(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// cleanPath checks a slash path taken from a stream or manifest: relative,
// already clean, not the root itself, no "..". A trailing slash (tar's mark
// for directories) is dropped.
func cleanPath(p string) (string, error) {
	if len(p) > 1 && strings.HasSuffix(p, "/") {
		p = p[:len(p)-1]
	}
	if p == "" || p == "." || p == ".." || strings.HasPrefix(p, "/") ||
		strings.HasPrefix(p, "../") || strings.ContainsRune(p, 0) || path.Clean(p) != p {
		return "", fmt.Errorf("rootfs: %q: %w", p, ErrUnsafePath)
	}
	return p, nil
}

// split returns the parent directory (possibly ".") and last component.
func split(p string) (string, string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ".", p
	}
	return p[:i], p[i+1:]
}

// beneath resolves directories under an open root one component at a time,
// never through a symlink, so neither a crafted stream nor a tree changing
// underneath can steer an operation outside the root. The last directory
// opened stays cached, since streams are ordered so that one directory's
// entries come together.
type beneath struct {
	root int
	dev  uint64
	dir  string
	fd   int // descriptor for dir, -1 when nothing is cached
}

func openBeneath(root string) (*beneath, error) {
	fd, err := openat(unix.AT_FDCWD, root, dirFlags)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fstat", Path: root, Err: err}
	}
	return &beneath{root: fd, dev: st.Dev, fd: -1}, nil
}

func (b *beneath) close() {
	b.drop()
	unix.Close(b.root)
}

func (b *beneath) drop() {
	if b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
	}
}

// forget drops the cached descriptor if p is that directory or above it,
// because p is about to be replaced or removed.
func (b *beneath) forget(p string) {
	if b.fd >= 0 && (b.dir == p || strings.HasPrefix(b.dir, p+"/")) {
		b.drop()
	}
}

// openDir returns a descriptor for directory rel ("." for the root). The
// descriptor is borrowed: it stays valid until the next call on b.
// A component that is a symlink or not a directory gives ErrUnsafePath; a
// missing one an error matching fs.ErrNotExist.
func (b *beneath) openDir(rel string) (int, error) {
	if rel == "." {
		return b.root, nil
	}
	if b.fd >= 0 && b.dir == rel {
		return b.fd, nil
	}
	var fd int
	var err error
	if b.fd >= 0 && strings.HasPrefix(rel, b.dir+"/") {
		fd, err = b.walkFrom(b.fd, rel, rel[len(b.dir)+1:])
	} else {
		fd, err = b.walkFrom(b.root, rel, rel)
	}
	if err != nil {
		return -1, err
	}
	b.drop()
	b.dir, b.fd = rel, fd
	return fd, nil
}

// walk is openDir without the cache: the caller closes the descriptor
// unless it is b.root.
func (b *beneath) walk(rel string) (int, error) {
	if rel == "." {
		return b.root, nil
	}
	return b.walkFrom(b.root, rel, rel)
}

// walkFrom opens the directories of rest one by one from start and returns
// a new descriptor for the last.
func (b *beneath) walkFrom(start int, rel, rest string) (int, error) {
	fd, owned := start, false
	for rest != "" {
		c := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			c, rest = rest[:i], rest[i+1:]
		} else {
			rest = ""
		}
		nfd, err := openat(fd, c, dirFlags)
		if owned {
			unix.Close(fd)
		}
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, fmt.Errorf("rootfs: %q: through a symlink or non-directory: %w", rel, ErrUnsafePath)
			}
			return -1, &fs.PathError{Op: "open", Path: rel, Err: err}
		}
		fd, owned = nfd, true
	}
	return fd, nil
}

// removeAt deletes name in dirfd: a file, or a directory with everything
// in it. It never follows a symlink and refuses to empty another filesystem
// mounted below.
func removeAt(dirfd int, name string, dev uint64) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	var st unix.Stat_t
	if serr := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return err
	}
	err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
	if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return err
	}
	fd, err := openat(dirfd, name, dirFlags)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Dev != dev {
		return fmt.Errorf("rootfs: %s is another filesystem's mount point", name)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n, dev); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// xattrPrefix marks extended attributes among PAX records (GNU tar and
// others use the same key).
const xattrPrefix = "SCHILY.xattr."

// readXattrs returns the extended attributes of an open file as PAX records.
func readXattrs(fd int, into map[string]string) error {
	size, err := unix.Flistxattr(fd, nil)
	if err != nil || size == 0 {
		if err == unix.ENOTSUP || err == unix.EOPNOTSUPP {
			err = nil
		}
		return err
	}
	list := make([]byte, size)
	n, err := unix.Flistxattr(fd, list)
	if err != nil {
		return err
	}
	for _, name := range strings.Split(string(list[:n]), "\x00") {
		if name == "" {
			continue
		}
		vsize, err := unix.Fgetxattr(fd, name, nil)
		if err == unix.ENODATA {
			continue
		}
		if err != nil {
			return fmt.Errorf("getxattr %s: %w", name, err)
		}
		val := make([]byte, vsize)
		vn, err := unix.Fgetxattr(fd, name, val)
		if err != nil {
			return fmt.Errorf("getxattr %s: %w", name, err)
		}
		into[xattrPrefix+name] = string(val[:vn])
	}
	return nil
}

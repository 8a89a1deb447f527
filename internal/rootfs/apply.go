package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Stats counts what ApplyDelta did.
type Stats struct {
	Files   int   // non-directories created or replaced
	Dirs    int   // directories created or updated
	Removed int   // paths removed
	Bytes   int64 // file content written
}

// ApplyDelta applies a stream written by WriteDelta to root. Every path is
// resolved beneath root without following symlinks: absolute names, "..",
// and paths leading through a symlink are refused with an error wrapping
// ErrUnsafePath, as are hard links whose target is unsafe. Non-directories
// are written under a temporary name and renamed into place; hard links
// become copies. Owners are set when running as root, modes after owners (so
// set-id bits survive), and directories' mode and mtime once everything
// inside them is written. Directories that change only because entries in
// them do keep their previous mtime.
func ApplyDelta(r io.Reader, root string) (Stats, error) {
	b, err := openBeneath(root)
	if err != nil {
		return Stats{}, err
	}
	defer b.close()
	a := applier{
		b:    b,
		tr:   tar.NewReader(r),
		fix:  map[string]*dirFix{},
		buf:  make([]byte, copyBufSize),
		root: os.Geteuid() == 0,
		pid:  os.Getpid(),
	}
	for {
		hdr, err := a.tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return a.stats, fmt.Errorf("rootfs: read delta: %w", err)
		}
		if err := a.entry(hdr); err != nil {
			return a.stats, err
		}
	}
	return a.stats, a.fixDirs()
}

type applier struct {
	b     *beneath
	tr    *tar.Reader
	stats Stats
	// fix holds, per directory touched, the mode and mtime to give it at the
	// end: from the stream, or its mtime from before it was touched.
	fix  map[string]*dirFix
	buf  []byte
	root bool
	pid  int
	seq  int
}

type dirFix struct {
	mode    uint32
	setMode bool
	mtime   unix.Timespec
}

func (a *applier) entry(hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	p, err := cleanPath(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.PAXRecords[removedKey] != "" {
		return a.remove(p)
	}
	if hdr.Typeflag == tar.TypeGNUSparse {
		return fmt.Errorf("rootfs: %s: sparse entries are not supported", p)
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return fmt.Errorf("rootfs: %s: sparse entries are not supported", p)
		}
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= math.MaxUint32 || hdr.Gid >= math.MaxUint32 {
		return fmt.Errorf("rootfs: %s: owner %d:%d out of range", p, hdr.Uid, hdr.Gid)
	}
	dir, name := split(p)
	a.b.forget(p)
	dfd, err := a.b.openDir(dir)
	if err != nil {
		return err
	}
	if err := a.touch(dir, dfd); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeDir {
		return a.mkdir(dfd, p, name, hdr)
	}
	if _, ok := hdr.PAXRecords[patchKey]; ok && hdr.Typeflag == tar.TypeReg {
		return a.patch(dfd, p, name, hdr)
	}
	return a.node(dfd, p, name, hdr)
}

// touch records dir's mtime before the first change inside it, unless the
// stream already says what it should be.
func (a *applier) touch(dir string, fd int) error {
	if _, ok := a.fix[dir]; ok {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: dir, Err: err}
	}
	a.fix[dir] = &dirFix{mtime: st.Mtim}
	return nil
}

func (a *applier) remove(p string) error {
	dir, name := split(p)
	a.b.forget(p)
	dfd, err := a.b.openDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // already gone with its parent
	}
	if err != nil {
		return err
	}
	if err := a.touch(dir, dfd); err != nil {
		return err
	}
	switch err := removeAt(dfd, name, a.b.dev); {
	case err == nil:
		a.stats.Removed++
	case errors.Is(err, unix.ENOENT):
	default:
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	return nil
}

func (a *applier) mkdir(dfd int, p, name string, hdr *tar.Header) error {
	var st unix.Stat_t
	err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(dfd, name, 0); err != nil {
			return &fs.PathError{Op: "remove", Path: p, Err: err}
		}
		err = unix.ENOENT
	}
	if errors.Is(err, unix.ENOENT) {
		// Owner-only until the end, when the real mode is set.
		err = unix.Mkdirat(dfd, name, 0o700)
	}
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: p, Err: err}
	}
	fd, err := openat(dfd, name, dirFlags)
	if err != nil {
		return &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	if err := a.chown(unix.Fchown(fd, hdr.Uid, hdr.Gid)); err != nil {
		return &fs.PathError{Op: "chown", Path: p, Err: err}
	}
	if err := a.setXattrs(fd, hdr); err != nil {
		return fmt.Errorf("rootfs: %s: %w", p, err)
	}
	a.fix[p] = &dirFix{mode: uint32(hdr.Mode & 0o7777), setMode: true, mtime: unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	a.stats.Dirs++
	return nil
}

// node creates a non-directory under a temporary name, gives it its owner,
// mode and mtime, and renames it over whatever is at the path.
func (a *applier) node(dfd int, p, name string, hdr *tar.Header) error {
	tmp, err := a.create(dfd, p, hdr)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := removeAt(dfd, name, a.b.dev); err != nil {
			unix.Unlinkat(dfd, tmp, 0)
			return &fs.PathError{Op: "remove", Path: p, Err: err}
		}
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return &fs.PathError{Op: "rename", Path: p, Err: err}
	}
	a.stats.Files++
	return nil
}

func (a *applier) tmpName() string {
	a.seq++
	return ".ferry-tmp." + strconv.Itoa(a.pid) + "." + strconv.Itoa(a.seq)
}

// create makes the object for hdr under a fresh temporary name in dfd and
// returns that name. On error nothing is left behind.
func (a *applier) create(dfd int, p string, hdr *tar.Header) (tmp string, err error) {
	perm := uint32(hdr.Mode & 0o7777)
	var mknodMode uint32
	var dev int
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeLink:
		return a.createFile(dfd, p, hdr)
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return "", fmt.Errorf("rootfs: %s: bad symlink target", p)
		}
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Devmajor < 0 || hdr.Devminor < 0 || hdr.Devmajor > math.MaxUint32 || hdr.Devminor > math.MaxUint32 {
			return "", fmt.Errorf("rootfs: %s: bad device number", p)
		}
		mknodMode = unix.S_IFBLK
		if hdr.Typeflag == tar.TypeChar {
			mknodMode = unix.S_IFCHR
		}
		dev = int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
	case tar.TypeFifo:
		mknodMode = unix.S_IFIFO
		if hdr.PAXRecords[typeKey] == typeSocket {
			mknodMode = unix.S_IFSOCK
		}
	default:
		return "", fmt.Errorf("rootfs: %s: unsupported entry type %q", p, hdr.Typeflag)
	}
	for {
		tmp = a.tmpName()
		if hdr.Typeflag == tar.TypeSymlink {
			err = unix.Symlinkat(hdr.Linkname, dfd, tmp)
		} else {
			err = unix.Mknodat(dfd, tmp, mknodMode|perm, dev)
		}
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return "", &fs.PathError{Op: "create", Path: p, Err: err}
	}
	defer func() {
		if err != nil {
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if err := a.chown(unix.Fchownat(dfd, tmp, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)); err != nil {
		return "", &fs.PathError{Op: "chown", Path: p, Err: err}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// tmp is the node just made here, not a symlink, so following is moot.
		if err := unix.Fchmodat(dfd, tmp, perm, 0); err != nil {
			return "", &fs.PathError{Op: "chmod", Path: p, Err: err}
		}
	}
	if err := a.setMtime(dfd, tmp, hdr); err != nil {
		return "", &fs.PathError{Op: "utimes", Path: p, Err: err}
	}
	return tmp, nil
}

// createFile writes a regular file's content (or, for a hard link, a copy of
// its target's) to a temporary file.
func (a *applier) createFile(dfd int, p string, hdr *tar.Header) (tmp string, err error) {
	src := io.Reader(a.tr)
	size := hdr.Size
	if hdr.Typeflag == tar.TypeLink {
		f, err := a.openLinkTarget(hdr.Linkname)
		if err != nil {
			return "", fmt.Errorf("rootfs: %s: hard link: %w", p, err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return "", err
		}
		src, size = f, fi.Size()
	}
	var fd int
	for {
		tmp = a.tmpName()
		fd, err = openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return "", &fs.PathError{Op: "create", Path: p, Err: err}
	}
	// Created with mode 0, so nothing can open it before its mode is set.
	defer func() {
		if err != nil {
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	n, err := io.CopyBuffer(onlyWriter{f}, io.LimitReader(src, size), a.buf)
	a.stats.Bytes += n
	if err != nil {
		return "", fmt.Errorf("rootfs: write %s: %w", p, err)
	}
	if n != size {
		return "", fmt.Errorf("rootfs: write %s: %w", p, io.ErrUnexpectedEOF)
	}
	// Owner before mode: chown clears set-id bits. Attributes after both,
	// since chown drops file capabilities too.
	if err := a.chown(unix.Fchown(fd, hdr.Uid, hdr.Gid)); err != nil {
		return "", &fs.PathError{Op: "chown", Path: p, Err: err}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return "", &fs.PathError{Op: "chmod", Path: p, Err: err}
	}
	if err := a.setXattrs(fd, hdr); err != nil {
		return "", fmt.Errorf("rootfs: %s: %w", p, err)
	}
	if err := a.setMtime(dfd, tmp, hdr); err != nil {
		return "", &fs.PathError{Op: "utimes", Path: p, Err: err}
	}
	return tmp, nil
}

// onlyWriter hides os.File's ReadFrom so the copy uses our buffer.
type onlyWriter struct{ io.Writer }

// openLinkTarget opens a hard link's target, which must be a regular file
// beneath the root. It is checked before opening, so opening never touches a
// device or blocks on a fifo.
func (a *applier) openLinkTarget(name string) (*os.File, error) {
	p, err := cleanPath(name)
	if err != nil {
		return nil, err
	}
	dir, base := split(p)
	// A walk of its own: the cached descriptor is the caller's parent.
	dfd, err := a.b.walk(dir)
	if err != nil {
		return nil, err
	}
	if dfd != a.b.root {
		defer unix.Close(dfd)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	fd, err := openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	return os.NewFile(uintptr(fd), p), nil
}

// chown filters an ownership error: without root, files keep our owner.
func (a *applier) chown(err error) error {
	if errors.Is(err, unix.EPERM) && !a.root {
		return nil
	}
	return err
}

func (a *applier) setMtime(dfd int, name string, hdr *tar.Header) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	return unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func (a *applier) setXattrs(fd int, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok {
			continue
		}
		err := unix.Fsetxattr(fd, name, []byte(v), 0)
		switch {
		case err == nil, err == unix.ENOTSUP, err == unix.EOPNOTSUPP:
		case err == unix.EPERM && !a.root:
		default:
			return fmt.Errorf("setxattr %s: %w", name, err)
		}
	}
	return nil
}

// fixDirs gives every directory touched its final mode and mtime, now that
// nothing more is written inside.
func (a *applier) fixDirs() error {
	dirs := make([]string, 0, len(a.fix))
	for d := range a.fix {
		dirs = append(dirs, d)
	}
	slices.SortFunc(dirs, comparePaths)
	for _, p := range dirs {
		fx := a.fix[p]
		dfd, name := a.b.root, "."
		if p != "." {
			var dir string
			dir, name = split(p)
			var err error
			if dfd, err = a.b.openDir(dir); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue // removed after it was touched
				}
				return err
			}
		}
		fd, err := openat(dfd, name, dirFlags)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				continue // removed or replaced after it was touched
			}
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		if fx.setMode {
			err = unix.Fchmod(fd, fx.mode)
		}
		unix.Close(fd)
		if err != nil {
			return &fs.PathError{Op: "chmod", Path: p, Err: err}
		}
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, fx.mtime}
		if err := unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &fs.PathError{Op: "utimes", Path: p, Err: err}
		}
	}
	return nil
}

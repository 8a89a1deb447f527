package rootfs

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"golang.org/x/sys/unix"
)

// PAX records of ferry's own. A removal travels as an empty regular file
// carrying removedKey; a socket as a fifo carrying typeKey=socket.
const (
	removedKey  = "FERRY.removed"
	typeKey     = "FERRY.type"
	typeSocket  = "socket"
	copyBufSize = 256 << 10
)

// WriteDelta streams d as a tar: first the removals, then the changed
// entries with their contents read from root. Every entry is stat'ed again
// while it is written, so the stream carries its state at that moment;
// entries that vanished since the scan are left out (the next sync sees
// them). It returns the number of bytes written to w.
func WriteDelta(w io.Writer, root string, d Delta) (int64, error) {
	st, err := SendDelta(w, root, d, nil)
	return st.Bytes, err
}

// Sent is what SendDelta wrote.
type Sent struct {
	Bytes int64
	// Skipped lists the changed entries left out because they vanished
	// (or became unsafe) since the scan: the receiver still has its own
	// version of each, or none.
	Skipped []string
	// Blocks are the large files sent, as the receiver now holds them:
	// the next sync's known.
	Blocks Blocks
}

// SendDelta is WriteDelta, also saying which entries it left out. known
// are the large files as the receiver holds them from the previous sync
// (its copy exactly as that sync left it; nil: none): a changed one
// travels as a patch of its changed blocks (blocks.go).
func SendDelta(w io.Writer, root string, d Delta, known Blocks) (Sent, error) {
	cw := &countWriter{w: w}
	bw := bufio.NewWriterSize(cw, copyBufSize)
	tw := tar.NewWriter(bw)
	b, err := openBeneath(root)
	if err != nil {
		return Sent{}, err
	}
	defer b.close()
	s := sender{b: b, tw: tw, buf: make([]byte, copyBufSize), known: known, blocks: Blocks{}}
	for _, p := range d.Removed {
		if err := s.removal(p); err != nil {
			return Sent{Bytes: cw.n, Skipped: s.skipped, Blocks: s.blocks}, err
		}
	}
	for _, e := range d.Changed {
		if err := s.entry(e.Path); err != nil {
			return Sent{Bytes: cw.n, Skipped: s.skipped, Blocks: s.blocks}, err
		}
	}
	if err := tw.Close(); err != nil {
		return Sent{Bytes: cw.n, Skipped: s.skipped, Blocks: s.blocks}, err
	}
	err = bw.Flush()
	return Sent{Bytes: cw.n, Skipped: s.skipped, Blocks: s.blocks}, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type sender struct {
	b       *beneath
	tw      *tar.Writer
	buf     []byte
	skipped []string
	// known are the receiver's large files from the previous sync, blocks
	// what this one leaves it with.
	known, blocks Blocks
}

// skip records an entry left out of the stream.
func (s *sender) skip(p string) error {
	s.skipped = append(s.skipped, p)
	return nil
}

func (s *sender) removal(p string) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	return s.tw.WriteHeader(&tar.Header{
		Typeflag:   tar.TypeReg,
		Name:       p,
		ModTime:    time.Unix(0, 0),
		Format:     tar.FormatPAX,
		PAXRecords: map[string]string{removedKey: "1"},
	})
}

// gone reports errors meaning the entry changed or vanished since the scan.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrUnsafePath) ||
		errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

func (s *sender) entry(p string) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	dir, name := split(p)
	dfd, err := s.b.openDir(dir)
	if err != nil {
		if gone(err) {
			return s.skip(p)
		}
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if gone(err) {
			return s.skip(p)
		}
		return &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return s.file(dfd, name, p)
	case unix.S_IFDIR:
		fd, err := openat(dfd, name, dirFlags)
		if err != nil {
			if gone(err) {
				return s.skip(p)
			}
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		defer unix.Close(fd)
		if err := unix.Fstat(fd, &st); err != nil {
			return &fs.PathError{Op: "fstat", Path: p, Err: err}
		}
		hdr := header(p+"/", &st)
		hdr.Typeflag = tar.TypeDir
		if err := readXattrs(fd, hdr.PAXRecords); err != nil {
			return fmt.Errorf("rootfs: %s: %w", p, err)
		}
		return s.tw.WriteHeader(hdr)
	case unix.S_IFLNK:
		n, err := unix.Readlinkat(dfd, name, s.buf)
		if err != nil {
			if gone(err) || errors.Is(err, unix.EINVAL) {
				return s.skip(p)
			}
			return &fs.PathError{Op: "readlink", Path: p, Err: err}
		}
		hdr := header(p, &st)
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = string(s.buf[:n])
		return s.tw.WriteHeader(hdr)
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr := header(p, &st)
		hdr.Typeflag = tar.TypeBlock
		if st.Mode&unix.S_IFMT == unix.S_IFCHR {
			hdr.Typeflag = tar.TypeChar
		}
		hdr.Devmajor = int64(unix.Major(st.Rdev))
		hdr.Devminor = int64(unix.Minor(st.Rdev))
		return s.tw.WriteHeader(hdr)
	case unix.S_IFIFO:
		hdr := header(p, &st)
		hdr.Typeflag = tar.TypeFifo
		return s.tw.WriteHeader(hdr)
	case unix.S_IFSOCK:
		hdr := header(p, &st)
		hdr.Typeflag = tar.TypeFifo
		hdr.PAXRecords[typeKey] = typeSocket
		return s.tw.WriteHeader(hdr)
	}
	return nil
}

// file sends a regular file. O_NONBLOCK keeps open from hanging should the
// name have turned into a fifo since the stat; the type is checked again on
// the open descriptor.
func (s *sender) file(dfd int, name, p string) error {
	fd, err := openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		if gone(err) {
			return s.skip(p)
		}
		return &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	if old, ok := s.known[p]; ok {
		if patched, err := s.patch(fd, p, &st, old); patched || err != nil {
			return err
		}
	}
	hdr := header(p, &st)
	hdr.Typeflag = tar.TypeReg
	hdr.Size = st.Size
	if err := readXattrs(fd, hdr.PAXRecords); err != nil {
		return fmt.Errorf("rootfs: %s: %w", p, err)
	}
	if err := s.tw.WriteHeader(hdr); err != nil {
		return err
	}
	w := io.Writer(s.tw)
	var hashed *blockHasher
	if st.Size >= minBlocksFile {
		hashed = newBlockHasher(s.tw)
		w = hashed
	}
	// The header promised st.Size bytes: a file that shrinks while being read
	// is padded with zeros, one that grows is cut. Its mtime has moved past
	// the one sent, so the next sync sends it again.
	n, err := io.CopyBuffer(w, io.LimitReader(fdReader(fd), st.Size), s.buf)
	if err != nil {
		return fmt.Errorf("rootfs: read %s: %w", p, err)
	}
	for n < st.Size {
		clear(s.buf)
		k, err := w.Write(s.buf[:min(int64(len(s.buf)), st.Size-n)])
		if err != nil {
			return err
		}
		n += int64(k)
	}
	if hashed != nil {
		s.blocks[p] = FileBlocks{Size: st.Size, MtimeNs: st.Mtim.Nano(), Hashes: hashed.sum()}
	}
	return nil
}

type fdReader int

func (r fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func header(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name:       name,
		Mode:       int64(st.Mode & 0o7777),
		Uid:        int(st.Uid),
		Gid:        int(st.Gid),
		ModTime:    time.Unix(0, st.Mtim.Nano()),
		Format:     tar.FormatPAX,
		PAXRecords: map[string]string{},
	}
}

package rootfs

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// A database keeps its state in large files it changes a little at a time
// (PostgreSQL's 16 MB WAL segments, its table files). Sent whole, each
// change costs the whole file, and in the frozen pass that is downtime. So
// a sync remembers what it sent of every large file, as hashes of its
// blocks, and a later sync to the same copy sends only the blocks that
// changed: a patch, applied in place.

const (
	blockSize = 64 << 10
	// minBlocksFile: smaller files are sent whole; a patch would save
	// little.
	minBlocksFile = 1 << 20
	// patchKey marks a patch: "SIZE MTIME_NS NEWSIZE I,J,K..." (the file
	// as the receiver holds it, its new size, the changed blocks sent as
	// the entry's contents, in that order).
	patchKey = "FERRY.patch"
)

// FileBlocks is a large file as a sync sent it.
type FileBlocks struct {
	Size, MtimeNs int64
	Hashes        []uint64
}

// Blocks are the large regular files a sync sent, by path.
type Blocks map[string]FileBlocks

// blockHasher hashes what passes through it, block by block.
type blockHasher struct {
	w      io.Writer
	h      *xxh3.Hasher
	filled int
	hashes []uint64
}

func newBlockHasher(w io.Writer) *blockHasher { return &blockHasher{w: w, h: xxh3.New()} }

func (b *blockHasher) Write(p []byte) (int, error) {
	n, err := b.w.Write(p)
	for q := p[:n]; len(q) > 0; {
		k := min(len(q), blockSize-b.filled)
		_, _ = b.h.Write(q[:k])
		b.filled += k
		q = q[k:]
		if b.filled == blockSize {
			b.hashes = append(b.hashes, b.h.Sum64())
			b.h.Reset()
			b.filled = 0
		}
	}
	return n, err
}

// sum returns the hashes, the last (partial) block included.
func (b *blockHasher) sum() []uint64 {
	if b.filled > 0 {
		b.hashes = append(b.hashes, b.h.Sum64())
	}
	return b.hashes
}

// changedBlocks reads fd's size bytes block by block and lists the blocks
// that differ from known (or lie beyond it), with the new hashes.
func changedBlocks(fd int, size int64, known []uint64, buf []byte) (changed []int, hashes []uint64, err error) {
	buf = buf[:blockSize]
	for i := 0; int64(i)*blockSize < size; i++ {
		n := int(min(blockSize, size-int64(i)*blockSize))
		if err := preadFull(fd, buf[:n], int64(i)*blockSize); err != nil {
			return nil, nil, err
		}
		h := xxh3.Hash(buf[:n])
		hashes = append(hashes, h)
		if i >= len(known) || known[i] != h {
			changed = append(changed, i)
		}
	}
	return changed, hashes, nil
}

func preadFull(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pread(fd, p, off)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// patch sends the blocks of the open regular file fd that changed since
// the receiver got old. It reports false, having written nothing, when
// most of the file changed: sending it whole is as cheap then.
func (s *sender) patch(fd int, p string, st *unix.Stat_t, old FileBlocks) (bool, error) {
	changed, hashes, err := changedBlocks(fd, st.Size, old.Hashes, s.buf)
	if err != nil {
		return false, fmt.Errorf("rootfs: read %s: %w", p, err)
	}
	if int64(len(changed))*blockSize*2 > st.Size {
		return false, nil
	}
	hdr := header(p, st)
	hdr.Typeflag = tar.TypeReg
	idx := make([]string, len(changed))
	for i, b := range changed {
		idx[i] = strconv.Itoa(b)
		hdr.Size += min(blockSize, st.Size-int64(b)*blockSize)
	}
	hdr.PAXRecords[patchKey] = fmt.Sprintf("%d %d %d %s", old.Size, old.MtimeNs, st.Size, strings.Join(idx, ","))
	if err := readXattrs(fd, hdr.PAXRecords); err != nil {
		return false, fmt.Errorf("rootfs: %s: %w", p, err)
	}
	if err := s.tw.WriteHeader(hdr); err != nil {
		return false, err
	}
	buf := s.buf[:blockSize]
	for _, b := range changed {
		n := int(min(blockSize, st.Size-int64(b)*blockSize))
		if err := preadFull(fd, buf[:n], int64(b)*blockSize); err != nil {
			return false, fmt.Errorf("rootfs: read %s: %w", p, err)
		}
		if _, err := s.tw.Write(buf[:n]); err != nil {
			return false, err
		}
	}
	s.blocks[p] = FileBlocks{Size: st.Size, MtimeNs: st.Mtim.Nano(), Hashes: hashes}
	return true, nil
}

// parsePatch reads a patch's record.
func parsePatch(rec string) (size, mtimeNs, newSize int64, blocks []int64, err error) {
	f := strings.Fields(rec)
	if len(f) != 4 && len(f) != 3 {
		return 0, 0, 0, nil, fmt.Errorf("bad patch record %q", rec)
	}
	nums := make([]int64, 3)
	for i := range nums {
		if nums[i], err = strconv.ParseInt(f[i], 10, 64); err != nil || (i != 1 && nums[i] < 0) {
			return 0, 0, 0, nil, fmt.Errorf("bad patch record %q", rec)
		}
	}
	if len(f) == 4 {
		prev := int64(-1)
		for _, s := range strings.Split(f[3], ",") {
			b, err := strconv.ParseInt(s, 10, 64)
			if err != nil || b <= prev || b*blockSize >= nums[2] {
				return 0, 0, 0, nil, fmt.Errorf("bad patch record %q", rec)
			}
			blocks, prev = append(blocks, b), b
		}
	}
	return nums[0], nums[1], nums[2], blocks, nil
}

// patch applies a patch to the file at name in dfd, in place: the file
// must be as the previous sync left it (size and mtime), or the stream
// was not meant for this copy.
func (a *applier) patch(dfd int, p, name string, hdr *tar.Header) error {
	size, mtimeNs, newSize, blocks, err := parsePatch(hdr.PAXRecords[patchKey])
	if err != nil {
		return fmt.Errorf("rootfs: %s: %w", p, err)
	}
	var want int64
	for _, b := range blocks {
		want += min(blockSize, newSize-b*blockSize)
	}
	if want != hdr.Size {
		return fmt.Errorf("rootfs: %s: a patch of %d bytes carries %d", p, want, hdr.Size)
	}
	// A file that grows gets every block past its old end: nothing is
	// left to a sparse hole.
	sent := map[int64]bool{}
	for _, b := range blocks {
		sent[b] = true
	}
	for b := size / blockSize; newSize > size && b*blockSize < newSize; b++ {
		if !sent[b] {
			return fmt.Errorf("rootfs: %s: a patch that grows the file leaves block %d out", p, b)
		}
	}
	fd, err := openat(dfd, name, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		return &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size || st.Mtim.Nano() != mtimeNs {
		return fmt.Errorf("rootfs: %s: a patch for the file as the last sync left it (%d bytes), but this copy differs", p, size)
	}
	if err := unix.Ftruncate(fd, newSize); err != nil {
		return &fs.PathError{Op: "truncate", Path: p, Err: err}
	}
	buf := a.buf[:blockSize]
	for _, b := range blocks {
		n := int(min(blockSize, newSize-b*blockSize))
		if _, err := io.ReadFull(a.tr, buf[:n]); err != nil {
			return fmt.Errorf("rootfs: %s: %w", p, err)
		}
		if _, err := unix.Pwrite(fd, buf[:n], b*blockSize); err != nil {
			return &fs.PathError{Op: "write", Path: p, Err: err}
		}
		a.stats.Bytes += int64(n)
	}
	if err := a.chown(unix.Fchown(fd, hdr.Uid, hdr.Gid)); err != nil {
		return &fs.PathError{Op: "chown", Path: p, Err: err}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return &fs.PathError{Op: "chmod", Path: p, Err: err}
	}
	// The file was not made afresh: attributes it lost at the source go.
	had := map[string]string{}
	if err := readXattrs(fd, had); err != nil {
		return fmt.Errorf("rootfs: %s: %w", p, err)
	}
	for k := range had {
		if _, keep := hdr.PAXRecords[k]; !keep {
			if err := unix.Fremovexattr(fd, strings.TrimPrefix(k, xattrPrefix)); err != nil && !(err == unix.EPERM && !a.root) {
				return fmt.Errorf("rootfs: %s: removexattr: %w", p, err)
			}
		}
	}
	if err := a.setXattrs(fd, hdr); err != nil {
		return fmt.Errorf("rootfs: %s: %w", p, err)
	}
	if err := a.setMtime(dfd, name, hdr); err != nil {
		return &fs.PathError{Op: "utimes", Path: p, Err: err}
	}
	a.stats.Files++
	return nil
}

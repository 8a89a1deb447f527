// Package rootfs synchronises a container's root filesystem between hosts,
// incrementally, in the manner of rsync: the destination describes what it
// has (a Manifest), the source works out what differs (Diff) and streams it
// as a tar (WriteDelta), and the destination applies that stream (ApplyDelta)
// without ever letting it write outside the root.
package rootfs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Entry describes one filesystem object relative to the root.
type Entry struct {
	// Path is slash separated and relative to the root, never ".".
	Path string
	// Mode is the full mode, type bits included.
	Mode fs.FileMode
	// Size is the length of a regular file or of a symlink's target, and 0
	// for every other type (a directory's size depends on the filesystem).
	Size    int64
	MtimeNs int64
	UID     int
	GID     int
	// Link is a symlink's target.
	Link string
	// Dev is the device number of a character or block device.
	Dev uint64
}

// Manifest maps a slash path relative to the root to its entry. The root
// itself (".") is not included.
type Manifest map[string]Entry

// maxDepth bounds how deep Scan descends; each level holds one descriptor.
const maxDepth = 4096

// scanWorkers is how many goroutines Scan walks with. Most of a scan is
// fstatat, which scales with the CPUs; more walkers than CPUs help when the
// inodes have to come from disk.
var scanWorkers = min(max(runtime.GOMAXPROCS(0), 4), 16)

// Scan walks root with lstat semantics: symlinks are recorded, never
// followed. A directory on another filesystem than root (a mount point, such
// as proc or sys inside a container's root) is recorded but not entered.
// Objects that vanish while the walk runs are left out, so scanning the root
// of a running container is fine.
//
// Several goroutines walk at once: one that finds a subdirectory while
// another waits for work hands it the subdirectory's descriptor, opened
// beneath its parent's like every other, and otherwise descends itself.
func Scan(root string) (Manifest, error) {
	fd, err := openat(unix.AT_FDCWD, root, dirFlags)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	d := os.NewFile(uintptr(fd), root)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.Close()
		return nil, &fs.PathError{Op: "fstat", Path: root, Err: err}
	}
	return scanFrom(d, st.Dev, "")
}

// scanFrom scans the open directory d (rel below the root, "" for the
// root itself; closed when done) on filesystem dev.
func scanFrom(d *os.File, dev uint64, rel string) (Manifest, error) {
	s := &scanner{dev: dev, tasks: make(chan scanTask)}
	walkers := make([]*walker, scanWorkers)
	for i := range walkers {
		walkers[i] = &walker{s: s, buf: make([]byte, unix.PathMax)}
	}
	// The calling goroutine walks the root, then serves like the others.
	s.pending.Store(1)
	var wg sync.WaitGroup
	for _, w := range walkers[1:] {
		wg.Go(w.serve)
	}
	walkers[0].run(scanTask{d: d, rel: rel})
	walkers[0].serve()
	wg.Wait()
	if err := s.err.Load(); err != nil {
		return nil, *err
	}
	n := 0
	for _, w := range walkers {
		n += len(w.entries)
	}
	m := make(Manifest, n)
	for _, w := range walkers {
		for _, e := range w.entries {
			m[e.Path] = e
		}
	}
	return m, nil
}

type scanner struct {
	dev uint64
	// tasks is unbuffered: a directory is handed over only to a walker
	// that waits for one, so descriptors never pile up in a queue.
	tasks chan scanTask
	// pending counts directories handed over or being walked; the walker
	// that brings it to zero closes tasks, which ends the scan.
	pending atomic.Int64
	err     atomic.Pointer[error] // the first failure
}

type scanTask struct {
	d     *os.File
	rel   string
	depth int
}

// walker is one goroutine of a scan, with its own share of the entries.
type walker struct {
	s       *scanner
	entries []Entry
	buf     []byte
}

func (w *walker) serve() {
	for t := range w.s.tasks {
		w.run(t)
	}
}

// run walks a directory handed over, then closes it.
func (w *walker) run(t scanTask) {
	if w.s.err.Load() == nil {
		if err := w.dir(t.d, t.rel, t.depth); err != nil {
			w.s.err.CompareAndSwap(nil, &err)
		}
	}
	t.d.Close()
	if w.s.pending.Add(-1) == 0 {
		close(w.s.tasks)
	}
}

func (w *walker) dir(d *os.File, rel string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("rootfs: scan: %s: deeper than %d levels", rel, maxDepth)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("rootfs: scan: read %s: %w", displayPath(rel), err)
	}
	dfd := int(d.Fd())
	var st unix.Stat_t
	for _, name := range names {
		if w.s.err.Load() != nil {
			return nil // another walker failed: the scan is over
		}
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		e, err := entryAt(dfd, name, p, &st, w.buf)
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			return err
		}
		w.entries = append(w.entries, e)
		if !e.Mode.IsDir() || st.Dev != w.s.dev {
			continue
		}
		cfd, err := openat(dfd, name, dirFlags)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				continue // replaced since the stat
			}
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		child := os.NewFile(uintptr(cfd), p)
		w.s.pending.Add(1)
		select {
		case w.s.tasks <- scanTask{d: child, rel: p, depth: depth + 1}:
			continue
		default:
			w.s.pending.Add(-1) // this walker's own directory still counts
		}
		err = w.dir(child, p, depth+1)
		child.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// errGone: an entry vanished, or was replaced, between the calls that
// describe it.
var errGone = errors.New("gone")

// entryAt is the entry Scan records for name in directory dfd (p its path
// from the root), with the stat it came from in st; buf holds a symlink's
// target while it is read. It returns errGone for an entry that vanished
// or was replaced meanwhile.
func entryAt(dfd int, name, p string, st *unix.Stat_t, buf []byte) (Entry, error) {
	if err := unix.Fstatat(dfd, name, st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Entry{}, errGone
		}
		return Entry{}, &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	e := entryFromStat(p, st)
	if e.Mode&fs.ModeSymlink != 0 {
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
				return Entry{}, errGone
			}
			return Entry{}, &fs.PathError{Op: "readlink", Path: p, Err: err}
		}
		e.Link, e.Size = string(buf[:n]), int64(n)
	}
	return e, nil
}

func entryFromStat(p string, st *unix.Stat_t) Entry {
	e := Entry{
		Path:    p,
		Mode:    modeFromUnix(st.Mode),
		MtimeNs: st.Mtim.Nano(),
		UID:     int(st.Uid),
		GID:     int(st.Gid),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Size = st.Size
	case unix.S_IFCHR, unix.S_IFBLK:
		e.Dev = st.Rdev
	}
	return e
}

// modeFromUnix converts a stat mode to Go's representation.
func modeFromUnix(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// modeToUnix is the inverse of modeFromUnix.
func modeToUnix(mode fs.FileMode) uint32 {
	m := uint32(mode.Perm())
	switch {
	case mode&fs.ModeDir != 0:
		m |= unix.S_IFDIR
	case mode&fs.ModeSymlink != 0:
		m |= unix.S_IFLNK
	case mode&fs.ModeNamedPipe != 0:
		m |= unix.S_IFIFO
	case mode&fs.ModeSocket != 0:
		m |= unix.S_IFSOCK
	case mode&fs.ModeCharDevice != 0:
		m |= unix.S_IFCHR
	case mode&fs.ModeDevice != 0:
		m |= unix.S_IFBLK
	default:
		m |= unix.S_IFREG
	}
	if mode&fs.ModeSetuid != 0 {
		m |= unix.S_ISUID
	}
	if mode&fs.ModeSetgid != 0 {
		m |= unix.S_ISGID
	}
	if mode&fs.ModeSticky != 0 {
		m |= unix.S_ISVTX
	}
	return m
}

// wireEntry is an Entry on the wire: short keys, zero fields left out, the
// mode as a stat mode (shorter than Go's). Names that are not valid UTF-8
// travel as bytes, since JSON strings would mangle them.
type wireEntry struct {
	P  string `json:"p,omitempty"`
	PB []byte `json:"pb,omitempty"`
	M  uint32 `json:"m"`
	S  int64  `json:"s,omitempty"`
	T  int64  `json:"t,omitempty"`
	U  int    `json:"u,omitempty"`
	G  int    `json:"g,omitempty"`
	L  string `json:"l,omitempty"`
	LB []byte `json:"lb,omitempty"`
	D  uint64 `json:"d,omitempty"`
}

// MarshalJSON encodes the manifest as a compact array sorted by path.
func (m Manifest) MarshalJSON() ([]byte, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, comparePaths)
	out := make([]wireEntry, 0, len(keys))
	for _, k := range keys {
		e := m[k]
		w := wireEntry{M: modeToUnix(e.Mode), S: e.Size, T: e.MtimeNs, U: e.UID, G: e.GID, D: e.Dev}
		if utf8.ValidString(k) {
			w.P = k
		} else {
			w.PB = []byte(k)
		}
		if utf8.ValidString(e.Link) {
			w.L = e.Link
		} else {
			w.LB = []byte(e.Link)
		}
		out = append(out, w)
	}
	return json.Marshal(out)
}

// Digest names the tree the manifest describes: "sha256:" over its
// entries in path order (names, types, modes, owners, sizes, times, link
// targets; not contents). Two copies of one image unpacked with their
// times kept have the same digest; scanning is cheap where hashing every
// file's contents is not.
func (m Manifest) Digest() (string, error) {
	b, err := m.MarshalJSON()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// UnmarshalJSON decodes what MarshalJSON produced.
func (m *Manifest) UnmarshalJSON(data []byte) error {
	var in []wireEntry
	if err := json.Unmarshal(data, &in); err != nil {
		return err
	}
	out := make(Manifest, len(in))
	for _, w := range in {
		p := w.P
		if w.PB != nil {
			p = string(w.PB)
		}
		link := w.L
		if w.LB != nil {
			link = string(w.LB)
		}
		if p == "" {
			return errors.New("rootfs: manifest entry without a path")
		}
		out[p] = Entry{Path: p, Mode: modeFromUnix(w.M), Size: w.S, MtimeNs: w.T, UID: w.U, GID: w.G, Link: link, Dev: w.D}
	}
	*m = out
	return nil
}

func displayPath(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// Bytes is what the manifest's regular files hold: the space a copy of
// the tree needs, but for directories and metadata.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, e := range m {
		if e.Mode.IsRegular() {
			n += e.Size
		}
	}
	return n
}

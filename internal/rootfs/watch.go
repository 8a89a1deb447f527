package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Watcher records which paths below a root change, so that the frozen
// pass of a migration looks only at those (Rescan) instead of walking the
// whole tree: for a Debian root filesystem of 60,000 entries the walk is
// 100-200 ms of downtime, the changed paths a few.
//
// It is inotify, one watch per directory, read by hand rather than through
// a notification library because Rescan needs every event the kernel
// queued before it (the container is frozen then, so draining the
// descriptor until it is empty is exact); a library's reader goroutine
// cannot promise that. Where inotify cannot vouch for a path, Rescan walks
// the whole tree instead (Rescan's Full says why): a watched directory
// moved (its watches below would name the old paths), the kernel's event
// queue overflowing, or a changed file with more than one link (its other
// names changed too, unseen). Writes through a shared mapping raise no
// event at all: the caller names the files the container has open for
// writing or mapped shared (Rescan's extra). What stays unseen: a file
// given a second name, written through it, and that name removed again
// before the rescan; a full walk, which compares size and mtime, misses a
// file rewritten with both put back.
type Watcher struct {
	root string
	fd   int
	dev  uint64
	// wake is an eventfd that stops the reader at once: Rescan runs while
	// the container is frozen.
	wake int

	// The reader goroutine owns the fields below until Rescan stops it.
	stop    chan struct{}
	stopped chan struct{}
	stopMu  sync.Once
	wds     map[int]string  // watch descriptor -> directory ("" for the root)
	watched map[string]bool // directories whose watch still holds
	dirty   map[string]bool // paths to look at again
	full    string          // why only a full walk is safe ("": it is not needed)
	err     error
}

// watchMask is what changes a manifest entry: content, metadata, names.
const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW | unix.IN_EXCL_UNLINK

// Watch starts watching every directory below root on root's filesystem
// (mounts below are not entered, as Scan does not). A manifest scanned
// after Watch returns is a base Rescan can bring up to date. It fails
// where inotify's limits are too low for the tree (fs.inotify.max_user_watches).
func Watch(root string) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("rootfs: inotify: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rootfs: eventfd: %w", err)
	}
	w := &Watcher{root: root, fd: fd, wake: wake, stop: make(chan struct{}), stopped: make(chan struct{}),
		wds: map[int]string{}, watched: map[string]bool{}, dirty: map[string]bool{}}
	fail := func(err error) (*Watcher, error) {
		unix.Close(fd)
		unix.Close(wake)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return fail(&fs.PathError{Op: "lstat", Path: root, Err: err})
	}
	w.dev = st.Dev
	if err := w.addTree(root, ""); err != nil {
		return fail(err)
	}
	go w.read()
	return w, nil
}

// addTree watches dir (rel below the root) and every directory below it.
func (w *Watcher) addTree(dir, rel string) error {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil // gone or replaced meanwhile: the scan after Watch sees it
		}
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("rootfs: watching %s: fs.inotify.max_user_watches is too low for this tree (%d directories so far)", w.root, len(w.wds))
		}
		return fmt.Errorf("rootfs: watching %s: %w", dir, err)
	}
	w.wds[wd], w.watched[rel] = rel, true
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("rootfs: watching: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		child, crel := filepath.Join(dir, e.Name()), join(rel, e.Name())
		var st unix.Stat_t
		if unix.Lstat(child, &st) != nil || st.Dev != w.dev || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if err := w.addTree(child, crel); err != nil {
			return err
		}
	}
	return nil
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// read takes events as they come, so the kernel's queue does not overflow
// during a long live phase, until Rescan stops it.
func (w *Watcher) read() {
	defer close(w.stopped)
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}, {Fd: int32(w.wake), Events: unix.POLLIN}}
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			w.err = fmt.Errorf("rootfs: inotify poll: %w", err)
			return
		}
		if err := w.drain(); err != nil {
			w.err = err
			return
		}
	}
}

// drain reads every queued event.
func (w *Watcher) drain() error {
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return nil
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("rootfs: inotify read: %w", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				b := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if i := slices.Index(b, 0); i >= 0 {
					b = b[:i]
				}
				name = string(b)
			}
			w.event(int(ev.Wd), ev.Mask, name)
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// event records what one inotify event says changed.
func (w *Watcher) event(wd int, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.fullWalk("the kernel's inotify queue overflowed (fs.inotify.max_queued_events)")
		return
	}
	dir, ok := w.wds[wd]
	if !ok {
		return
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.wds, wd) // the directory is gone; its parent's event named it
		return
	}
	if name == "" {
		// About the watched directory itself.
		switch {
		case mask&unix.IN_MOVE_SELF != 0 && dir == "":
			w.fullWalk("the root directory was moved")
		case mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
			delete(w.watched, dir)
		}
		if dir != "" {
			w.dirty[dir] = true
		}
		return
	}
	p := join(dir, name)
	w.dirty[p] = true
	if dir != "" && mask&(unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0 {
		w.dirty[dir] = true // a name came or went: the directory's mtime moved
	}
	if mask&unix.IN_ISDIR == 0 {
		return
	}
	switch {
	case mask&unix.IN_MOVED_FROM != 0 && w.watched[p]:
		// The watches below now sit under another name.
		w.fullWalk(fmt.Sprintf("the directory %s was moved", p))
	case mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
		delete(w.watched, p)
	}
}

func (w *Watcher) fullWalk(why string) {
	if w.full == "" {
		w.full = why
	}
}

// Close stops watching.
func (w *Watcher) Close() error {
	w.stopReader()
	return errors.Join(unix.Close(w.fd), unix.Close(w.wake))
}

func (w *Watcher) stopReader() {
	w.stopMu.Do(func() {
		close(w.stop)
		_, _ = unix.Write(w.wake, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	})
	<-w.stopped
}

// RescanStats says how Rescan brought its base up to date.
type RescanStats struct {
	// Full is why the whole tree was walked ("": only changed paths were
	// looked at).
	Full string
	// Paths is how many changed paths were looked at; Subtrees how many of
	// them were new directories walked whole.
	Paths, Subtrees int
}

// Changes is the tree as a rescan found it, told as what differs from the
// base it was given, so that a frozen pass costs what changed.
type Changes struct {
	base Manifest
	// full is the whole tree when it was walked; otherwise set holds the
	// entries looked at (changed or not) and gone the paths no longer there.
	full Manifest
	set  map[string]Entry
	gone map[string]bool
}

// Manifest is the whole tree now (a new map).
func (c *Changes) Manifest() Manifest {
	if c.full != nil {
		return c.full
	}
	m := make(Manifest, len(c.base)+len(c.set))
	for p, e := range c.base {
		if !c.gone[p] {
			m[p] = e
		}
	}
	for p, e := range c.set {
		m[p] = e
	}
	return m
}

// Delta is Diff(base, c.Manifest()), from the changed paths alone.
func (c *Changes) Delta() Delta {
	if c.full != nil {
		return Diff(c.base, c.full)
	}
	var d Delta
	for p, e := range c.set {
		if h, ok := c.base[p]; !ok || !sameEntry(h, e) {
			e.Path = p
			d.Changed = append(d.Changed, e)
		}
	}
	for p := range c.gone {
		if _, ok := c.base[p]; ok {
			d.Removed = append(d.Removed, p)
		}
	}
	d.sort()
	return d
}

// Rescan returns the tree as it is now. base must be a manifest scanned
// after Watch returned; extra names paths (slash, relative to the root)
// that may have changed without an event: files written through a shared
// mapping. Call it once the tree has stopped changing (the container
// frozen): it takes every event queued until then, and ends the watch.
func (w *Watcher) Rescan(base Manifest, extra []string) (*Changes, RescanStats, error) {
	w.stopReader()
	if w.err == nil {
		w.err = w.drain()
	}
	if w.err != nil {
		return nil, RescanStats{}, w.err
	}
	for _, p := range extra {
		if p, err := cleanPath(p); err == nil {
			w.dirty[p] = true
		}
	}
	if w.full != "" {
		return w.fullScan(base, w.full)
	}
	c, st, err := w.update(base)
	if errors.Is(err, errNeedFull) {
		return w.fullScan(base, strings.TrimPrefix(err.Error(), errNeedFull.Error()+": "))
	}
	return c, st, err
}

var errNeedFull = errors.New("full walk")

func (w *Watcher) fullScan(base Manifest, why string) (*Changes, RescanStats, error) {
	m, err := Scan(w.root)
	if err != nil {
		return nil, RescanStats{}, err
	}
	return &Changes{base: base, full: m}, RescanStats{Full: why}, nil
}

// update looks at the dirty paths, parents first.
func (w *Watcher) update(base Manifest) (*Changes, RescanStats, error) {
	var st RescanStats
	paths := make([]string, 0, len(w.dirty))
	for p := range w.dirty {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, comparePaths)
	b, err := openBeneath(w.root)
	if err != nil {
		return nil, st, err
	}
	defer b.close()
	c := &Changes{base: base, set: map[string]Entry{}, gone: map[string]bool{}}
	buf := make([]byte, unix.PathMax)
	walked := "" // the last subtree walked whole: its paths are done
	for _, p := range paths {
		if walked != "" && strings.HasPrefix(p, walked+"/") {
			continue
		}
		st.Paths++
		e, ok, nlink, err := statBeneath(b, p, buf)
		if err != nil {
			return nil, st, err
		}
		old, had := c.base[p]
		if had && old.Mode.IsDir() && (!ok || !e.Mode.IsDir() || !w.watched[p]) {
			c.removeBelow(p) // gone, no longer a directory, or replaced
		}
		if !ok {
			delete(c.set, p)
			c.gone[p] = true
			continue
		}
		if e.Mode.IsRegular() && nlink > 1 {
			return nil, st, fmt.Errorf("%w: %s has %d links, whose other names changed with it", errNeedFull, p, nlink)
		}
		c.set[p] = e
		delete(c.gone, p)
		if e.Mode.IsDir() && !w.watched[p] {
			// New, or replaced since Watch: nothing reported what is in it.
			sub, err := scanBeneath(b, p, w.dev)
			if err != nil {
				return nil, st, err
			}
			for q, e := range sub {
				c.set[q] = e
				delete(c.gone, q)
			}
			st.Subtrees++
			walked = p
		}
	}
	return c, st, nil
}

// removeBelow marks every entry beneath directory p gone.
func (c *Changes) removeBelow(p string) {
	prefix := p + "/"
	for q := range c.base {
		if strings.HasPrefix(q, prefix) {
			c.gone[q] = true
		}
	}
	for q := range c.set {
		if strings.HasPrefix(q, prefix) {
			delete(c.set, q)
		}
	}
}

// statBeneath is the entry Scan would record for p, and its link count;
// ok is false when p does not exist (or its parent is no longer a
// directory of the tree).
func statBeneath(b *beneath, p string, buf []byte) (e Entry, ok bool, nlink uint64, err error) {
	dir, name := split(p)
	dfd, err := b.openDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrUnsafePath) {
			return Entry{}, false, 0, nil
		}
		return Entry{}, false, 0, err
	}
	var st unix.Stat_t
	e, err = entryAt(dfd, name, p, &st, buf)
	if errors.Is(err, errGone) {
		return Entry{}, false, 0, nil
	}
	if err != nil {
		return Entry{}, false, 0, err
	}
	return e, true, uint64(st.Nlink), nil //nolint:unconvert // uint32 on arm64
}

// scanBeneath scans directory p of the tree, opened without following a
// symlink on the way, with its entries named from the root.
func scanBeneath(b *beneath, p string, dev uint64) (Manifest, error) {
	fd, err := b.walk(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrUnsafePath) {
			return Manifest{}, nil // gone or replaced since the stat
		}
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if st.Dev != dev {
		unix.Close(fd)
		return Manifest{}, nil // a mount point: recorded, not entered
	}
	return scanFrom(os.NewFile(uintptr(fd), p), dev, p)
}

package rootfs

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"golang.org/x/sys/unix"
)

func write(t testing.TB, path string, data []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // not subject to umask
		t.Fatal(err)
	}
}

func symlink(t testing.TB, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func lutimes(t testing.TB, path string, tm time.Time) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(tm.UnixNano()), unix.NsecToTimespec(tm.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

var past = time.Date(2001, 2, 3, 4, 5, 6, 789012345, time.UTC)

// buildTree fills dir with one of everything Scan has to record.
func buildTree(t *testing.T, dir string) {
	t.Helper()
	write(t, filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
	write(t, filepath.Join(dir, "etc/shadow"), []byte("root:*:1::::::\n"), 0o600)
	write(t, filepath.Join(dir, "bin/tool"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	write(t, filepath.Join(dir, "bin/suid"), []byte("setuid"), 0o755|fs.ModeSetuid)
	write(t, filepath.Join(dir, "a/b/c/deep.txt"), []byte("deep"), 0o644)
	write(t, filepath.Join(dir, "a/gone/x"), []byte("x"), 0o644)
	write(t, filepath.Join(dir, "empty"), nil, 0o644)
	write(t, filepath.Join(dir, "big"), randomBytes(t, 3<<20), 0o644)
	write(t, filepath.Join(dir, "old"), []byte("old"), 0o640)
	if err := os.Chtimes(filepath.Join(dir, "old"), past, past); err != nil {
		t.Fatal(err)
	}
	symlink(t, "etc/passwd", filepath.Join(dir, "link-rel"))
	symlink(t, "does/not/exist", filepath.Join(dir, "dangling"))
	symlink(t, "/etc/passwd", filepath.Join(dir, "outside-abs"))
	symlink(t, "../../outside", filepath.Join(dir, "a/outside-rel"))
	lutimes(t, filepath.Join(dir, "dangling"), past)
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o620); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "fifo"), 0o620); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sticky"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "sticky"), 0o777|fs.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(dir, "etc/passwd"), "user.ferry", []byte("v\x00al"), 0); err != nil {
		t.Logf("no user xattrs here (%v): not checking them", err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if os.Geteuid() == 0 {
		if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(dir, "etc/shadow"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(dir, "dangling"), 4321, 8765); err != nil {
			t.Fatal(err)
		}
		// chown clears set-id bits: set them again, as a package manager would.
		if err := os.Lchown(filepath.Join(dir, "bin/suid"), 0, 42); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, "bin/suid"), 0o755|fs.ModeSetuid); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Log("not root: no device node, no foreign owners")
	}
	// Directories last, since writing inside them moves their mtime.
	if err := os.Chtimes(filepath.Join(dir, "a/b"), past, past); err != nil {
		t.Fatal(err)
	}
}

// syncOnce runs the protocol: the destination's manifest travels as JSON.
func syncOnce(t *testing.T, src, dst string) (Delta, Stats) {
	t.Helper()
	have, err := Scan(dst)
	if err != nil {
		t.Fatal(err)
	}
	wire, err := json.Marshal(have)
	if err != nil {
		t.Fatal(err)
	}
	var remote Manifest
	if err := json.Unmarshal(wire, &remote); err != nil {
		t.Fatal(err)
	}
	want, err := Scan(src)
	if err != nil {
		t.Fatal(err)
	}
	d := Diff(remote, want)
	var buf bytes.Buffer
	n, err := WriteDelta(&buf, src, d)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteDelta reported %d bytes, wrote %d", n, buf.Len())
	}
	st, err := ApplyDelta(&buf, dst)
	if err != nil {
		t.Fatal(err)
	}
	return d, st
}

// sameTrees checks that both trees scan the same and hold the same bytes
// and extended attributes.
func sameTrees(t *testing.T, a, b string) {
	t.Helper()
	ma, err := Scan(a)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := Scan(b)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(mb, ma); !d.Empty() || !reflect.DeepEqual(ma, mb) {
		t.Fatalf("trees differ: %+v", d)
	}
	for p, e := range ma {
		if !e.Mode.IsRegular() {
			continue
		}
		da, err := os.ReadFile(filepath.Join(a, p))
		if err != nil {
			t.Fatal(err)
		}
		db, err := os.ReadFile(filepath.Join(b, p))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(da, db) {
			t.Errorf("%s: contents differ", p)
		}
		xa, _ := xattrsOf(filepath.Join(a, p))
		xb, _ := xattrsOf(filepath.Join(b, p))
		if !reflect.DeepEqual(xa, xb) {
			t.Errorf("%s: xattrs %q, copy has %q", p, xa, xb)
		}
	}
}

func xattrsOf(path string) (map[string]string, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	m := map[string]string{}
	err = readXattrs(fd, m)
	return m, err
}

func TestSyncRoundTrip(t *testing.T) {
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	buildTree(t, src)
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}

	d, st := syncOnce(t, src, dst)
	if len(d.Removed) != 0 || st.Removed != 0 {
		t.Errorf("first sync removed %v", d.Removed)
	}
	if st.Files+st.Dirs != len(d.Changed) {
		t.Errorf("stats %+v for %d changed entries", st, len(d.Changed))
	}
	if st.Bytes < 3<<20 {
		t.Errorf("only %d bytes of content written", st.Bytes)
	}
	sameTrees(t, src, dst)
	m, err := Scan(dst)
	if err != nil {
		t.Fatal(err)
	}
	if got := m["bin/suid"].Mode; got != 0o755|fs.ModeSetuid {
		t.Errorf("bin/suid mode %v", got)
	}
	if got := m["etc/shadow"].Mode; got != 0o600 {
		t.Errorf("etc/shadow mode %v", got)
	}
	if got := m["old"].MtimeNs; got != past.UnixNano() {
		t.Errorf("old mtime %d, want %d", got, past.UnixNano())
	}
	if got := m["a/b"].MtimeNs; got != past.UnixNano() {
		t.Errorf("a/b mtime %d, want %d", got, past.UnixNano())
	}
	if got := m["dangling"]; got.Link != "does/not/exist" || got.MtimeNs != past.UnixNano() {
		t.Errorf("dangling %+v", got)
	}
	if got := m["fifo"].Mode; got != fs.ModeNamedPipe|0o620 {
		t.Errorf("fifo mode %v", got)
	}
	if got := m["sock"].Mode; got.Type() != fs.ModeSocket {
		t.Errorf("sock mode %v", got)
	}
	if os.Geteuid() == 0 {
		if got := m["null"]; got.Dev != unix.Mkdev(1, 3) || got.Mode.Type() != fs.ModeDevice|fs.ModeCharDevice {
			t.Errorf("null %+v", got)
		}
		if got := m["etc/shadow"]; got.UID != 1234 || got.GID != 5678 {
			t.Errorf("etc/shadow owner %d:%d", got.UID, got.GID)
		}
	}

	// Change one file in place, remove a file and a directory, add a file.
	write(t, filepath.Join(src, "a/b/c/deep.txt"), []byte("deeper"), 0o644)
	if err := os.Remove(filepath.Join(src, "etc/shadow")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(src, "a/gone")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "etc/new.conf"), []byte("new=1\n"), 0o644)

	d, st = syncOnce(t, src, dst)
	var changed []string
	for _, e := range d.Changed {
		changed = append(changed, e.Path)
	}
	// etc and a are sent too: their mtimes moved with the entries inside.
	wantChanged := []string{"a", "a/b/c/deep.txt", "etc", "etc/new.conf"}
	if !reflect.DeepEqual(changed, wantChanged) {
		t.Errorf("changed %q, want %q", changed, wantChanged)
	}
	wantRemoved := []string{"etc/shadow", "a/gone/x", "a/gone"}
	if !reflect.DeepEqual(d.Removed, wantRemoved) {
		t.Errorf("removed %q, want %q", d.Removed, wantRemoved)
	}
	wantStats := Stats{Files: 2, Dirs: 2, Removed: 3, Bytes: int64(len("deeper") + len("new=1\n"))}
	if st != wantStats {
		t.Errorf("stats %+v, want %+v", st, wantStats)
	}
	sameTrees(t, src, dst)

	d, st = syncOnce(t, src, dst)
	if !d.Empty() || st != (Stats{}) {
		t.Errorf("third sync: delta %+v, stats %+v", d, st)
	}
}

func TestCopyTree(t *testing.T) {
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "new/dst")
	buildTree(t, src)
	if err := os.Chmod(src, 0o751); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(src, past, past); err != nil {
		t.Fatal(err)
	}
	if err := CopyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	sameTrees(t, src, dst)
	var a, b unix.Stat_t
	if err := unix.Stat(src, &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(dst, &b); err != nil {
		t.Fatal(err)
	}
	if a.Mode != b.Mode || a.Mtim != b.Mtim || a.Uid != b.Uid || a.Gid != b.Gid {
		t.Errorf("root attributes differ: %o %v, copy %o %v", a.Mode, a.Mtim, b.Mode, b.Mtim)
	}
	// A second copy over the first changes nothing.
	if err := CopyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	sameTrees(t, src, dst)
}

func TestManifestJSON(t *testing.T) {
	m := Manifest{
		"a":        {Path: "a", Mode: fs.ModeDir | 0o755, MtimeNs: 1},
		"a/f":      {Path: "a/f", Mode: fs.ModeSetuid | 0o755, Size: 12, MtimeNs: -5, UID: 1, GID: 2},
		"bad\xffn": {Path: "bad\xffn", Mode: fs.ModeSymlink | 0o777, Size: 3, Link: "\xfe\xfd/"},
		"dev":      {Path: "dev", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, Dev: unix.Mkdev(1, 3)},
		"blk":      {Path: "blk", Mode: fs.ModeDevice | 0o600 | fs.ModeSetgid | fs.ModeSticky, Dev: 7},
		"s":        {Path: "s", Mode: fs.ModeSocket | 0o755},
		"p":        {Path: "p", Mode: fs.ModeNamedPipe | 0o644},
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("Path")) || bytes.Contains(data, []byte(`"u":0`)) {
		t.Errorf("not compact: %s", data)
	}
	var back Manifest
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, back) {
		t.Errorf("round trip:\n%+v\n%+v", m, back)
	}
	if err := json.Unmarshal([]byte(`[{"m":1}]`), &back); err == nil {
		t.Error("entry without path accepted")
	}
}

func TestDiffOrderAndQuickCheck(t *testing.T) {
	e := func(p string, mode fs.FileMode, size, mtime int64) Entry {
		return Entry{Path: p, Mode: mode, Size: size, MtimeNs: mtime}
	}
	have := Manifest{
		"d":            e("d", fs.ModeDir|0o755, 0, 1),
		"d/x":          e("d/x", fs.ModeDir|0o755, 0, 1),
		"d/x/y":        e("d/x/y", 0o644, 1, 1),
		"d-1":          e("d-1", 0o644, 1, 1),
		"same":         e("same", 0o644, 5, 9),
		"mode":         e("mode", 0o644, 5, 9),
		"totype":       e("totype", fs.ModeDir|0o755, 0, 1),
		"totype/child": e("totype/child", 0o644, 0, 1),
	}
	want := Manifest{
		"d":      e("d", fs.ModeDir|0o755, 0, 2),
		"d/n":    e("d/n", fs.ModeDir|0o755, 0, 1),
		"d/n/z":  e("d/n/z", 0o644, 1, 1),
		"d-1":    e("d-1", 0o644, 1, 1),
		"same":   e("same", 0o644, 5, 9),
		"mode":   e("mode", 0o600, 5, 9),
		"totype": e("totype", 0o644, 0, 1),
	}
	d := Diff(have, want)
	var changed []string
	for _, c := range d.Changed {
		changed = append(changed, c.Path)
	}
	if w := []string{"d", "d/n", "d/n/z", "mode", "totype"}; !reflect.DeepEqual(changed, w) {
		t.Errorf("changed %q, want %q", changed, w)
	}
	if w := []string{"totype/child", "d/x/y", "d/x"}; !reflect.DeepEqual(d.Removed, w) {
		t.Errorf("removed %q, want %q", d.Removed, w)
	}
	if got := comparePaths("a/b", "a-b"); got >= 0 {
		t.Errorf("a/b should sort before a-b")
	}
}

// tarOf builds a stream by hand, as an attacker would.
func tarOf(t testing.TB, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Format == tar.FormatUnknown {
			h.Format = tar.FormatPAX
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1, 0)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("E"), int(h.Size)))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestApplyRejectsTraversal(t *testing.T) {
	reg := func(name string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 4}
	}
	sym := func(name, target string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}
	}
	removal := func(name string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, PAXRecords: map[string]string{removedKey: "1"}}
	}
	cases := map[string][]*tar.Header{
		"dotdot":              {reg("../evil")},
		"dotdot inside":       {reg("a/../../evil")},
		"absolute":            {reg("/evil")},
		"dot":                 {{Name: "./", Typeflag: tar.TypeDir, Mode: 0o777}},
		"via new symlink":     {sym("esc", "../outside"), reg("esc/evil")},
		"via old symlink":     {reg("pre/evil")},
		"abs symlink dir":     {sym("abs", "/"), {Name: "abs/evil/", Typeflag: tar.TypeDir, Mode: 0o755}},
		"remove via symlink":  {removal("pre/secret")},
		"remove dotdot":       {removal("../outside/secret")},
		"hardlink outside":    {{Name: "stolen", Typeflag: tar.TypeLink, Linkname: "../outside/secret"}},
		"hardlink via link":   {{Name: "stolen", Typeflag: tar.TypeLink, Linkname: "pre/secret"}},
		"hardlink absolute":   {{Name: "stolen", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
		"fifo via symlink":    {{Name: "pre/evil", Typeflag: tar.TypeFifo, Mode: 0o644}},
		"symlink via symlink": {sym("pre/evil", "x")},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
			write(t, filepath.Join(outside, "secret"), []byte("secret"), 0o600)
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			symlink(t, outside, filepath.Join(root, "pre"))
			before := snapshot(t, base, root)
			_, err := ApplyDelta(bytes.NewReader(tarOf(t, entries...)), root)
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("got %v, want ErrUnsafePath", err)
			}
			if after := snapshot(t, base, root); after != before {
				t.Errorf("outside root changed:\n%s\n%s", before, after)
			}
			if _, err := os.Lstat(filepath.Join(root, "stolen")); err == nil {
				t.Error("hard link target copied")
			}
		})
	}
}

// snapshot describes base and everything under it except root, contents
// included.
func snapshot(t testing.TB, base, root string) string {
	var sb strings.Builder
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return filepath.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fmt.Fprintf(&sb, "%s %o %d:%d %d", p, st.Mode, st.Uid, st.Gid, st.Size)
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&sb, " %q", data)
		}
		fmt.Fprintf(&sb, " %d\n", st.Mtim.Nano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

func TestApplyReplacesTypes(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "dir/inner/f"), []byte("f"), 0o644)
	write(t, filepath.Join(root, "file"), []byte("f"), 0o644)
	symlink(t, "somewhere", filepath.Join(root, "link"))
	stream := tarOf(t,
		&tar.Header{Name: "dir", Typeflag: tar.TypeReg, Mode: 0o600, Size: 3},
		&tar.Header{Name: "file/", Typeflag: tar.TypeDir, Mode: 0o711},
		&tar.Header{Name: "link", Typeflag: tar.TypeFifo, Mode: 0o644},
		&tar.Header{Name: "file/hard", Typeflag: tar.TypeLink, Linkname: "dir", Mode: 0o640},
	)
	st, err := ApplyDelta(bytes.NewReader(stream), root)
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{Files: 3, Dirs: 1, Bytes: 6}) {
		t.Errorf("stats %+v", st)
	}
	m, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	if m["dir"].Mode != 0o600 || m["file"].Mode != fs.ModeDir|0o711 || m["link"].Mode != fs.ModeNamedPipe|0o644 ||
		m["file/hard"].Mode != 0o640 || m["file/hard"].Size != 3 {
		t.Errorf("manifest %+v", m)
	}
	if len(m) != 4 {
		t.Errorf("left over: %+v", m)
	}
}

func TestWriteDeltaNeverFollowsSwappedSymlinks(t *testing.T) {
	base := t.TempDir()
	src, dst, outside := filepath.Join(base, "src"), filepath.Join(base, "dst"), filepath.Join(base, "outside")
	write(t, filepath.Join(src, "d/f"), []byte("ok"), 0o644)
	write(t, filepath.Join(src, "g"), []byte("ok"), 0o644)
	write(t, filepath.Join(src, "h"), []byte("ok"), 0o644)
	write(t, filepath.Join(outside, "f"), []byte("secret"), 0o644)
	write(t, filepath.Join(outside, "g"), []byte("secret"), 0o644)
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	want, err := Scan(src)
	if err != nil {
		t.Fatal(err)
	}
	d := Diff(nil, want)
	// A running container swaps a directory and a file for symlinks to
	// host files and deletes another, between the scan and the send.
	if err := os.RemoveAll(filepath.Join(src, "d")); err != nil {
		t.Fatal(err)
	}
	symlink(t, outside, filepath.Join(src, "d"))
	os.Remove(filepath.Join(src, "g"))
	symlink(t, filepath.Join(outside, "g"), filepath.Join(src, "g"))
	os.Remove(filepath.Join(src, "h"))
	var buf bytes.Buffer
	if _, err := WriteDelta(&buf, src, d); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(buf.Bytes(), []byte("secret")) {
		t.Fatal("stream carries a file from outside the root")
	}
	if _, err := ApplyDelta(&buf, dst); err != nil {
		t.Fatal(err)
	}
	m, err := Scan(dst)
	if err != nil {
		t.Fatal(err)
	}
	if m["d"].Mode.Type() != fs.ModeSymlink || m["g"].Mode.Type() != fs.ModeSymlink {
		t.Errorf("sent %+v", m)
	}
	if _, ok := m["h"]; ok {
		t.Error("vanished file sent")
	}
}

// TestScanStopsAtMounts mounts a tmpfs inside the tree, in a mount namespace
// of a thread of its own so nothing leaks to the host.
func TestScanStopsAtMounts(t *testing.T) {
	testroot.Require(t, "needs root to mount")
	dir := t.TempDir()
	write(t, filepath.Join(dir, "mnt/under"), []byte("hidden by the mount"), 0o644)
	type result struct {
		m   Manifest
		err error
	}
	ch := make(chan result)
	go func() {
		// The thread stays locked, so it ends with the goroutine and takes
		// its mount namespace along.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			ch <- result{err: err}
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			ch <- result{err: err}
			return
		}
		if err := unix.Mount("tmpfs", filepath.Join(dir, "mnt"), "tmpfs", 0, "size=1m"); err != nil {
			ch <- result{err: err}
			return
		}
		if err := os.WriteFile(filepath.Join(dir, "mnt/inside"), []byte("x"), 0o644); err != nil {
			ch <- result{err: err}
			return
		}
		m, err := Scan(dir)
		ch <- result{m, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, ok := r.m["mnt"]; !ok {
		t.Error("mount point not recorded")
	}
	for p := range r.m {
		if strings.HasPrefix(p, "mnt/") {
			t.Errorf("descended into the mount: %s", p)
		}
	}
}

func BenchmarkScan(b *testing.B) {
	dir := b.TempDir()
	data := []byte("small file\n")
	for i := range 2000 {
		write(b, filepath.Join(dir, fmt.Sprintf("d%02d/f%04d", i%20, i)), data, 0o644)
	}
	b.ResetTimer()
	for b.Loop() {
		m, err := Scan(dir)
		if err != nil {
			b.Fatal(err)
		}
		if len(m) != 2020 {
			b.Fatalf("%d entries", len(m))
		}
	}
}

// Entries that vanish between the scan and the send are left out, and
// SendDelta names them: the receiver keeps its own version of each.
func TestSendDeltaNamesWhatItSkipped(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := Scan(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(src, "b")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	sent, err := SendDelta(&buf, src, Diff(Manifest{}, want), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(sent.Skipped) != 1 || sent.Skipped[0] != "b" || sent.Bytes != int64(buf.Len()) {
		t.Errorf("sent %+v (%d bytes written)", sent, buf.Len())
	}
	dst := t.TempDir()
	if _, err := ApplyDelta(&buf, dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, "b")); !os.IsNotExist(err) {
		t.Errorf("a skipped entry arrived: %v", err)
	}
}

func TestManifestDigest(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a", "f"), []byte("image"), 0o644)
	write(t, filepath.Join(dir, "b"), []byte("layer"), 0o600)
	a, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	da, err := a.Digest()
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Scan(dir)
	if d, _ := again.Digest(); d != da || !strings.HasPrefix(da, "sha256:") {
		t.Fatalf("digest of one tree: %s, then %s", da, d)
	}
	// Any described change names another tree: a file's size, a mode, a
	// new entry.
	for name, change := range map[string]func(Manifest){
		"size": func(m Manifest) { e := m["a/f"]; e.Size++; m["a/f"] = e },
		"mode": func(m Manifest) { e := m["a/f"]; e.Mode ^= 0o001; m["a/f"] = e },
		"new":  func(m Manifest) { m["zz"] = Entry{Path: "zz", Mode: 0o644} },
	} {
		m := maps.Clone(a)
		change(m)
		if d, _ := m.Digest(); d == da {
			t.Errorf("%s: digest unchanged", name)
		}
	}
}

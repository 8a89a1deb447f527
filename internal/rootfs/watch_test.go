package rootfs

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// watchedTree builds a small tree, starts watching it and scans the base
// Rescan brings up to date, as a migration's live sync does.
func watchedTree(t *testing.T, prepare ...func(root string)) (string, *Watcher, Manifest) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"etc", "var/lib/db", "var/log", "usr/bin", "old/deep/er"} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	for i, f := range []string{"etc/hostname", "var/lib/db/data", "var/log/app.log", "usr/bin/tool", "old/deep/er/file"} {
		must(t, os.WriteFile(filepath.Join(root, f), []byte(strings.Repeat("x", 10+i)), 0o644))
	}
	must(t, os.Symlink("../usr/bin/tool", filepath.Join(root, "etc/link")))
	for _, f := range prepare {
		f(root)
	}
	w, err := Watch(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	base, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	return root, w, base
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// rescanned checks that Rescan gives what a full scan gives now, and
// returns how it got there.
func rescanned(t *testing.T, root string, w *Watcher, base Manifest, extra ...string) RescanStats {
	t.Helper()
	c, st, err := w.Rescan(base, extra)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	// The delta from the changes alone is the one a full diff gives.
	if d, full := c.Delta(), Diff(base, want); !reflect.DeepEqual(d, full) && !(d.Empty() && full.Empty()) {
		t.Errorf("delta from the changes %+v, from a full diff %+v", d, full)
	}
	got := c.Manifest()
	if !reflect.DeepEqual(got, want) {
		for p, e := range want {
			if g, ok := got[p]; !ok || g != e {
				t.Errorf("%s: rescan has %+v (%v), a scan %+v", p, g, ok, e)
			}
		}
		for p := range got {
			if _, ok := want[p]; !ok {
				t.Errorf("%s: rescan has it, a scan does not", p)
			}
		}
	}
	return st
}

func TestRescanFollowsChanges(t *testing.T) {
	root, w, base := watchedTree(t)
	at := func(p string) string { return filepath.Join(root, p) }
	must(t, os.WriteFile(at("etc/hostname"), []byte("other\n"), 0o644))                // content and size
	must(t, os.Chmod(at("usr/bin/tool"), 0o700))                                       // metadata
	must(t, os.Chtimes(at("var/log/app.log"), time.Unix(1000, 0), time.Unix(1000, 0))) // mtime only
	must(t, os.MkdirAll(at("new/a/b"), 0o755))                                         // a new subtree
	must(t, os.WriteFile(at("new/a/b/f"), []byte("f"), 0o644))
	must(t, os.Remove(at("var/lib/db/data")))                    // a file gone
	must(t, os.RemoveAll(at("old")))                             // a subtree gone
	must(t, os.Rename(at("var/log/app.log"), at("etc/app.log"))) // a file moved
	must(t, os.Remove(at("etc/link")))                           // a symlink retargeted
	must(t, os.Symlink("/elsewhere", at("etc/link")))
	must(t, os.RemoveAll(at("usr/bin")))                         // a directory replaced...
	must(t, os.Mkdir(at("usr/bin"), 0o755))                      // ...by a new one
	must(t, os.WriteFile(at("usr/bin/sh"), []byte("#!"), 0o755)) // whose contents no watch saw
	must(t, unix.Mkfifo(at("var/lib/db/fifo"), 0o600))
	if st := rescanned(t, root, w, base); st.Full != "" || st.Subtrees != 2 {
		t.Errorf("stats %+v, want no full walk and two subtrees (new, usr/bin)", st)
	}
}

func TestRescanWithNothingChanged(t *testing.T) {
	root, w, base := watchedTree(t)
	if st := rescanned(t, root, w, base); st.Full != "" || st.Paths != 0 {
		t.Errorf("stats %+v, want nothing looked at", st)
	}
}

// A watched directory moved: the watches below it name the old paths, so
// only a full walk is safe.
func TestRescanWalksAfterADirectoryMoved(t *testing.T) {
	root, w, base := watchedTree(t)
	must(t, os.Rename(filepath.Join(root, "var/lib"), filepath.Join(root, "lib")))
	must(t, os.WriteFile(filepath.Join(root, "lib/db/data"), []byte("changed in its new place"), 0o644))
	if st := rescanned(t, root, w, base); !strings.Contains(st.Full, "var/lib was moved") {
		t.Errorf("stats %+v, want a full walk because var/lib moved", st)
	}
}

// A changed file with two names: the other name changed too, unreported.
func TestRescanWalksForHardLinks(t *testing.T) {
	root, w, base := watchedTree(t)
	must(t, os.Link(filepath.Join(root, "etc/hostname"), filepath.Join(root, "var/log/alias")))
	f, err := os.OpenFile(filepath.Join(root, "var/log/alias"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.WriteString("more")
	must(t, err)
	must(t, f.Close())
	if st := rescanned(t, root, w, base); !strings.Contains(st.Full, "links") {
		t.Errorf("stats %+v, want a full walk because of the hard link", st)
	}
}

// A write through a shared mapping raises no event: the caller names the
// file, and Rescan looks at it.
func TestRescanLooksAtExtraPaths(t *testing.T) {
	const rel = "var/lib/db/data"
	root, w, base := watchedTree(t, func(root string) {
		// An old mtime, so that the mapping's write shows in a stat.
		must(t, os.Chtimes(filepath.Join(root, rel), time.Unix(1000, 0), time.Unix(1000, 0)))
	})
	f, err := os.OpenFile(filepath.Join(root, rel), os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, 8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	must(t, err)
	copy(mem, "mmapped!")
	must(t, unix.Msync(mem, unix.MS_SYNC))
	must(t, unix.Munmap(mem))
	w.stopReader()
	must(t, w.drain())
	if len(w.dirty) != 0 {
		t.Fatalf("a write through a shared mapping raised events: %v", w.dirty)
	}
	if st := rescanned(t, root, w, base, rel); st.Full != "" || st.Paths != 1 {
		t.Errorf("stats %+v, want the one extra path looked at", st)
	}
}

// Random changes, many rounds: a rescan always equals a full scan.
func TestRescanRandomChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 30 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			root, w, base := watchedTree(t)
			var files, dirs []string
			for p, e := range base {
				switch {
				case e.Mode.IsDir():
					dirs = append(dirs, p)
				case e.Mode.IsRegular():
					files = append(files, p)
				}
			}
			slices.Sort(files)
			slices.Sort(dirs)
			for i := range 20 {
				at := func(p string) string { return filepath.Join(root, p) }
				d := dirs[rng.IntN(len(dirs))]
				switch rng.IntN(6) {
				case 0:
					name := fmt.Sprintf("%s/f%d", d, i)
					_ = os.WriteFile(at(name), []byte(strings.Repeat("y", rng.IntN(100))), 0o644)
					files = append(files, name)
				case 1:
					name := fmt.Sprintf("%s/d%d", d, i)
					if os.MkdirAll(at(name+"/x"), 0o755) == nil {
						_ = os.WriteFile(at(name+"/x/g"), []byte("g"), 0o644)
					}
				case 2:
					if len(files) > 0 {
						_ = os.Remove(at(files[rng.IntN(len(files))]))
					}
				case 3:
					if len(files) > 0 {
						_ = os.WriteFile(at(files[rng.IntN(len(files))]), []byte(strings.Repeat("z", rng.IntN(100))), 0o644)
					}
				case 4:
					if len(files) > 0 {
						_ = os.Rename(at(files[rng.IntN(len(files))]), at(fmt.Sprintf("%s/moved%d", d, i)))
					}
				case 5:
					_ = os.Chmod(at(d), 0o700+os.FileMode(rng.IntN(0o77)))
				}
			}
			if st := rescanned(t, root, w, base); st.Full != "" {
				t.Errorf("a full walk for plain changes: %s", st.Full)
			}
		})
	}
}

func TestWatchOverflowMeansAFullWalk(t *testing.T) {
	root, w, base := watchedTree(t)
	w.stopReader()
	w.event(-1, unix.IN_Q_OVERFLOW, "")
	if st := rescanned(t, root, w, base); !strings.Contains(st.Full, "overflowed") {
		t.Errorf("stats %+v, want a full walk after an overflow", st)
	}
}

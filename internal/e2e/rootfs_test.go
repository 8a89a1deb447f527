package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/units"
)

// requireDebian skips where no Debian root filesystem can be had.
func requireDebian(t *testing.T) {
	t.Helper()
	if err := lab.DebianMirrorReachable(context.Background(), lab.DebianOptions{}, 5*time.Second); err != nil {
		if _, cerr := os.Stat((lab.DebianOptions{}).Path()); cerr != nil {
			t.Skipf("no cached Debian rootfs and the mirror is unreachable (%v): cannot build a real root filesystem here", err)
		}
	}
}

// TestOwnLayerMoves moves a container whose root is an overlay over the
// Debian image (the image on both hosts, below their --image-root) there
// and back: only its own layer travels, and what it changed arrives as
// overlayfs means it: a new file, a file of the image deleted (a
// whiteout), a directory of the image replaced (an opaque directory).
func TestOwnLayerMoves(t *testing.T) {
	requireLab(t)
	requireDebian(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	const name = "layered"
	if err := l.RunWith(ctx, "h1", name, lab.RunOptions{Rootfs: lab.RootfsDebian},
		[]string{"/usr/local/bin/memhog", "--memory", "64M", "--dirty-rate", "200", "--port", memhogPort}); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(l.Hosts[0].BundleDir(name), "rootfs")
	ov, err := mounts.OverlayAt(root)
	if err != nil || ov == nil {
		t.Fatalf("the lab's Debian root is no overlay: %+v %v", ov, err)
	}
	image := ov.Lower
	if err := os.WriteFile(filepath.Join(root, "srv", "own"), []byte("the container's own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "etc", "debian_version")); err != nil {
		t.Fatal(err)
	}
	replaced := filepath.Join(root, "usr", "share", "doc")
	if err := os.RemoveAll(replaced); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(replaced, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(replaced, "only"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, _, err := bench.StartProbe(ctx, &l.Hosts[2], bin,
		[]string{l.Hosts[0].Addr + ":" + memhogPort, l.Hosts[1].Addr + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	from, to := &l.Hosts[0], &l.Hosts[1]
	for _, mode := range []string{engine.ModeCold, engine.ModePrecopy} {
		rep := moveOK(t, from, to, name, mode)
		t.Logf("%s %s -> %s: downtime %.0f ms, total %.0f ms, rootfs %d bytes in %d entries", mode, from.Name, to.Name, rep.DowntimeMs, rep.TotalMs, rep.RootfsBytes, rep.RootfsEntries)
		// The image is some 190 MB in about 9,000 entries; the layer is
		// memhog and a handful of files.
		if rep.RootfsEntries > 200 || rep.RootfsBytes > 32<<20 {
			t.Errorf("%s: %d bytes in %d entries moved: more than the container's own layer", mode, rep.RootfsBytes, rep.RootfsEntries)
		}
		if left, _ := mounts.Under(from.BundleDir(name)); len(left) > 0 {
			t.Errorf("%s: the source's bundle is still mounted: %v", mode, left)
		}
		root := filepath.Join(to.BundleDir(name), "rootfs")
		if ov, err := mounts.OverlayAt(root); err != nil || ov == nil || !slices.Equal(ov.Lower, image) {
			t.Fatalf("%s: the destination's root is not an overlay over the image %v: %+v %v", mode, image, ov, err)
		}
		if b, err := os.ReadFile(filepath.Join(root, "srv", "own")); err != nil || string(b) != "the container's own\n" {
			t.Errorf("%s: the layer's new file: %q %v", mode, b, err)
		}
		if _, err := os.Lstat(filepath.Join(root, "etc", "debian_version")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: a file the container deleted is back: %v", mode, err)
		}
		if ents, err := os.ReadDir(filepath.Join(root, "usr", "share", "doc")); err != nil || len(ents) != 1 || ents[0].Name() != "only" {
			t.Errorf("%s: the replaced directory holds %v (%v), want only what the container put there", mode, ents, err)
		}
		from, to = to, from
	}
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload state: %+v %v", pr, perr)
	}
}

// TestLargeRootfs moves a container with a real Debian root filesystem
// plus 50,000 more files and a 200 MB file (over 60,000 entries: its
// manifest is several control frames long) there and back, checking
// memhog's state and the big file each time.
func TestLargeRootfs(t *testing.T) {
	requireLab(t)
	requireDebian(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	const name = "bigroot"
	// The whole tree moves: a copy of the image, not an overlay over it.
	if err := l.RunWith(ctx, "h1", name, lab.RunOptions{Rootfs: lab.RootfsDebian, CopyImage: true},
		[]string{"/usr/local/bin/memhog", "--memory", "64M", "--dirty-rate", "200", "--port", memhogPort}); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(l.Hosts[0].BundleDir(name), "rootfs")
	data := filepath.Join(root, "data")
	for d := 0; d < 50; d++ {
		dir := filepath.Join(data, fmt.Sprintf("d%02d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := 0; f < 1000; f++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", f)), []byte(fmt.Sprintf("%d/%d\n", d, f)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	big := make([]byte, 200<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(filepath.Join(data, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	p, st, err := bench.StartProbe(ctx, &l.Hosts[2], bin,
		[]string{l.Hosts[0].Addr + ":" + memhogPort, l.Hosts[1].Addr + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := units.ParseBytes("64M"); int64(st.MemoryBytes) != want {
		t.Fatalf("memhog holds %d bytes", st.MemoryBytes)
	}
	from, to := &l.Hosts[0], &l.Hosts[1]
	// Cold (a streamed dump) and hybrid (rounds, a lazy dump): every
	// technique's rootfs sync is the same code. Each leg writes 60,000
	// files at the destination, about a minute on this machine's disk, so
	// the other modes are measured by hand (docs/BENCHMARKS.md).
	for _, mode := range []string{engine.ModeCold, engine.ModeHybrid} {
		rep := moveOK(t, from, to, name, mode)
		t.Logf("%s %s -> %s: downtime %.0f ms, total %.0f ms, bytes %d, frozen rootfs scan: %s", mode, from.Name, to.Name, rep.DowntimeMs, rep.TotalMs, rep.BytesSent, rep.FrozenRootfsScan)
		// The frozen pass looked only at what the watch saw change.
		if !strings.HasSuffix(rep.FrozenRootfsScan, " changed paths") {
			t.Errorf("%s: the frozen rootfs sync walked the tree: %q", mode, rep.FrozenRootfsScan)
		}
		got, err := os.ReadFile(filepath.Join(to.BundleDir(name), "rootfs", "data", "big"))
		if err != nil || len(got) != len(big) || string(got[len(got)-4096:]) != string(big[len(big)-4096:]) {
			t.Fatalf("%s: the 200 MB file did not arrive whole (%d bytes, %v)", mode, len(got), err)
		}
		if n := countFiles(t, filepath.Join(to.BundleDir(name), "rootfs")); n < 60000 {
			t.Fatalf("%s: %d entries arrived, want over 60,000", mode, n)
		}
		from, to = to, from
	}
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload state: %+v %v", pr, perr)
	}
}

// moveOK migrates name from one lab host to another and fails the test
// unless the migration succeeded.
func moveOK(t *testing.T, from, to *lab.Host, name, mode string) engine.Report {
	t.Helper()
	rep, err := client.Migrate(context.Background(), client.Socket(from.ControlSock), engine.Request{Container: name, To: to.AgentAddr, Mode: mode}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("%s %s -> %s: %s (at %s)", mode, from.Name, to.Name, rep.Error, rep.FailedAt)
	}
	return rep
}

func countFiles(t *testing.T, root string) int {
	t.Helper()
	n := 0
	if err := filepath.WalkDir(root, func(string, os.DirEntry, error) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTmpfsMountsMove moves a container's tmpfs mounts both ways CRIU
// now dumps them: /dev/shm with a file in it (archived), then without
// (an empty tmpfs is its mount alone, scripts/criu-patches/0005); the
// masked /proc/acpi stays an empty read-only tmpfs whose root is 1777.
func TestTmpfsMountsMove(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	const name = "shm"
	if err := l.Run(ctx, "h1", name, []string{"/bin/memhog", "--memory", "16M", "--dirty-rate", "100", "--port", memhogPort}); err != nil {
		t.Fatal(err)
	}
	root := func(h *lab.Host) string {
		t.Helper()
		st, err := h.Runc().State(ctx, name)
		if err != nil || st.Status != "running" {
			t.Fatalf("%s on %s: %+v %v", name, h.Name, st, err)
		}
		return fmt.Sprintf("/proc/%d/root", st.Pid)
	}
	emptyTmpfs := func(h *lab.Host, dir string) {
		t.Helper()
		p := filepath.Join(root(h), dir)
		ents, err := os.ReadDir(p)
		if err != nil || len(ents) != 0 {
			t.Errorf("%s on %s: %d entries, %v; want an empty directory", dir, h.Name, len(ents), err)
		}
		if st, err := os.Stat(p); err != nil || st.Mode().Perm()|st.Mode()&fs.ModeSticky != 0o777|fs.ModeSticky {
			t.Errorf("%s on %s: mode %v, %v; want 1777", dir, h.Name, st.Mode(), err)
		}
	}
	shm := filepath.Join(root(&l.Hosts[0]), "dev", "shm", "kept")
	if err := os.WriteFile(shm, []byte("in /dev/shm\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	moveOK(t, &l.Hosts[0], &l.Hosts[1], name, engine.ModePostcopy)
	kept := filepath.Join(root(&l.Hosts[1]), "dev", "shm", "kept")
	if b, err := os.ReadFile(kept); err != nil || string(b) != "in /dev/shm\n" {
		t.Errorf("/dev/shm/kept after the move: %q, %v", b, err)
	}
	emptyTmpfs(&l.Hosts[1], "proc/acpi")
	if err := os.Remove(kept); err != nil {
		t.Fatal(err)
	}
	moveOK(t, &l.Hosts[1], &l.Hosts[0], name, engine.ModeCold)
	emptyTmpfs(&l.Hosts[0], "dev/shm")
	emptyTmpfs(&l.Hosts[0], "proc/acpi")
	if err := os.WriteFile(filepath.Join(root(&l.Hosts[0]), "dev", "shm", "new"), nil, 0o600); err != nil {
		t.Errorf("/dev/shm is not writable after the move: %v", err)
	}
}

package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// withVolume gives the fake source's container a volume "data" at /data
// holding one file, and returns its directory.
func withVolume(t *testing.T, r *sourceRun) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "table"), []byte(strings.Repeat("row\n", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	r.src.ctr.Volumes = []runtime.Volume{{Name: "data", Path: "/data", Dir: dir}}
	return dir
}

// TestSourceMovesVolumes: a volume syncs live and frozen as the root
// filesystem does, on its own channels, lands where the destination's
// runtime keeps it, and goes with the source copy after the commit
// unless kept.
func TestSourceMovesVolumes(t *testing.T) {
	for _, mode := range []string{ModeCold, ModePrecopy} {
		for _, keep := range []bool{false, true} {
			pid := sleeper(t)
			r := newSourceRun(t, func(r *sourceRun) { r.src.ctr.PID = pid })
			src := withVolume(t, r)
			r.src.beforeFreeze = func() {
				if err := os.WriteFile(filepath.Join(src, "written-late"), []byte("late\n"), 0o644); err != nil {
					t.Error(err)
				}
			}
			rep := r.s.Migrate(t.Context(), Request{Container: "web", To: "h2@127.0.0.1:1", Mode: mode, Runtime: "fake", KeepVolumes: keep,
				Precopy: PrecopyOptions{Engine: PrecopyContent, MaxRounds: 2}}, nil)
			if !rep.OK {
				t.Fatalf("%s: migration failed at %s: %s", mode, rep.FailedAt, rep.Error)
			}
			dst, err := r.rt.target(t).VolumeDir("data")
			if err != nil {
				t.Fatal(err)
			}
			for file, want := range map[string]string{"table": strings.Repeat("row\n", 1000), "written-late": "late\n"} {
				if b, err := os.ReadFile(filepath.Join(dst, file)); err != nil || string(b) != want {
					t.Errorf("%s: the destination's volume %s: %d bytes, %v", mode, file, len(b), err)
				}
			}
			if len(rep.Volumes) != 1 {
				t.Fatalf("%s: report's volumes %+v", mode, rep.Volumes)
			}
			v := rep.Volumes[0]
			if v.Name != "data" || v.Path != "/data" || v.Bytes < 4000 || v.FrozenBytes < 512 || !strings.HasSuffix(v.FrozenScan, "changed paths") {
				t.Errorf("%s: report's volume %+v", mode, v)
			}
			if rep.RootfsBytes == 0 || rep.RootfsBytes == v.Bytes {
				t.Errorf("%s: the root filesystem's bytes %d, the volume's %d: mixed up", mode, rep.RootfsBytes, v.Bytes)
			}
			if got := r.src.removed; got == nil || (len(got.Volumes) == 1) == keep {
				t.Errorf("%s, keep volumes %v: the source removed %+v", mode, keep, got)
			}
			if p := r.rt.prepared[0]; len(p.Volumes) != 1 || p.Volumes[0].Name != "data" || p.Volumes[0].Dir != "" || p.Volumes[0].Bytes != 4000 {
				t.Errorf("%s: the destination's runtime was given volumes %+v", mode, p.Volumes)
			}
			if e := r.journaled(rep.ID); len(e.Volumes) != 1 || e.Volumes[0] != "data" {
				t.Errorf("%s: the destination's journal names volumes %v", mode, e.Volumes)
			}
		}
	}
}

// TestVolumeTooBigIsRefused: volumes the destination's filesystem cannot
// hold are refused before anything is frozen, and what was prepared for
// them is discarded.
func TestVolumeTooBigIsRefused(t *testing.T) {
	r := newSourceRun(t)
	dir := withVolume(t, r)
	// A sparse file counts as what it would take once copied.
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Skipf("no sparse file of 1 TiB here: %v", err)
	}
	f.Close()
	rep := r.migrate(ModeCold)
	if rep.OK || !strings.Contains(rep.Error, "volumes data need") || rep.FrozenMs != 0 {
		t.Fatalf("report: ok=%v frozen %.0f ms: %s", rep.OK, rep.FrozenMs, rep.Error)
	}
	r.calls()
	r.returned() // the destination discards as it returns, after the source's report
	r.want(counts{prepared: 1, discarded: 1})
}

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		p, dir, want string
		ok           bool
	}{
		{"/data/journal", "/data", "journal", true},
		{"/data/a/b", "/data/", "a/b", true},
		{"/database", "/data", "", false},
		{"/data", "/data", "", false},
		{"/etc/hosts", "/", "etc/hosts", true},
	} {
		if got, ok := within(c.p, c.dir); got != c.want || ok != c.ok {
			t.Errorf("within(%q, %q) = %q %v, want %q %v", c.p, c.dir, got, ok, c.want, c.ok)
		}
	}
}

package calibrate

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/fit/fittest"
	"github.com/ferry-migrate/ferry/internal/model"
)

// fakeBench measures a point with fittest.Bench, saying the bench's
// steps as the lab's bench would.
func fakeBench(p model.Profile, noise float64) Runner {
	runs := fittest.Bench(p, noise)
	return func(_ context.Context, o bench.MigrateOptions) (bench.MigrateResult, error) {
		if o.Log != nil {
			_, _ = o.Log.Write([]byte("bench: bringing up a lab\nbench: run 1/1\n"))
		}
		return runs(o.Mode, o.MemoryBytes, o.DirtyRate, o.BandwidthBps, o.Repeat), nil
	}
}

func noFeatures(context.Context) criu.Features { return criu.Features{} }

func TestRunRecoversProfile(t *testing.T) {
	t.Run("rebuild switchover", func(t *testing.T) {
		want := fittest.Truth()
		want.LazyDump = true
		testRecovers(t, want)
	})
	t.Run("full-dump switchover", func(t *testing.T) { testRecovers(t, fittest.Truth()) })
}

func testRecovers(t *testing.T, want model.Profile) {
	var seen []Progress
	p, rep, err := Run(context.Background(), Options{Run: fakeBench(want, 0), Features: noFeatures, FerryBin: "/bin/true",
		Progress: func(pr Progress) { seen = append(seen, pr) }})
	if err != nil {
		t.Fatal(err)
	}
	fittest.Near(t, "FreezeS", p.FreezeS, want.FreezeS, 1e-9)
	fittest.Near(t, "ReadHashBps", p.ReadHashBps, want.ReadHashBps, 1e-9)
	fittest.Near(t, "FrozenReadBps", p.FrozenReadBps, want.FrozenReadBps, 1e-9)
	fittest.Near(t, "DumpFixedS", p.DumpFixedS, want.DumpFixedS, 1e-9)
	fittest.Near(t, "DumpBps", p.DumpBps, want.DumpBps, 1e-9)
	fittest.Near(t, "RestoreFixedS", p.RestoreFixedS, want.RestoreFixedS, 1e-9)
	fittest.Near(t, "RestoreBps", p.RestoreBps, want.RestoreBps, 1e-9)
	fittest.Near(t, "LazySetupS", p.LazySetupS, want.LazySetupS, 1e-9)
	fittest.Near(t, "LazyBps", p.LazyBps, want.LazyBps, 1e-3)
	fittest.Near(t, "LazyRequestS", p.LazyRequestS, want.LazyRequestS, 1e-3)
	fittest.Near(t, "FaultS", p.FaultS, want.FaultS, 1e-3)
	fittest.Near(t, "LazySerialShare", p.LazySerialShare, want.LazySerialShare, 1e-3)
	fittest.Near(t, "LocalFillBps", p.LocalFillBps, want.LocalFillBps, 1e-6)
	if want.LazyDump {
		fittest.Near(t, "ImageFillBps", p.ImageFillBps, want.ImageFillBps, 1e-6)
	} else if len(rep.Warnings) == 1 && strings.HasPrefix(rep.Warnings[0], "image-fill:") {
		rep.Warnings = nil // no rebuild switchover measured: the default stays
	}
	fittest.Near(t, "RedirtyRatio", p.RedirtyRatio, want.RedirtyRatio, 1e-9)
	fittest.Near(t, "LinkEfficiency", p.LinkEfficiency, want.LinkEfficiency, 1e-9)
	if p.PAM.Beta != p.FreezeS || p.PAM.Psi != p.RestoreFixedS {
		t.Errorf("PAM's β and ψ not taken from the profile: %+v", p.PAM)
	}
	if len(rep.Warnings) != 0 {
		t.Errorf("warnings: %v", rep.Warnings)
	}
	if rep.Grid != "default" || len(rep.Points) != len(Grid(Options{})) {
		t.Errorf("grid %q with %d points", rep.Grid, len(rep.Points))
	}
	for _, term := range rep.Terms {
		if len(term.Fit.Residuals) != len(term.Y) || len(term.X) != len(term.Y) {
			t.Errorf("%s: %d residuals for %d points", term.Name, len(term.Fit.Residuals), len(term.Y))
		}
		if term.Kind == "line" && term.Fit.R2 < 0.999999 {
			t.Errorf("%s: R² %v on exact data", term.Name, term.Fit.R2)
		}
	}
	if got := p.SetupS; math.Abs(got-0.053) > 0.001 {
		t.Errorf("setup_s %.4f, want 0.053 (prepare + rootfs-sync + commit of the fake runs)", got)
	}
	if len(seen) == 0 || seen[len(seen)-1].Done != seen[len(seen)-1].Total {
		t.Fatalf("progress never reached the end: %+v", seen)
	}
	stepped := false
	for _, s := range seen {
		stepped = stepped || s.Step == "run 1/1"
	}
	if !stepped {
		t.Error("the bench's step lines never reached the progress callback")
	}
}

func TestFitWithNoise(t *testing.T) {
	want := fittest.Truth()
	_, rep, err := Run(context.Background(), Options{Quick: true, Repeat: 3, Run: fakeBench(want, 0.01), Features: noFeatures})
	if err != nil {
		t.Fatal(err)
	}
	for _, term := range rep.Terms {
		if term.Name == "dump" && !(term.Fit.R2 > 0.9 && term.Fit.R2 < 1) {
			t.Errorf("dump R² %v with noise", term.Fit.R2)
		}
		if term.Name == "dump" && !strings.Contains(term.Note, "cold's streamed dump") {
			t.Errorf("dump note lacks the per-mode fits: %q", term.Note)
		}
	}
}

func TestSweepStopsOnBenchError(t *testing.T) {
	calls := 0
	run := func(context.Context, bench.MigrateOptions) (bench.MigrateResult, error) {
		calls++
		if calls == 2 {
			return bench.MigrateResult{}, errors.New("a ferry lab is already up")
		}
		return bench.MigrateResult{Runs: []bench.Run{{OK: false, Error: "restore failed"}}}, nil
	}
	ms, err := sweep(context.Background(), Grid(Options{Quick: true}), sweepConfig{Repeat: 1, Run: run})
	if err == nil || !strings.Contains(err.Error(), "already up") {
		t.Fatalf("got %v", err)
	}
	if calls != 2 || len(ms) != 2 {
		t.Fatalf("%d calls, %d results", calls, len(ms))
	}
	if !strings.Contains(ms[0].Error, "restore failed") {
		t.Errorf("failed runs not recorded: %q", ms[0].Error)
	}
}

func TestGrids(t *testing.T) {
	modes := len(calibratedModes)
	// Every mode at 4 sizes x 2 rates, post-copy at 3000 pages/s too, the
	// shaped pre-copy, the shaped post-copy at the lowest rate, 1000 and 3000.
	if n := len(Grid(Options{})); n != 4*2*modes+4+1+3 {
		t.Errorf("default grid: %d points", n)
	}
	q := Grid(Options{Quick: true})
	if len(q) != 2*1*modes+1+1 {
		t.Errorf("quick grid: %d points", len(q))
	}
	shaped := q[len(q)-2]
	if shaped.BandwidthBps != DefaultShapedBps || shaped.MemoryBytes != 64<<20 || len(shaped.Baselines) != 1 {
		t.Errorf("shaped point: %+v", shaped)
	}
	if last := q[len(q)-1]; last.Mode != model.ModePostcopy || last.BandwidthBps != DefaultShapedBps || last.DirtyRate != 100 {
		t.Errorf("shaped post-copy point: %+v", last)
	}
	g := Grid(Options{})
	if sp := g[4*2*modes+4]; sp.MemoryBytes != 128<<20 || sp.DirtyRate != 0 || sp.BandwidthBps == 0 {
		t.Errorf("default shaped point: %+v", sp)
	}
	if last := g[len(g)-1]; last.Mode != model.ModePostcopy || last.DirtyRate != 3000 || last.BandwidthBps == 0 {
		t.Errorf("default shaped post-copy points end with: %+v", last)
	}
	if n := len(ValidationGrid(ValidateOptions{})); n != 24 {
		t.Errorf("validation grid: %d points", n)
	}
	if n := len(ValidationGrid(ValidateOptions{Quick: true})); n != 8 {
		t.Errorf("quick validation grid: %d points", n)
	}
	v := ValidationGrid(ValidateOptions{Modes: []string{"cold"}, Memories: []int64{1, 2}, Bandwidths: []int64{3, 4, 5}})
	if len(v) != 6 || v[0].DirtyRate != rateLow {
		t.Errorf("custom validation grid: %+v", v)
	}
	// No validation point repeats a calibration point.
	cal := map[string]bool{}
	for _, p := range append(Grid(Options{}), Grid(Options{Quick: true})...) {
		cal[p.String()] = true
	}
	for _, p := range ValidationGrid(ValidateOptions{}) {
		if cal[p.String()] {
			t.Errorf("validation point %s was used for calibration", p)
		}
	}
}

func TestLineWriter(t *testing.T) {
	var got []string
	w := &lineWriter{fn: func(s string) { got = append(got, s) }}
	_, _ = w.Write([]byte("a\nb"))
	_, _ = w.Write([]byte("c\n\nd"))
	if strings.Join(got, "|") != "a|bc|" {
		t.Errorf("got %q", got)
	}
}

func TestRefit(t *testing.T) {
	want := fittest.Truth()
	_, rep, err := Run(context.Background(), Options{Quick: true, Run: fakeBench(want, 0), Features: noFeatures})
	if err != nil {
		t.Fatal(err)
	}
	rep.Terms, rep.Profile = nil, model.Profile{}
	p, again, err := Refit(context.Background(), rep, Options{Features: noFeatures})
	if err != nil {
		t.Fatal(err)
	}
	// The quick grid runs at one dirty rate only: the fault time keeps its
	// default, the round trip and rate absorb the difference.
	fittest.Near(t, "FaultS", p.FaultS, model.DefaultProfile().FaultS, 1e-9)
	for _, m := range []float64{64 << 20, 256 << 20} {
		fittest.Near(t, "pull", p.LazyPull(m, 0, 100), want.LazyPull(m, 0, 100), 0.01)
	}
	if len(again.Terms) == 0 || !reflect.DeepEqual(again.Profile, p) {
		t.Error("the report was not refitted")
	}
}

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
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/model"
)

// truth is the host the fake bench pretends to measure.
func truth() model.Profile {
	p := model.DefaultProfile()
	p.FreezeS = 0.004
	p.DumpFixedS = 0.12
	p.DumpBps = 500e6
	p.ReadHashBps = 3e9
	p.RestoreFixedS = 0.15
	p.RestoreBps = 2e9
	p.LazySetupS = 0.08
	p.LazyBps = 300e6
	p.LazyRequestS = 0.0004
	p.LazySerialShare = 0.3
	p.FaultS = 0.0005
	p.FaultWaitS = 0 // writes fault freely; TestFitFaultWait covers the bound
	p.LocalFillBps = 700e6
	p.ImageFillBps = 1.5e9
	p.FrozenReadBps = 4e9
	p.LazyDump = false // pre-copy switches over with a full dump unless a test says otherwise
	p.RedirtyRatio = 0.05
	p.LinkEfficiency = 0.9
	return p
}

// phases lays spans end to end.
type phases struct {
	t    float64
	list []engine.PhaseSpan
}

func (ps *phases) add(name string, s float64) {
	ps.list = append(ps.list, engine.PhaseSpan{Name: name, StartMs: ps.t * 1000, EndMs: (ps.t + s) * 1000})
	ps.t += s
}

// fakeBench produces runs whose phases follow the profile exactly: what
// the engine would report if the model's form were the truth. noise adds
// a deterministic wobble of that many seconds to the memory-dependent
// phases.
func fakeBench(p model.Profile, noise float64) Runner {
	k := 0
	return func(_ context.Context, o bench.MigrateOptions) (bench.MigrateResult, error) {
		res := bench.MigrateResult{Mode: o.Mode, MemoryBytes: o.MemoryBytes, DirtyRate: o.DirtyRate, BandwidthBps: o.BandwidthBps}
		m := float64(o.MemoryBytes)
		wire := 0.0 // unshaped: the link costs nothing
		if o.BandwidthBps > 0 {
			wire = m / (p.LinkEfficiency * float64(o.BandwidthBps) / 8)
			res.Baselines.Link = &bench.LinkBaseline{ThroughputBps: 0.95 * float64(o.BandwidthBps)}
		}
		if o.Log != nil {
			_, _ = o.Log.Write([]byte("bench: bringing up a lab\nbench: run 1/1\n"))
		}
		for range max(o.Repeat, 1) {
			k++
			wob := noise * float64(k%3-1)
			var ps phases
			r := bench.Run{OK: true, StateOK: true}
			ps.add("prepare", 0.02)
			ps.add("rootfs-sync", 0.03)
			switch o.Mode {
			case "cold":
				ps.add("freeze", p.FreezeS)
				ps.add("dump", p.DumpFixedS-0.01+m/p.DumpBps+wob)
				ps.add("images", 0.01)
				ps.add("restore", p.RestoreFixedS+m/p.RestoreBps-wob)
				r.RestoreMs = (p.RestoreFixedS - 0.05 + m/p.RestoreBps) * 1000
				ps.add("commit", 0.005)
			case "precopy":
				d0 := m/p.ReadHashBps + wire + wob
				d1 := m/p.ReadHashBps - wob
				ps.add("round-0", d0)
				ps.add("round-1", d1)
				r.Rounds = []engine.Round{{Index: 0, DurationMs: d0 * 1000, Bytes: o.MemoryBytes},
					{Index: 1, DurationMs: d1 * 1000, Bytes: 1 << 20, Pages: 256, RawBytes: 256 * 4096},
					{Index: 2, DurationMs: d1 * 1000, Bytes: 1 << 10, Pages: 100, RawBytes: int64(100 * 4096 * p.RedirtyRatio)}}
				ps.add("freeze", p.FreezeS)
				if p.LazyDump {
					// Rebuild: a memory-less dump alongside the frozen last
					// round, the image fill, then the restore.
					r.Rounds = append(r.Rounds, engine.Round{Index: 3, DurationMs: m / p.FrozenReadBps * 1000, Final: true})
					ps.add("dump", max(p.DumpFixedS-0.01, m/p.FrozenReadBps))
					ps.add("images", 0.01)
					r.FillMs = m / p.ImageFillBps * 1000
					ps.add("restore", m/p.ImageFillBps+p.RestoreFixedS+m/p.RestoreBps)
				} else {
					ps.add("dump", p.DumpFixedS-0.01+m/p.DumpBps+m/p.ReadHashBps+wob)
					ps.add("images", 0.01)
					ps.add("restore", p.RestoreFixedS+m/p.RestoreBps)
				}
				ps.add("commit", 0.005)
			case "postcopy":
				ps.add("freeze", p.FreezeS)
				ps.add("dump", p.DumpFixedS)
				ps.add("restore", p.RestoreFixedS+p.LazySetupS)
				ps.add("commit", 0.005)
				link := p.LinkEfficiency * float64(o.BandwidthBps) / 8 // 0: unshaped
				pull := p.LazyPull(m, link, float64(o.DirtyRate))
				ps.add("lazy-pages", pull-0.005+wob)
				r.PagesFaulted = uint64(p.FaultRate(float64(o.DirtyRate), 0.5) * pull)
			case "hybrid":
				d0 := m/p.ReadHashBps + wire + wob
				ps.add("round-0", d0)
				r.Rounds = []engine.Round{{Index: 0, DurationMs: d0 * 1000, Bytes: o.MemoryBytes},
					{Index: 1, DurationMs: m / p.FrozenReadBps * 1000, Final: true}}
				ps.add("freeze", p.FreezeS)
				ps.add("dump", p.DumpFixedS)
				ps.add("restore", p.RestoreFixedS+p.LazySetupS)
				ps.add("commit", 0.005)
				ps.add("lazy-pages", m/p.LocalFillBps-0.005+wob)
			}
			r.TotalMs = ps.t * 1000
			ps.add("cleanup", 0.05)
			r.Phases = ps.list
			r.DowntimeMs = (phaseS(r, "freeze", "dump", "images", "restore")) * 1000
			r.ClientDowntimeMs = r.DowntimeMs + 10
			res.Runs = append(res.Runs, r)
		}
		res.MedianTotalMs = res.Runs[0].TotalMs
		res.MedianDowntimeMs = res.Runs[0].DowntimeMs
		res.MedianClientDowntimeMs = res.Runs[0].ClientDowntimeMs
		return res, nil
	}
}

func noFeatures(context.Context) criu.Features { return criu.Features{} }

func near(t *testing.T, name string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*math.Abs(want) {
		t.Errorf("%s = %.6g, want %.6g (±%.1g)", name, got, want, rel)
	}
}

func TestRunRecoversProfile(t *testing.T) {
	t.Run("rebuild switchover", func(t *testing.T) {
		want := truth()
		want.LazyDump = true
		testRecovers(t, want)
	})
	t.Run("full-dump switchover", func(t *testing.T) { testRecovers(t, truth()) })
}

func testRecovers(t *testing.T, want model.Profile) {
	var seen []Progress
	p, rep, err := Run(context.Background(), Options{Run: fakeBench(want, 0), Features: noFeatures, FerryBin: "/bin/true",
		Progress: func(pr Progress) { seen = append(seen, pr) }})
	if err != nil {
		t.Fatal(err)
	}
	near(t, "FreezeS", p.FreezeS, want.FreezeS, 1e-9)
	near(t, "ReadHashBps", p.ReadHashBps, want.ReadHashBps, 1e-9)
	near(t, "FrozenReadBps", p.FrozenReadBps, want.FrozenReadBps, 1e-9)
	near(t, "DumpFixedS", p.DumpFixedS, want.DumpFixedS, 1e-9)
	near(t, "DumpBps", p.DumpBps, want.DumpBps, 1e-9)
	near(t, "RestoreFixedS", p.RestoreFixedS, want.RestoreFixedS, 1e-9)
	near(t, "RestoreBps", p.RestoreBps, want.RestoreBps, 1e-9)
	near(t, "LazySetupS", p.LazySetupS, want.LazySetupS, 1e-9)
	near(t, "LazyBps", p.LazyBps, want.LazyBps, 1e-3)
	near(t, "LazyRequestS", p.LazyRequestS, want.LazyRequestS, 1e-3)
	near(t, "FaultS", p.FaultS, want.FaultS, 1e-3)
	near(t, "LazySerialShare", p.LazySerialShare, want.LazySerialShare, 1e-3)
	near(t, "LocalFillBps", p.LocalFillBps, want.LocalFillBps, 1e-6)
	if want.LazyDump {
		near(t, "ImageFillBps", p.ImageFillBps, want.ImageFillBps, 1e-6)
	} else if len(rep.Warnings) == 1 && strings.HasPrefix(rep.Warnings[0], "image-fill:") {
		rep.Warnings = nil // no rebuild switchover measured: the default stays
	}
	near(t, "RedirtyRatio", p.RedirtyRatio, want.RedirtyRatio, 1e-9)
	near(t, "LinkEfficiency", p.LinkEfficiency, want.LinkEfficiency, 1e-9)
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
	want := truth()
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

func TestMissingModesKeepDefaults(t *testing.T) {
	def := model.DefaultProfile()
	run := fakeBench(truth(), 0)
	// Only cold points: nothing for read-hash, lazy setup, lazy pages, link.
	var ms []Measured
	for _, mem := range []int64{64 << 20, 256 << 20} {
		res, _ := run(context.Background(), bench.MigrateOptions{Mode: "cold", MemoryBytes: mem, Repeat: 1})
		ms = append(ms, Measured{Point: Point{Mode: "cold", MemoryBytes: mem}, Result: &res})
	}
	p, terms, warns := Fit(ms, def)
	near(t, "DumpBps from cold alone", p.DumpBps, truth().DumpBps, 1e-9)
	for _, term := range terms {
		if term.Name == "dump" && !strings.Contains(term.From, "no pre-copy measured") {
			t.Errorf("dump term: %q", term.From)
		}
	}
	if p.LazyBps != def.LazyBps || p.LinkEfficiency != def.LinkEfficiency || p.ReadHashBps != def.ReadHashBps {
		t.Errorf("unmeasured fields changed: %+v", p)
	}
	if len(warns) < 3 {
		t.Errorf("want warnings for the unmeasured terms, got %v", warns)
	}
	if err := p.Validate(); err != nil {
		t.Error(err)
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

func TestFixedPlusRateConvex(t *testing.T) {
	// Time growing faster than linearly: the free line's intercept is
	// negative, so the fit goes through the origin and names a knee.
	term := Term{X: []float64{64, 64, 128, 128, 256, 256, 512, 512}, Y: []float64{0.15, 0.16, 0.22, 0.21, 0.66, 0.67, 1.5, 1.6}}
	for i := range term.X {
		term.X[i] *= 1 << 20
	}
	f, why, err := fixedPlusRate(&term)
	if err != nil {
		t.Fatal(err)
	}
	if f.A != 0 || !(f.B > 0) || term.Free == nil || term.Free.A >= 0 {
		t.Errorf("fit %+v, free %+v", f, term.Free)
	}
	if !strings.Contains(why, "through the origin") || !strings.Contains(why, "a knee at") {
		t.Errorf("note: %q", why)
	}
	// A line with a positive intercept stays as it is.
	term = Term{X: []float64{1, 2, 3}, Y: []float64{2, 3, 4}}
	f, why, err = fixedPlusRate(&term)
	if err != nil || f.A != 1 || f.B != 1 || why != "" || term.Free != nil {
		t.Errorf("fit %+v, note %q, err %v", f, why, err)
	}
}

func TestRefit(t *testing.T) {
	want := truth()
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
	near(t, "FaultS", p.FaultS, model.DefaultProfile().FaultS, 1e-9)
	for _, m := range []float64{64 << 20, 256 << 20} {
		near(t, "pull", p.LazyPull(m, 0, 100), want.LazyPull(m, 0, 100), 0.01)
	}
	if len(again.Terms) == 0 || !reflect.DeepEqual(again.Profile, p) {
		t.Error("the report was not refitted")
	}
}

func TestDumpLineWithoutPostcopy(t *testing.T) {
	want := truth()
	run := fakeBench(want, 0)
	var ms []Measured
	for _, mode := range []string{"cold", "precopy"} {
		for _, mem := range []int64{64 << 20, 256 << 20} {
			res, _ := run(context.Background(), bench.MigrateOptions{Mode: mode, MemoryBytes: mem, Repeat: 1})
			ms = append(ms, Measured{Point: Point{Mode: mode, MemoryBytes: mem}, Result: &res})
		}
	}
	p, terms, _ := Fit(ms, model.DefaultProfile())
	near(t, "DumpFixedS", p.DumpFixedS, want.DumpFixedS, 1e-9)
	near(t, "DumpBps", p.DumpBps, want.DumpBps, 1e-9)
	for _, term := range terms {
		if term.Name == "dump" && term.Kind != "line" {
			t.Errorf("dump term: %+v", term)
		}
	}
}

// TestFitFaultWait: a writer that can fault at most 1/w times a second
// counts c·t1 + R·(T − t1)²/(2T) faults over a pull of T seconds; the fit
// finds w back, and finds no bound in runs that faulted freely.
func TestFitFaultWait(t *testing.T) {
	const w = 0.0008
	var runs []pullRun
	for _, r := range []struct{ rate, T float64 }{{2000, 3}, {3000, 4}, {4000, 8}} {
		c := 1 / w
		t1 := math.Max(r.T*(1-c/r.rate), 0)
		runs = append(runs, pullRun{rate: r.rate, y: r.T, faults: c*t1 + r.rate*(r.T-t1)*(r.T-t1)/(2*r.T)})
	}
	got, ok := fitFaultWait(runs)
	if !ok {
		t.Fatal("no bound found")
	}
	near(t, "fault_wait_s", got, w, 1e-3)
	if _, ok := fitFaultWait([]pullRun{{rate: 500, y: 2, faults: 500}}); ok {
		t.Error("a run that faulted R·T/2 times shows no bound")
	}
}

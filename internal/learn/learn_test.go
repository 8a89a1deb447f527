package learn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
)

// host is a synthetic host: its true costs, and the noise on what it
// measures.
type host struct {
	truth model.Profile
	rng   *rand.Rand
	// phaseNoise and wholeNoise are the spread (log-normal σ) of each
	// phase and of downtime and total.
	phaseNoise, wholeNoise float64
	start                  time.Time
}

var memories = []float64{64 << 20, 128 << 20, 256 << 20, 512 << 20}

// migrate makes the report of migration i as an agent planning with
// planner would keep it: phases from the host's true costs (the phases
// each term governs, as model.CheckTerms reads them), downtime and total
// from the true model, both noisy, and the prediction and checks by the
// planner.
func (h *host) migrate(i int, planner model.Profile) api.Report {
	mode := model.EngineModes[i%len(model.EngineModes)]
	mem := memories[(i/len(model.EngineModes))%len(memories)]
	p := h.truth
	n := func(s float64) float64 { return math.Exp(h.phaseNoise*h.rng.NormFloat64()) * s }
	pi := api.PlanInputs{MemoryBytes: mem, DirtyRate: 200, BandwidthBps: 125e6}
	rep := api.Report{ID: fmt.Sprintf("%012x", i), OK: true, Mode: mode, StartedAt: h.start.Add(time.Duration(i) * time.Minute)}
	var at float64
	phase := func(name string, s float64) {
		rep.Phases = append(rep.Phases, api.PhaseSpan{Name: name, StartMs: at, EndMs: at + s*1000})
		at += s * 1000
	}
	const rootfs, commit = 0.001, 0.004
	setup := n(p.SetupS)
	lazy := model.LazyMode(mode)
	if lazy {
		phase("prepare", setup-rootfs)
	} else {
		phase("prepare", setup-rootfs-commit)
	}
	phase("rootfs-sync", rootfs)
	if mode == model.ModePrecopy || mode == model.ModeHybrid {
		pi.Rounds = 3
		for k := range pi.Rounds {
			d := n(mem / p.ReadHashBps)
			if k == 0 {
				d += mem / (p.LinkEfficiency * pi.BandwidthBps)
			}
			rep.Rounds = append(rep.Rounds, api.Round{Index: k, DurationMs: d * 1000, Pages: 100, RawBytes: int64(100 * p.PageSize * p.RedirtyRatio)})
			phase(fmt.Sprintf("round-%d", k), d)
		}
	}
	phase("freeze", n(p.FreezeS))
	switch mode {
	case model.ModeCold:
		phase("dump", n(p.DumpFixedS+mem/p.DumpBps))
		phase("restore", n(p.RestoreFixedS+mem/p.RestoreBps))
		phase("commit", commit)
	case model.ModePrecopy: // a full dump: no lazy dump on this host
		phase("dump", n(p.DumpFixedS+mem/p.DumpBps+mem/p.ReadHashBps))
		phase("restore", n(p.RestoreFixedS+mem/p.RestoreBps))
		phase("commit", commit)
	case model.ModePostcopy:
		phase("dump", n(p.DumpFixedS))
		phase("restore", n(p.RestoreFixedS+p.LazySetupS))
		phase("commit", commit)
		phase("lazy-pages", n(p.PushPull(mem, p.LinkEfficiency*pi.BandwidthBps, pi.DirtyRate))-commit)
	case model.ModeHybrid:
		d := n(mem / p.FrozenReadBps)
		rep.Rounds = append(rep.Rounds, api.Round{Index: pi.Rounds, DurationMs: d * 1000, Final: true})
		phase("dump", n(p.DumpFixedS))
		phase("restore", n(p.RestoreFixedS+p.LazySetupS))
		phase("commit", commit)
		phase("lazy-pages", n(mem/p.LocalFillBps)-commit)
	}
	w := model.PredictReport(p, pi, mode)
	rep.DowntimeMs = w.DowntimeMs * math.Exp(h.wholeNoise*h.rng.NormFloat64())
	rep.TotalMs = w.TotalMs * math.Exp(h.wholeNoise*h.rng.NormFloat64())
	q := model.PredictReport(planner, pi, mode)
	rep.Model = &api.ModelCheck{Inputs: pi, Profile: planner.Source, Prediction: q,
		Terms: model.CheckTerms(planner, pi, rep), Outside: model.Outside(q, rep.DowntimeMs, rep.TotalMs)}
	return rep
}

// baseProfile is the defaults on a host without CRIU's lazy dump (so
// pre-copy's switchover is a full dump, which the dump term reads).
func baseProfile() model.Profile {
	p := model.DefaultProfile()
	p.LazyDump = false
	return p
}

// near checks the learned profile's fields against a host's truth.
func nearTruth(t *testing.T, when string, got, want model.Profile, tol float64) {
	t.Helper()
	for _, f := range []struct {
		name    string
		got, wt float64
	}{
		{"freeze_s", got.FreezeS, want.FreezeS},
		{"read_hash_bps", got.ReadHashBps, want.ReadHashBps},
		{"frozen_read_bps", got.FrozenReadBps, want.FrozenReadBps},
		{"dump_fixed_s", got.DumpFixedS, want.DumpFixedS},
		{"dump_bps", got.DumpBps, want.DumpBps},
		{"restore_fixed_s", got.RestoreFixedS, want.RestoreFixedS},
		{"restore_bps", got.RestoreBps, want.RestoreBps},
		// lazy_setup_s is what post-copy's switchover leaves beside the
		// two fixed costs: small beside them, it carries their errors, so
		// the sum is what is checked.
		{"post-copy's fixed costs", got.DumpFixedS + got.RestoreFixedS + got.LazySetupS, want.DumpFixedS + want.RestoreFixedS + want.LazySetupS},
		{"local_fill_bps", got.LocalFillBps, want.LocalFillBps},
		{"redirty_ratio", got.RedirtyRatio, want.RedirtyRatio},
		{"setup_s", got.SetupS, want.SetupS},
	} {
		if e := math.Abs(f.got-f.wt) / f.wt; e > tol {
			t.Errorf("%s: %s %.4g, the host's %.4g (%.0f %% off)", when, f.name, f.got, f.wt, e*100)
		}
	}
}

// The online refit follows a host whose speeds change: it learns one
// host's costs from its migrations, flags drift when they change, and
// learns the new ones.
func TestLearnerFollowsAChangingHost(t *testing.T) {
	base := baseProfile()
	a := base
	a.FreezeS, a.ReadHashBps, a.FrozenReadBps, a.DumpFixedS, a.DumpBps = 0.02, 1.5e9, 2e9, 0.12, 0.3e9
	a.RestoreFixedS, a.RestoreBps, a.LazySetupS, a.LocalFillBps, a.RedirtyRatio, a.SetupS = 0.1, 1e9, 0.03, 0.8e9, 0.4, 0.3
	h := &host{truth: a, rng: rand.New(rand.NewPCG(3, 4)), phaseNoise: 0.03, wholeNoise: 0.03}
	const keep = 64
	l, err := Open(t.TempDir(), base, keep)
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	feed := func(n int) {
		for range n {
			if err := l.Record(h.migrate(i, l.Profile())); err != nil {
				t.Fatal(err)
			}
			i++
		}
	}
	// Enough that each term's recent window holds only predictions made
	// after its refit (a term fed by one mode in four refits after 5 of
	// its own, and judges its last 20).
	feed(96)
	nearTruth(t, "host A", l.Profile(), a, 0.1)
	if st := l.Status(); st.Drift {
		t.Errorf("drift flagged on a host the profile learned: %+v", st.Terms)
	}

	// The host changes: a slower restore and freeze, a faster read.
	b := a
	b.FreezeS, b.ReadHashBps, b.FrozenReadBps, b.RestoreFixedS, b.RestoreBps, b.SetupS, b.DumpFixedS = 0.08, 3e9, 4e9, 0.25, 0.5e9, 0.15, 0.06
	h.truth = b
	feed(8)
	if st := l.Status(); !st.Drift {
		t.Errorf("no drift flagged after the host changed: %+v", st.Terms)
	}
	// Every term's recent window (RecentCount checks; dump-fixed and
	// frozen-read have one mode's migrations of four) predicted once the
	// refit had learned host B.
	feed(2 * keep)
	nearTruth(t, "host B", l.Profile(), b, 0.1)
	st := l.Status()
	for _, term := range st.Terms {
		if term.Drift && term.Name != "downtime" && term.Name != "total" {
			t.Errorf("%s still drifts once host B's migrations filled its window: %.0f %%", term.Name, term.RecentError*100)
		}
	}
	if st.Migrations != keep {
		t.Errorf("%d migrations kept, want %d", st.Migrations, keep)
	}
}

// The interval from the residuals covers about 80 % of migrations it did
// not see.
func TestIntervalCoversHeldOutMigrations(t *testing.T) {
	base := baseProfile()
	h := &host{truth: base, rng: rand.New(rand.NewPCG(5, 6)), phaseNoise: 0.02, wholeNoise: 0.15}
	l, err := Open(t.TempDir(), base, DefaultKeep)
	if err != nil {
		t.Fatal(err)
	}
	for i := range DefaultKeep {
		if err := l.Record(h.migrate(i, l.Profile())); err != nil {
			t.Fatal(err)
		}
	}
	p := l.Profile()
	for _, iv := range p.Intervals {
		if iv.Samples < model.MinIntervalSamples {
			t.Fatalf("%s's interval from %d migrations", iv.Mode, iv.Samples)
		}
	}
	in, n := 0, 0
	for i := range 800 {
		r := h.migrate(i, p)
		q := r.Model.Prediction
		for _, v := range [][3]float64{{r.DowntimeMs, q.DowntimeLowMs, q.DowntimeHighMs}, {r.TotalMs, q.TotalLowMs, q.TotalHighMs}} {
			n++
			if v[0] >= v[1] && v[0] <= v[2] {
				in++
			}
		}
	}
	if c := float64(in) / float64(n); c < 0.7 || c > 0.88 {
		t.Errorf("the intervals cover %.1f %% of held-out migrations, want about 80 %%", c*100)
	} else {
		t.Logf("the intervals cover %.1f %% of %d held-out measurements", c*100, n)
	}
}

// Until a mode has MinIntervalSamples migrations its interval is the
// default width (or the base profile's).
func TestIntervalDefaultsWithFewMigrations(t *testing.T) {
	base := baseProfile()
	h := &host{truth: base, rng: rand.New(rand.NewPCG(7, 8)), wholeNoise: 0.3}
	l, err := Open(t.TempDir(), base, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 * (model.MinIntervalSamples - 1) {
		_ = l.Record(h.migrate(i, l.Profile()))
	}
	q := model.Predict(l.Profile(), model.Inputs{MemoryBytes: 1 << 28, BandwidthBps: 125e6}, model.ModeCold, 1)
	if q.DowntimeHighMs != q.DowntimeMs*model.DefaultDowntimeHigh {
		t.Errorf("cold's interval from %d migrations is not the default: %+v", model.MinIntervalSamples-1, q)
	}
}

func TestStoreBoundAndPersistence(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if err := s.Add(api.Report{ID: fmt.Sprint(i), OK: true}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s *Store, when string) {
		t.Helper()
		got := s.Reports()
		if len(got) != 5 || got[0].ID != "3" || got[4].ID != "7" {
			var ids []string
			for _, r := range got {
				ids = append(ids, r.ID)
			}
			t.Errorf("%s: kept %v, want the last 5 (3-7)", when, ids)
		}
	}
	check(s, "after adding 8")
	again, err := OpenStore(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	check(again, "reopened")
	// A smaller bound on reopening keeps the newest.
	small, err := OpenStore(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := small.Reports(); len(got) != 2 || got[1].ID != "7" {
		t.Errorf("reopened with a bound of 2: %v", got)
	}
}

// Failed migrations and reports without a prediction are not kept.
func TestLearnerKeepsOnlyWhatItLearnsFrom(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, baseProfile(), 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &host{truth: baseProfile(), rng: rand.New(rand.NewPCG(1, 1))}
	failed := h.migrate(0, l.Profile())
	failed.OK = false
	for _, r := range []api.Report{failed, {OK: true, Mode: model.ModeCold}, h.migrate(1, l.Profile())} {
		if err := l.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Status(); st.Migrations != 1 {
		t.Errorf("%d reports kept, want 1", st.Migrations)
	}
	// Across a restart.
	l2, err := Open(dir, baseProfile(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if st := l2.Status(); st.Migrations != 1 {
		t.Errorf("after reopening: %d reports, want 1", st.Migrations)
	}
	d, n, err := Drifting(dir)
	if err != nil || n != 1 || len(d) != 0 {
		t.Errorf("Drifting: %v, %d kept, %v", d, n, err)
	}
}

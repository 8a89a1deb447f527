package fit

import (
	"fmt"
	"math"
	"strings"

	"github.com/ferry-migrate/ferry/internal/model"
)

func fitFreeze(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "freeze", Kind: "constant", From: "freeze phase of every unshaped run (the model's β is a constant)"}
	for _, s := range collect(ms, unshaped()) {
		if hasPhase(s.r, "freeze") {
			t.X, t.Y = append(t.X, s.m), append(t.Y, PhaseS(s.r, "freeze"))
		}
	}
	return fitConstant(t, "freeze_s", &p.FreezeS)
}

func fitReadHash(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "read-hash", Kind: "proportional",
		From: "pre-copy rounds after the first (little to send) vs memory: duration = M/read_hash_bps"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy)) {
		for _, rd := range s.r.Rounds {
			if rd.Index >= 1 && !rd.Final {
				t.X, t.Y = append(t.X, s.m), append(t.Y, rd.DurationMs/1000)
			}
		}
	}
	t, err := fitRate(t, "read_hash_bps", &p.ReadHashBps)
	if err == nil && t.Free != nil {
		t.Note = fmt.Sprintf("a free line puts %.0f ms per round outside memory (the model has no per-round fixed cost)", t.Free.A*1000)
	}
	return t, err
}

// fitFrozenRead fits the last round read while the container is frozen
// (hybrid, pre-copy's rebuild switchover): it runs beside CRIU's
// memory-less dump with nothing else competing.
func fitFrozenRead(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "frozen-read", Kind: "proportional",
		From: "the frozen last round (hybrid, pre-copy rebuild) vs memory: duration = M/frozen_read_bps"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy, model.ModeHybrid)) {
		for _, rd := range s.r.Rounds {
			if rd.Final {
				t.X, t.Y = append(t.X, s.m), append(t.Y, rd.DurationMs/1000)
			}
		}
	}
	return fitRate(t, "frozen_read_bps", &p.FrozenReadBps)
}

// fitDumpFixed measures φ directly: post-copy's dump is a memory-less
// (lazy) CRIU dump, which is what the profile's dump_fixed_s stands for,
// and it includes sending the images, as pre-copy's dump+images does.
func fitDumpFixed(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "dump-fixed", Kind: "constant",
		From: "post-copy's dump (+ images): a memory-less CRIU dump, the model's φ"}
	for _, s := range collect(ms, unshaped(model.ModePostcopy)) {
		t.X, t.Y = append(t.X, s.m), append(t.Y, PhaseS(s.r, "dump", "images"))
	}
	return fitConstant(t, "dump_fixed_s", &p.DumpFixedS)
}

// fitDump fits the switchover dump's memory part on pre-copy's
// deduplicating dump, a full local CRIU dump whose pages are hashed and
// mostly replaced by references: the model's φ + M/dump_bps +
// M/read_hash_bps. With φ measured (phiKnown) the rest is proportional to
// M; without, φ comes from the same line. Cold's dump streams every page
// through the session instead; its own line is reported, and used only
// when no pre-copy was measured.
func fitDump(ms []Measured, p *model.Profile, phiKnown bool) (Term, error) {
	t := Term{Name: "dump", Kind: "line",
		From: "pre-copy's dedup dump+images minus M/read_hash_bps, vs memory: φ + M/dump_bps"}
	var cx, cy []float64
	for _, s := range collect(ms, unshaped(model.ModeCold, model.ModePrecopy)) {
		y := PhaseS(s.r, "dump", "images")
		if s.r.FillMs > 0 {
			continue // pre-copy's rebuild switchover: no full dump
		}
		if s.p.Mode == model.ModePrecopy {
			t.X, t.Y = append(t.X, s.m), append(t.Y, y-s.m/p.ReadHashBps)
		} else {
			cx, cy = append(cx, s.m), append(cy, y)
		}
	}
	fromCold := distinct(t.X) < 1 || (!phiKnown && distinct(t.X) < 2)
	if fromCold {
		t.From = "cold's dump+images (streamed to the destination) vs memory: φ + M/dump_bps (no pre-copy measured)"
		t.X, t.Y = cx, cy
	}
	if phiKnown {
		t.Kind = "proportional"
		t.From = strings.Replace(t.From, "vs memory: φ + M/dump_bps", "less dump_fixed_s, vs memory: M/dump_bps", 1)
		for i := range t.Y {
			t.Y[i] -= p.DumpFixedS
		}
		f, ok := model.FitThroughOrigin(t.X, t.Y)
		if !ok || !(f.B > 0) {
			return t, fmt.Errorf("dump time does not grow with memory")
		}
		t.Fit = f
		p.DumpBps = 1 / f.B
		p.DumpKneeBytes, p.DumpBpsAbove = 0, 0
		t.Sets = map[string]float64{"dump_bps": p.DumpBps}
		if t.Free = freeLine(t.X, t.Y); t.Free != nil {
			t.Note = fmt.Sprintf("a free line has %.0f ms at M = 0 beyond φ", t.Free.A*1000)
		}
		if knee, below, above, rmse, ok := model.FitTwoRates(t.X, t.Y); ok && rmse < 0.8*f.RMSE {
			p.DumpBps, p.DumpKneeBytes, p.DumpBpsAbove = 1/below, knee, 1/above
			t.Kind = "two rates"
			t.Sets = map[string]float64{"dump_bps": p.DumpBps, "dump_knee_bytes": knee, "dump_bps_above": p.DumpBpsAbove}
			t.Note = joinNotes(t.Note, fmt.Sprintf("two rates around %.0f MiB fit with RMSE %.1f ms instead of %.1f ms",
				knee/(1<<20), rmse*1000, f.RMSE*1000))
		} else {
			t.Note = joinNotes(t.Note, kneeNote(t.X, t.Y, f.RMSE))
		}
	} else {
		f, why, err := fixedPlusRate(&t)
		if err != nil {
			return t, err
		}
		p.DumpFixedS, p.DumpBps = f.A, 1/f.B
		t.Sets = map[string]float64{"dump_fixed_s": p.DumpFixedS, "dump_bps": p.DumpBps}
		t.Note = why
	}
	if c := freeLine(cx, cy); c != nil && !fromCold {
		t.Note = joinNotes(t.Note, "cold's streamed dump on an unshaped link: "+subFits(map[string][2][]float64{"": {cx, cy}})+
			"; the model's cold takes max(M/dump_bps, M/(η·L)), so it is optimistic for cold where the link outruns that rate")
	}
	return t, nil
}

func fitRestore(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "restore", Kind: "line", From: "restore phase of cold and pre-copy (restore until the destination answers; pre-copy's image fill taken out; not pre-copy restored lazily from its own images, which writes no memory) vs memory: ψ + M/restore_bps"}
	var rx, ry, cx, cy, px, py []float64
	for _, s := range collect(ms, unshaped(model.ModeCold, model.ModePrecopy)) {
		if s.r.RestoreFromOwnImages {
			continue
		}
		// The rebuild switchover writes the pages image first (image-fill).
		y := PhaseS(s.r, "restore") - s.r.FillMs/1000
		t.X, t.Y = append(t.X, s.m), append(t.Y, y)
		rx, ry = append(rx, s.m), append(ry, s.r.RestoreMs/1000)
		if s.p.Mode == model.ModeCold {
			cx, cy = append(cx, s.m), append(cy, y)
		} else {
			px, py = append(px, s.m), append(py, y)
		}
	}
	f, why, err := fixedPlusRate(&t)
	if err != nil {
		return t, err
	}
	p.RestoreFixedS, p.RestoreBps = f.A, 1/f.B
	t.Sets = map[string]float64{"restore_fixed_s": p.RestoreFixedS, "restore_bps": p.RestoreBps}
	t.Note = joinNotes(why, subFits(map[string][2][]float64{"runc restore alone (restore_ms)": {rx, ry}, "cold alone": {cx, cy}, "pre-copy alone": {px, py}}))
	return t, nil
}

// fixedPlusRate fits t's points to a + b·x with a ≥ 0 (a fixed cost
// cannot be negative): the free least-squares line, or, when its
// intercept is negative, the best line through the origin, which is the
// constrained optimum then. With four memory sizes or more it also says
// whether a line with a knee fits much better (time growing faster than
// linearly, which the model cannot express).
func fixedPlusRate(t *Term) (model.LinearFit, string, error) {
	f, err := model.FitLinear(t.X, t.Y)
	if err != nil {
		return f, "", err
	}
	var notes []string
	if f.A < 0 {
		free := f
		t.Free = &free
		f, _ = model.FitThroughOrigin(t.X, t.Y)
		notes = append(notes, fmt.Sprintf("the free line's intercept is %.0f ms, so the fixed part is 0 and the line goes through the origin", free.A*1000))
	}
	if !(f.B > 0) {
		return f, "", fmt.Errorf("time does not grow with memory (slope %.3g s/B)", f.B)
	}
	t.Fit = f
	if k := kneeNote(t.X, t.Y, f.RMSE); k != "" {
		notes = append(notes, k)
	}
	return f, strings.Join(notes, "; "), nil
}

func fitLazySetup(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "lazy-setup", Kind: "constant",
		From: "post-copy's dump+images+restore minus dump_fixed_s and restore_fixed_s (the model's lazy downtime is constant in M)"}
	for _, s := range collect(ms, unshaped(model.ModePostcopy)) {
		t.X = append(t.X, s.m)
		t.Y = append(t.Y, PhaseS(s.r, "dump", "images", "restore")-p.DumpFixedS-p.RestoreFixedS)
	}
	t, err := fitConstant(t, "lazy_setup_s", &p.LazySetupS)
	if err == nil && t.Free != nil {
		t.Note = fmt.Sprintf("post-copy downtime grows by %.0f ms per 100 MiB (the model says 0)", t.Free.B*100*(1<<20)*1000)
	}
	return t, err
}

// fitRedirty measures how much of a page a live round sends for a page
// dirtied again: the round stream's bytes over its pages, rounds after the
// first (which sends everything once, whole).
func fitRedirty(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "redirty", Kind: "ratio",
		From: "pre-copy and hybrid rounds from the third on (index >= 2; earlier ones send pages whole): raw bytes / (pages x page size)"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy, model.ModeHybrid)) {
		for _, rd := range s.r.Rounds {
			if rd.Index < 2 || rd.Pages == 0 || rd.Final {
				continue
			}
			t.X = append(t.X, s.m)
			t.Y = append(t.Y, float64(rd.RawBytes)/(float64(rd.Pages)*p.PageSize))
		}
	}
	if len(t.Y) == 0 {
		return t, ErrNoData
	}
	t.Fit = model.FitConstant(t.Y)
	p.RedirtyRatio = math.Min(1, math.Max(t.Fit.A, 1e-3))
	t.Sets = map[string]float64{"redirty_ratio": p.RedirtyRatio}
	return t, nil
}

// fitLocalFill fits hybrid's fill from the destination's own copy.
func fitLocalFill(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "local-fill", Kind: "proportional",
		From: "hybrid's commit+lazy-pages (pages placed from the destination's copy) vs memory: M/local_fill_bps"}
	for _, s := range collect(ms, unshaped(model.ModeHybrid)) {
		t.X, t.Y = append(t.X, s.m), append(t.Y, PhaseS(s.r, "commit", "lazy-pages"))
	}
	return fitRate(t, "local_fill_bps", &p.LocalFillBps)
}

// fitImageFill fits pre-copy's rebuild switchover writing the pages image
// from the destination's copy.
func fitImageFill(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "image-fill", Kind: "proportional",
		From: "pre-copy's rebuild switchover, the destination completing the pages image (fill_ms) vs memory: M/image_fill_bps"}
	for _, s := range collect(ms, unshaped(model.ModePrecopy)) {
		if s.r.FillMs > 0 {
			t.X, t.Y = append(t.X, s.m), append(t.Y, s.r.FillMs/1000)
		}
	}
	return fitRate(t, "image_fill_bps", &p.ImageFillBps)
}

// fitConstant finishes a term that is one constant: the mean of t's
// points, never below zero, stored in field under its JSON name.
func fitConstant(t Term, name string, field *float64) (Term, error) {
	if len(t.Y) == 0 {
		return t, ErrNoData
	}
	t.Fit = model.FitConstant(t.Y)
	t.Free = freeLine(t.X, t.Y)
	*field = math.Max(0, t.Fit.A)
	t.Sets = map[string]float64{name: *field}
	return t, nil
}

// fitRate finishes a term of the form seconds = bytes/rate: it fits t's
// points through the origin and stores the rate in field, under its JSON
// name.
func fitRate(t Term, name string, field *float64) (Term, error) {
	f, ok := model.FitThroughOrigin(t.X, t.Y)
	if !ok || !(f.B > 0) {
		return t, ErrNoData
	}
	t.Fit = f
	t.Free = freeLine(t.X, t.Y)
	*field = 1 / f.B
	t.Sets = map[string]float64{name: *field}
	return t, nil
}

// fitLink measures ferry's payload throughput over the shaped link: the
// first pre-copy round sends all of memory, so (duration − M/read_hash_bps)
// is its time on the wire (cold: the dump beyond its fixed part).
func fitLink(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "link", Kind: "ratio",
		From: "shaped link: memory / (time on the wire × link rate), from pre-copy's first round"}
	var baseline []float64
	for _, m := range ms {
		if m.BandwidthBps <= 0 || m.Result == nil {
			continue
		}
		l := float64(m.BandwidthBps) / 8
		if b := m.Result.Baselines.Link; b != nil && b.ThroughputBps > 0 {
			baseline = append(baseline, b.ThroughputBps/float64(m.BandwidthBps))
		}
		mem := float64(m.MemoryBytes)
		for _, r := range OKRuns(*m.Result) {
			var wire float64
			switch m.Mode {
			case model.ModePrecopy, model.ModeHybrid:
				if len(r.Rounds) == 0 {
					continue
				}
				wire = r.Rounds[0].DurationMs/1000 - mem/p.ReadHashBps
			case model.ModeCold:
				wire = PhaseS(r, "dump", "images") - p.DumpFixedS
			default:
				continue
			}
			if wire > 0 {
				t.X, t.Y = append(t.X, mem), append(t.Y, mem/(wire*l))
			}
		}
	}
	if len(t.Y) == 0 {
		return t, ErrNoData
	}
	t.Fit = model.FitConstant(t.Y)
	p.LinkEfficiency = math.Min(1, t.Fit.A)
	t.Sets = map[string]float64{"link_efficiency": p.LinkEfficiency}
	if len(baseline) > 0 {
		t.Note = fmt.Sprintf("plain TCP (iperf3) got %.3f of the same link", mean(baseline))
	}
	if t.Fit.A > 1 {
		t.Note += fmt.Sprintf("; measured %.3f, capped at 1", t.Fit.A)
	}
	return t, nil
}

// fitOverhead measures what every migration spends before its technique
// starts: connecting and the offer (prepare), the live root filesystem
// sync, and the commit of non-lazy modes. It sets setup_s, and
// setup_rootfs_bytes, the root filesystem that sync sent (a prediction
// adds what a container sends beyond it).
func fitOverhead(ms []Measured, p *model.Profile) (Term, error) {
	t := Term{Name: "setup", Kind: "constant",
		From: "prepare + rootfs-sync (+ commit for cold and pre-copy): added to every predicted total"}
	var rootfs []float64
	defer func() {
		if len(rootfs) > 0 {
			p.SetupRootfsBytes = mean(rootfs)
		}
	}()
	for _, s := range collect(ms, unshaped()) {
		rootfs = append(rootfs, float64(s.r.RootfsBytes))
		y := PhaseS(s.r, "prepare", "rootfs-sync")
		if !model.LazyMode(s.p.Mode) {
			y += PhaseS(s.r, "commit")
		}
		t.X, t.Y = append(t.X, s.m), append(t.Y, y)
	}
	return fitConstant(t, "setup_s", &p.SetupS)
}

// freeLine is FitLinear when the points allow one, else nil.
func freeLine(x, y []float64) *model.LinearFit {
	if distinct(x) < 2 {
		return nil
	}
	f, err := model.FitLinear(x, y)
	if err != nil {
		return nil
	}
	return &f
}

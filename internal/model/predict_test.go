package model

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// handProfile has round numbers for hand-computed expectations.
func handProfile() Profile {
	p := DefaultProfile()
	p.FreezeS, p.DumpFixedS, p.DumpBps = 0.01, 0.1, 1e9
	p.ReadHashBps = 4e9
	p.RestoreFixedS, p.RestoreBps = 0.1, 2e9
	p.LazySetupS, p.LazyBps = 0.05, 5e8
	p.LazyRequestS, p.FaultS = 0, 0 // the pull is bytes only; TestLazyPull* cover the rest
	p.LazySerialShare, p.FaultWaitS = 0, 0
	p.LinkEfficiency, p.DedupRefBytes = 1, 0
	p.SetupS = 0 // the technique's own times; TestSetupAddsToTotalOnly covers it
	p.LocalFillBps = 5e8
	p.ImageFillBps = 1e9
	p.LazyDump = false  // pre-copy's full-dump switchover; TestPrecopyRebuild covers the other
	p.FrozenReadBps = 0 // the frozen round reads at ReadHashBps
	p.RedirtyRatio = 0  // rounds send dirty pages whole
	return p
}

func TestSetupAddsToTotalOnly(t *testing.T) {
	p := handProfile()
	in := Inputs{MemoryBytes: 1e9, DirtyRatePagesPerSec: 1000, BandwidthBps: 1e8}
	base := Predict(p, in, ModeCold, 0)
	p.SetupS = 0.2
	q := Predict(p, in, ModeCold, 0)
	approx(t, "total", q.TotalMs, base.TotalMs+200)
	approx(t, "downtime", q.DowntimeMs, base.DowntimeMs)
}

func TestTechniquesHandComputed(t *testing.T) {
	p := handProfile()
	// M = 1 GB, R = 1000 pages/s (4.096 MB/s), L = 100 MB/s.
	in := Inputs{MemoryBytes: 1e9, DirtyRatePagesPerSec: 1000, BandwidthBps: 1e8}
	// Round 0: 1e9/1e8 + 1e9/4e9 = 10.25 s. A switchover right after it
	// finds the pages written in half a round on average.
	d1 := 4.096e6 * 10.25 / 2
	// Round 1 sends what was written between the two rounds' reads of each
	// page, (10.25 + t1)/2 on average, t1 = v1/1e8 + 0.25:
	// v1 = 4.096e6·(10.25 + 0.25)/(2 − 4.096e6/1e8).
	v1 := 4.096e6 * 10.5 / (2 - 0.04096)
	t1 := v1/1e8 + 0.25
	d2 := 4.096e6 * t1 / 2
	for _, c := range []struct {
		mode                    string
		rounds                  int
		down, total, bytes, deg float64
	}{
		// freeze + dump fixed + max(dump 1 s, link 10 s) + restore 0.1 + 0.5.
		{ModeCold, 0, 10.71, 10.71, 1e9, 0},
		// freeze + dump fixed + restore fixed + lazy setup + the first
		// faults (0.03); the push at the link, 10 s, the daemon placing
		// it as it comes (fault_s 0 here: the faults' holes cost nothing
		// after it).
		{ModePostcopy, 0, 0.29, 0.29 + 10, 1e9, 10},
		// Switchover: max(dump 1 + hash 0.25, delta d1/1e8) = 1.25 s.
		{ModePrecopy, 1, 1.96, 10.25 + 1.96, 1e9 + d1, 0},
		{ModePrecopy, 2, 1.96, 10.25 + t1 + 1.96, 1e9 + v1 + d2, 0},
		// Final: max(0.1, 0.25 + d1/1e8); fill 1e9/5e8 = 2 s.
		{ModeHybrid, 1, 0.01 + 0.25 + d1/1e8 + 0.15, 10.25 + 0.41 + d1/1e8 + 2, 1e9 + d1, 2},
	} {
		q := Predict(p, in, c.mode, c.rounds)
		if q.Mode != c.mode || q.Rounds != c.rounds {
			t.Errorf("%s: got mode %q rounds %d", c.mode, q.Mode, q.Rounds)
		}
		approx(t, c.mode+" downtime", q.DowntimeMs, c.down*1000)
		approx(t, c.mode+" total", q.TotalMs, c.total*1000)
		approx(t, c.mode+" bytes", q.Bytes, c.bytes)
		approx(t, c.mode+" degraded", q.DegradedMs, c.deg*1000)
	}
}

// TestPrecopyRebuild: with CRIU's lazy dump, pre-copy's switchover is a
// memory-less dump alongside a frozen last round, then the destination
// writes the pages image and restores: lazily where the runtime can (the
// restore's fixed part and the lazy setup; the memory follows at
// LocalPullBps), otherwise writing all of the memory.
func TestPrecopyRebuild(t *testing.T) {
	p := handProfile()
	p.LazyDump = true
	in := Inputs{MemoryBytes: 1e9, DirtyRatePagesPerSec: 1000, BandwidthBps: 1e8, NoLazyRestore: true}
	d1 := 4.096e6 * 10.25 / 2 // written since round 0 read the page, on average
	// freeze 0.01 + max(dump fixed 0.1, hash 0.25 + d1/1e8) + fill 1 s + restore 0.6.
	down := 0.01 + 0.25 + d1/1e8 + 1 + 0.6
	q := Predict(p, in, ModePrecopy, 1)
	approx(t, "downtime", q.DowntimeMs, down*1000)
	approx(t, "total", q.TotalMs, (10.25+down)*1000)
	approx(t, "bytes", q.Bytes, 1e9+d1)
	approx(t, "degraded", q.DegradedMs, 0)
	// Restored lazily: restore fixed 0.1 + lazy setup 0.05 instead of
	// 0.6, and 1e9 B at LocalPullBps (2e9 B/s) after the commit.
	in.NoLazyRestore = false
	lazy := down - 0.6 + 0.1 + 0.05
	q = Predict(p, in, ModePrecopy, 1)
	approx(t, "lazy downtime", q.DowntimeMs, lazy*1000)
	approx(t, "lazy total", q.TotalMs, (10.25+lazy+0.5)*1000)
	approx(t, "lazy degraded", q.DegradedMs, 500)
	// No dirtying: the memory-less dump's fixed cost bounds the last round.
	q = Predict(p, Inputs{MemoryBytes: 1e8, BandwidthBps: 1e8, NoLazyRestore: true}, ModePrecopy, 1)
	approx(t, "quiet downtime", q.DowntimeMs, (0.01+0.1+0.1+0.1+0.05)*1000)
}

func TestPrecopyDedupReferences(t *testing.T) {
	p := handProfile()
	p.DedupRefBytes = 32
	in := Inputs{MemoryBytes: 4096 * 1000, DirtyRatePagesPerSec: 0, BandwidthBps: 1e8}
	// Nothing dirty: the switchover sends one 32-byte reference per page.
	q := Predict(p, in, ModePrecopy, 1)
	approx(t, "bytes", q.Bytes, 4096*1000+32*1000)
}

func TestHotBytesCapsDirtyVolume(t *testing.T) {
	p := handProfile()
	in := Inputs{MemoryBytes: 1e9, DirtyRatePagesPerSec: 1e6, BandwidthBps: 1e8, HotBytes: 1e7}
	q := Predict(p, in, ModePrecopy, 3)
	approx(t, "bytes", q.Bytes, 1e9+3*1e7) // rounds 1, 2 and the switchover each find the whole working set dirty
}

func TestNativePrecopyIsPAM(t *testing.T) {
	p := handProfile()
	p.PAM = handPAM()
	in := Inputs{MemoryBytes: 1e9, DirtyRatePagesPerSec: 1000, BandwidthBps: 1e8}
	q := Predict(p, in, ModeNativePrecopy, 2)
	r := PAM(p.PAM, PAMInputs{M: 1e9, R: 1000, L: []float64{1e8}, I: 1})
	approx(t, "downtime", q.DowntimeMs, r.Downtime*1000)
	approx(t, "total", q.TotalMs, r.Total*1000)
	approx(t, "frozen", q.FrozenMs, r.Frozen*1000)
	if !strings.Contains(q.Note, "soft-dirty") {
		t.Errorf("note %q should say soft-dirty is missing", q.Note)
	}
}

func TestPredictBadInput(t *testing.T) {
	p := DefaultProfile()
	for _, c := range []struct {
		mode string
		in   Inputs
	}{
		{"teleport", Inputs{MemoryBytes: 1}},
		{ModeCold, Inputs{MemoryBytes: -1}},
		{ModeCold, Inputs{MemoryBytes: math.NaN()}},
		{ModePrecopy, Inputs{MemoryBytes: 1, DirtyRatePagesPerSec: -3}},
	} {
		q := Predict(p, c.in, c.mode, 1)
		if !math.IsNaN(q.TotalMs) || q.Note == "" {
			t.Errorf("%s %+v: want NaN and a note, got %+v", c.mode, c.in, q)
		}
	}
	// A dead link takes forever but is not an error.
	if q := Predict(p, Inputs{MemoryBytes: 1 << 20}, ModeCold, 0); !math.IsInf(q.TotalMs, 1) {
		t.Errorf("zero bandwidth: total %v, want +Inf", q.TotalMs)
	}
}

var allModes = []string{ModeCold, ModePrecopy, ModePostcopy, ModeHybrid, ModeNativePrecopy}

func TestDowntimeNonDecreasingInDirtyRate(t *testing.T) {
	p := DefaultProfile()
	for _, mode := range allModes {
		for rounds := 1; rounds <= 4; rounds++ {
			prev := -1.0
			for r := 0.0; r <= 2e6; r = r*1.7 + 10 {
				q := Predict(p, Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: r, BandwidthBps: 125e6}, mode, rounds)
				if q.DowntimeMs < prev {
					t.Fatalf("%s rounds %d: downtime fell from %v to %v at R=%v", mode, rounds, prev, q.DowntimeMs, r)
				}
				prev = q.DowntimeMs
			}
		}
	}
}

func TestTotalDecreasingInBandwidth(t *testing.T) {
	p := DefaultProfile()
	for _, mode := range allModes {
		prev := math.Inf(1)
		for bw := 1e6; bw <= 1e11; bw *= 1.5 {
			q := Predict(p, Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 2000, BandwidthBps: bw}, mode, 3)
			// Strictly while the link is the bottleneck (below every
			// local rate: post-copy's pull, slowed by faults at 2,000
			// pages/s, places ~100 MB/s), never increasing after.
			if q.TotalMs > prev || (bw < 5e7 && q.TotalMs >= prev) {
				t.Fatalf("%s: total went from %v to %v at %v B/s", mode, prev, q.TotalMs, bw)
			}
			prev = q.TotalMs
		}
	}
}

func TestPostcopyDowntimeIndependentOfMemory(t *testing.T) {
	p := DefaultProfile()
	base := Predict(p, Inputs{MemoryBytes: 1 << 20, DirtyRatePagesPerSec: 100, BandwidthBps: 125e6}, ModePostcopy, 0)
	for m := float64(1 << 20); m <= 1<<36; m *= 4 {
		q := Predict(p, Inputs{MemoryBytes: m, DirtyRatePagesPerSec: 100, BandwidthBps: 125e6}, ModePostcopy, 0)
		approx(t, "post-copy downtime", q.DowntimeMs, base.DowntimeMs)
		if q.TotalMs <= q.DowntimeMs {
			t.Errorf("M=%v: total %v not above downtime %v", m, q.TotalMs, q.DowntimeMs)
		}
	}
}

func TestBestPicksColdForSmallContainers(t *testing.T) {
	p := DefaultProfile()
	in := Inputs{MemoryBytes: 16 << 20, DirtyRatePagesPerSec: 100, BandwidthBps: 125e6}
	preds, feasible, rec, reason := Best(p, in, 1000)
	if len(preds) != 4 {
		t.Fatalf("got %d predictions, want 4 (no native pre-copy without soft-dirty)", len(preds))
	}
	if rec != ModeCold {
		t.Errorf("recommended %q (%s), want cold", rec, reason)
	}
	if len(feasible) != 4 || !strings.Contains(reason, "lowest total") {
		t.Errorf("feasible %v, reason %q", feasible, reason)
	}
}

func TestBestPicksPostcopyForTightBudget(t *testing.T) {
	p := DefaultProfile()
	in := Inputs{MemoryBytes: 4 << 30, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	_, feasible, rec, reason := Best(p, in, 500)
	if rec != ModePostcopy || !reflect.DeepEqual(feasible, []string{ModePostcopy}) {
		t.Errorf("recommended %q, feasible %v (%s); want post-copy only", rec, feasible, reason)
	}
}

func TestBestNoneFeasible(t *testing.T) {
	p := DefaultProfile()
	in := Inputs{MemoryBytes: 4 << 30, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	preds, feasible, rec, reason := Best(p, in, 0.1)
	if rec != "" || len(feasible) != 0 || len(preds) != 4 {
		t.Fatalf("recommended %q feasible %v; want none", rec, feasible)
	}
	if !strings.Contains(reason, "no mode meets") || !strings.Contains(reason, ModePostcopy) {
		t.Errorf("reason %q should say none fits and name post-copy's downtime", reason)
	}
}

func TestBestTieGoesToLowerDowntimeThenOrder(t *testing.T) {
	q := func(total, down float64) Prediction { return Prediction{TotalMs: total, DowntimeMs: down} }
	if !lowerCost(q(100, 10), q(100, 20)) || lowerCost(q(100, 20), q(100, 10)) {
		t.Error("on equal totals the lower downtime must win")
	}
	if lowerCost(q(100, 10), q(100, 10)) {
		t.Error("a full tie must keep the earlier one")
	}
	if !lowerCost(q(99, 50), q(100, 10)) {
		t.Error("the lower total must win")
	}
	// Empty memory, no lazy setup: every mode costs freeze + dump + restore.
	p := DefaultProfile()
	p.LazySetupS = 0
	_, feasible, rec, reason := Best(p, Inputs{BandwidthBps: 1e8}, 1000)
	if rec != ModeCold || len(feasible) != 4 || !strings.Contains(reason, "resumable") {
		t.Errorf("recommended %q feasible %v reason %q", rec, feasible, reason)
	}
}

// A budget only post-copy modes meet: the one that leans least on the
// source afterwards wins, and the reason says why.
func TestBestPrefersLessDependenceAmongLazyModes(t *testing.T) {
	p := exactProfile() // the budget against the point predictions
	in := Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	// Pre-copy restoring lazily needs ~150-190 ms here (its frozen round
	// reads all 256 MiB), hybrid ~140-180, post-copy ~97.
	const budget = 130
	preds, feasible, rec, reason := Best(p, in, budget)
	var post, hy Prediction
	for _, q := range preds {
		switch q.Mode {
		case ModePostcopy:
			post = q
		case ModeHybrid:
			hy = q
		}
	}
	for _, m := range feasible {
		if isResumable(m) {
			t.Fatalf("a resumable mode fits %d ms: %v", budget, feasible)
		}
	}
	want := ModePostcopy
	if hy.DegradedMs < post.DegradedMs && hy.DowntimeMs <= budget {
		want = ModeHybrid
	}
	if rec != want || !strings.Contains(reason, "depends least") {
		t.Errorf("recommended %q (%q), want %s; post-copy degraded %.0f ms, hybrid %.0f ms", rec, reason, want, post.DegradedMs, hy.DegradedMs)
	}
}

func TestBestRoundCount(t *testing.T) {
	p := DefaultProfile()
	// 1 GiB dirtied at 80 MB/s over a 1 Gbit/s link: hybrid's downtime
	// shrinks with every round, and each round costs total time.
	in := Inputs{MemoryBytes: 1 << 30, DirtyRatePagesPerSec: 20000, BandwidthBps: 125e6}
	const budget = 3000
	preds, _, _, _ := Best(p, in, budget)
	var hy Prediction
	for _, q := range preds {
		if q.Mode == ModeHybrid {
			hy = q
		}
	}
	want := 0
	for n := 1; n <= DefaultMaxRounds; n++ {
		if Predict(p, in, ModeHybrid, n).DowntimeMs <= budget {
			want = n
			break
		}
	}
	if want <= 1 {
		t.Fatalf("test setup: want a case needing several rounds, got %d", want)
	}
	if hy.Rounds != want {
		t.Errorf("hybrid rounds %d, want %d (the fewest within budget: lowest total)", hy.Rounds, want)
	}
	// Without any count in budget, the lowest downtime: the most rounds here.
	preds, _, _, _ = Best(p, in, 1)
	for _, q := range preds {
		if q.Mode == ModeHybrid && q.Rounds != DefaultMaxRounds {
			t.Errorf("hybrid rounds %d, want %d", q.Rounds, DefaultMaxRounds)
		}
	}
}

func TestBestNativeOnlyWithSoftDirty(t *testing.T) {
	p := DefaultProfile()
	p.SoftDirty = true
	preds, _, _, _ := Best(p, Inputs{MemoryBytes: 1 << 28, DirtyRatePagesPerSec: 100, BandwidthBps: 125e6}, 0)
	if len(preds) != 5 || preds[4].Mode != ModeNativePrecopy || preds[4].Note != "" {
		t.Errorf("want native pre-copy last, without a note: %+v", preds)
	}
}

func TestProfileJSON(t *testing.T) {
	p := DefaultProfile()
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseProfile(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p, back) {
		t.Errorf("round trip changed the profile:\n%+v\n%+v", p, back)
	}
	part, err := ParseProfile([]byte(`{"freeze_s": 0.02, "pam": {"alpha1": 3}}`))
	if err != nil {
		t.Fatal(err)
	}
	if part.FreezeS != 0.02 || part.DumpBps != p.DumpBps || part.PAM.Alpha1 != 3 || part.PAM.Sigma != 4096 {
		t.Errorf("partial profile did not keep defaults: %+v", part)
	}
	if _, err := ParseProfile([]byte(`{"link_efficiency": 1.5}`)); err == nil {
		t.Error("link efficiency above 1 accepted")
	}
	if _, err := ParseProfile([]byte(`{"dump_bps": 0}`)); err == nil {
		t.Error("zero dump rate accepted")
	}
}

func TestDumpTimeTwoRates(t *testing.T) {
	p := handProfile() // DumpBps 1e9
	approx(t, "one rate", p.dumpTime(2e9)*1000, 2000)
	p.DumpKneeBytes, p.DumpBpsAbove = 1e9, 0.5e9
	approx(t, "below the knee", p.dumpTime(0.5e9)*1000, 500)
	approx(t, "past the knee", p.dumpTime(2e9)*1000, 1000+2000)
}

// TestLazyPullRequests: with nothing faulting, the daemon's requests grow
// by 64 KiB each (64, 128, 192 KiB for 384 KiB); each takes the hosts a
// round trip plus its bytes, the link its bytes, and the slower side sets
// the pace, LazySerialShare of the faster adding to it.
func TestLazyPullRequests(t *testing.T) {
	p := handProfile()
	p.LazyRequestS, p.LazyBps = 0.001, 1e8
	m := float64(384 << 10)
	approx(t, "three requests, unshaped", p.LazyPull(m, 0, 0)*1000, (3*0.001+m/1e8)*1000)
	// Over 50 MB/s, 64 KiB: hosts 1 + 0.655 ms, link 1.311 ms; 128 KiB:
	// hosts 2.311, link 2.621; 192 KiB: hosts 2.966, link 3.932.
	k := float64(64 << 10)
	hosts := []float64{0.001 + k/1e8, 0.001 + 2*k/1e8, 0.001 + 3*k/1e8}
	link := []float64{k / 5e7, 2 * k / 5e7, 3 * k / 5e7}
	approx(t, "three requests over 50 MB/s", p.LazyPull(m, 5e7, 0)*1000, (hosts[0]+link[1]+link[2])*1000)
	p.LazySerialShare = 0.5
	approx(t, "half the faster side adding", p.LazyPull(m, 5e7, 0)*1000,
		(hosts[0]+link[0]/2+link[1]+hosts[1]/2+link[2]+hosts[2]/2)*1000)
	p.LazySerialShare = 0
	approx(t, "three requests over 1 GB/s", p.LazyPull(m, 1e9, 0)*1000, (3*0.001+m/1e8)*1000)
	// Past 64 requests (130 MiB) every request is 4 MiB: 1 GiB is 64 + 222.5.
	g := float64(1 << 30)
	n := 64 + (g-float64(2080*lazyRequestStep))/lazyRequestMax
	approx(t, "1 GiB", p.LazyPull(g, 0, 0)*1000, (math.Ceil(n)*0.001+g/1e8)*1000)
}

// TestLazyPullFaults: faults cost FaultS each and keep the requests small,
// so writing slows the pull most where round trips, not bytes, dominate.
func TestLazyPullFaults(t *testing.T) {
	p := handProfile()
	p.LazyRequestS, p.LazyBps, p.FaultS = 0.0005, 1e9, 0.001
	m := 256e6
	quiet := p.LazyPull(m, 0, 0)
	busy := p.LazyPull(m, 0, 2000)
	if busy < 1.5*quiet {
		t.Errorf("unshaped: 2000 pages/s slows the pull only %.2f x (%.3f s -> %.3f s)", busy/quiet, quiet, busy)
	}
	slowQuiet, slowBusy := p.LazyPull(m, 1e7, 0), p.LazyPull(m, 1e7, 2000)
	if slowBusy/slowQuiet >= busy/quiet || slowBusy < slowQuiet {
		t.Errorf("a slow link should hide part of the faults: %.2f x there, %.2f x unshaped", slowBusy/slowQuiet, busy/quiet)
	}
}

// TestPushPull: with the push, post-copy's pull is the memory at the
// slower of the link and the frozen read, plus a request for each hole the
// faults left, four at once; a busier service ends later, and the slow
// daemon alone would be slower still.
func TestPushPull(t *testing.T) {
	p := handProfile()
	p.LazyRequestS, p.LazyBps, p.FaultS, p.FaultWaitS = 0.0005, 1e9, 0.001, 0
	m := 256e6
	approx(t, "quiet, 1e8 B/s link", p.PushPull(m, 1e8, 0)*1000, m/1e8*1000)
	approx(t, "quiet, unshaped (frozen read 4e9)", p.PushPull(m, 0, 0)*1000, m/4e9*1000)
	// 2.56 s of push at 2000 pages/s: 1000 faults a second on the half
	// still missing, each a hole the daemon fills with a request of its own.
	approx(t, "busy, 1e8 B/s link", p.PushPull(m, 1e8, 2000)*1000, (m/1e8+1000*m/1e8*0.001/4)*1000)
	if push, alone := p.PushPull(m, 1e8, 2000), p.LazyPull(m, 1e8, 2000); push >= alone {
		t.Errorf("the push (%.3f s) should beat the daemon alone (%.3f s) at 2000 pages/s", push, alone)
	}
	q := Predict(p, Inputs{MemoryBytes: m, DirtyRatePagesPerSec: 2000, BandwidthBps: 1e8}, ModePostcopy, 0)
	approx(t, "post-copy total", q.TotalMs, q.DowntimeMs+p.PushPull(m, 1e8, 2000)*1000)
}

// With write tracking, a live round after the first takes what its writes
// cost (and the walk of the page tables); the frozen last round still
// reads all of memory.
func TestWriteTracking(t *testing.T) {
	p := DefaultProfile()
	tracked := p
	tracked.WriteTracking = true
	in := func(m float64) Inputs {
		return Inputs{MemoryBytes: m, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	}
	for _, mode := range []string{ModeHybrid, ModePrecopy} {
		for _, m := range []float64{256 << 20, 1 << 30} {
			off, on := Predict(p, in(m), mode, 3), Predict(tracked, in(m), mode, 3)
			if !(on.DowntimeMs < off.DowntimeMs) || !(on.TotalMs < off.TotalMs) {
				t.Errorf("%s %.0f MiB: tracking predicts downtime %.0f ms total %.0f ms, without %.0f / %.0f", mode, m/(1<<20),
					on.DowntimeMs, on.TotalMs, off.DowntimeMs, off.TotalMs)
			}
		}
	}
	// Hybrid's downtime: the frozen last round reads all of memory, with
	// tracking too (the validation of 2026-11-28 found the switchover
	// growing 0.28 ms a MiB): 768 MiB more is ~290 ms more at 2.8 GB/s.
	small, large := Predict(tracked, in(256<<20), ModeHybrid, 3), Predict(tracked, in(1<<30), ModeHybrid, 3)
	if d := large.DowntimeMs - small.DowntimeMs; d < 200 || d > 400 {
		t.Errorf("hybrid downtime with tracking: 256 MiB %.0f ms, 1 GiB %.0f ms: grows %.0f ms with memory", small.DowntimeMs, large.DowntimeMs, d)
	}
	// A live round after the first: round 0's duration times the dirty
	// rate, read and sent; nothing else but the walk.
	sent1, _, _ := tracked.liveRounds(in(1<<30), 1)
	sent2, el2, last := tracked.liveRounds(in(1<<30), 2)
	round0 := el2 - last
	want := 1000 * 4096 * round0
	if got := sent2 - sent1; math.Abs(got-want) > 1 {
		t.Errorf("round 1 sent %.0f bytes, want %.0f (1000 pages/s over round 0's %.2f s)", got, want, round0)
	}
	if wantLast := xfer(want, tracked.link(in(1<<30), 1)) + want/tracked.ReadHashBps + (1<<30)/DefaultTrackScanBps; math.Abs(last-wantLast) > 1e-9 {
		t.Errorf("round 1 took %.4f s, want %.4f", last, wantLast)
	}
}

// Shared memory goes with the frozen dump in every mode; the root
// filesystem's delta adds to the total only.
func TestUnmovedStateInEveryMode(t *testing.T) {
	p := DefaultProfile()
	base := Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 500, BandwidthBps: 125e6}
	with := base
	with.SharedBytes, with.RootfsBytes = 100<<20, 200<<20
	wantDown := math.Max(with.SharedBytes/p.DumpBps, with.SharedBytes/(p.LinkEfficiency*base.BandwidthBps)) * 1000
	wantRootfs := with.RootfsBytes / (p.LinkEfficiency * base.BandwidthBps) * 1000
	for _, mode := range EngineModes {
		a, b := Predict(p, base, mode, 2), Predict(p, with, mode, 2)
		if d := b.DowntimeMs - a.DowntimeMs; math.Abs(d-wantDown) > 1e-6 {
			t.Errorf("%s: downtime grew by %.1f ms, want %.1f", mode, d, wantDown)
		}
		if d := b.TotalMs - a.TotalMs; math.Abs(d-wantDown-wantRootfs) > 1e-6 {
			t.Errorf("%s: total grew by %.1f ms, want %.1f", mode, d, wantDown+wantRootfs)
		}
	}
	bad := base
	bad.SharedBytes = -1
	if q := Predict(p, bad, ModeCold, 1); !math.IsNaN(q.DowntimeMs) {
		t.Error("negative shared memory predicted")
	}
}

// The runtime's limits: one that cannot restore lazily gets no post-copy
// or hybrid, and Best never recommends them; one that copies the images
// before its restore pays for all of memory in cold and pre-copy, for
// none of it in the lazy modes, which Best then prefers.
func TestRuntimeLimits(t *testing.T) {
	p := DefaultProfile()
	in := Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 100, BandwidthBps: 125e6}
	plain := map[string]Prediction{}
	for _, mode := range EngineModes {
		plain[mode] = Predict(p, in, mode, 2)
	}

	noLazy := in
	noLazy.NoLazyRestore = true
	for _, mode := range []string{ModePostcopy, ModeHybrid} {
		if q := Predict(p, noLazy, mode, 2); !math.IsNaN(q.DowntimeMs) || !strings.Contains(q.Note, "lazily") {
			t.Errorf("%s without a lazy restore: %+v", mode, q)
		}
	}
	if q := Predict(p, noLazy, ModeCold, 1); q.DowntimeMs != plain[ModeCold].DowntimeMs {
		t.Errorf("cold changed without a lazy restore: %v, was %v", q.DowntimeMs, plain[ModeCold].DowntimeMs)
	}
	preds, feasible, rec, _ := Best(p, noLazy, 0)
	if rec == ModePostcopy || rec == ModeHybrid || slices.Contains(feasible, ModePostcopy) || slices.Contains(feasible, ModeHybrid) {
		t.Errorf("without a lazy restore: feasible %v, recommended %s", feasible, rec)
	}
	for _, q := range preds {
		if q.Mode == ModePostcopy || q.Mode == ModeHybrid || math.IsNaN(q.DowntimeMs) {
			t.Errorf("without a lazy restore Best lists %+v (reports carry its predictions as JSON, which has no NaN)", q)
		}
	}

	// A runtime whose restore copies the images (Docker): where it
	// restores lazily, no mode's copy holds memory (cold goes through the
	// rebuild switchover); where it cannot, cold's and pre-copy's hold all
	// of it.
	copies := in
	copies.CopiesImages = true
	p.ImageCopyBps = 64 << 20 // 4 s for 256 MiB
	if !p.LazyDump {
		t.Fatal("the test's profile has no lazy dump")
	}
	for _, mode := range EngineModes {
		q := Predict(p, copies, mode, 2)
		want := plain[mode]
		if mode == ModeCold {
			r := p.coldRebuild(copies)
			want = Prediction{DowntimeMs: r.down * 1000, TotalMs: (r.total + p.SetupS) * 1000}
		}
		if math.Abs(q.DowntimeMs-want.DowntimeMs) > 1 || math.Abs(q.TotalMs-want.TotalMs) > 1 {
			t.Errorf("%s copying the images, restored lazily: downtime %.0f ms, total %.0f ms, want %.0f and %.0f", mode, q.DowntimeMs, q.TotalMs, want.DowntimeMs, want.TotalMs)
		}
	}
	if cr, c := Predict(p, copies, ModeCold, 1), plain[ModeCold]; !(cr.DowntimeMs < c.DowntimeMs) || cr.DegradedMs <= 0 {
		t.Errorf("cold through the rebuild: %+v, against cold's %+v: want less downtime (no memory written at the restore) and a pull after", cr, c)
	}
	copiesAll := copies
	copiesAll.NoLazyRestore = true
	for _, mode := range []string{ModeCold, ModePrecopy} {
		q, base := Predict(p, copiesAll, mode, 2), Predict(p, noLazy, mode, 2)
		if extra := q.DowntimeMs - base.DowntimeMs; math.Abs(extra-4000) > 1 || math.Abs(q.TotalMs-base.TotalMs-4000) > 1 {
			t.Errorf("%s copying the images, no lazy restore: downtime +%.0f ms, total +%.0f ms, want +4000", mode, extra, q.TotalMs-base.TotalMs)
		}
	}
	if _, _, rec, _ := Best(p, copiesAll, 1000); rec != "" {
		t.Errorf("copying all of memory, within 1 s: recommended %q", rec)
	}
	p.ImageCopyBps = -1
	if q := Predict(p, copies, ModeCold, 1); !math.IsNaN(q.DowntimeMs) {
		t.Errorf("a negative copy rate predicted %+v", q)
	}
}

// A bound on how long the source stays frozen rules out post-copy, whose
// frozen source serves its pages until the last is pulled, where the pull
// is long: 4 GiB under a tight budget then fits no mode, and the reason
// names the shortest hold on offer.
func TestBestHonoursTheSourcesFrozenBound(t *testing.T) {
	p := DefaultProfile()
	in := Inputs{MemoryBytes: 4 << 30, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	preds, _, _, _ := Best(p, in, 500)
	var post Prediction
	for _, q := range preds {
		if q.Mode == ModePostcopy {
			post = q
		}
	}
	held := HeldHighMs(post)
	if held <= post.DowntimeHighMs || held < post.DegradedMs {
		t.Fatalf("post-copy holds the source %v ms, not its downtime's %v plus its pull's %v", held, post.DowntimeHighMs, post.DegradedMs)
	}
	in.MaxFrozenMs = held - 1
	_, feasible, rec, reason := Best(p, in, 500)
	if rec != "" || len(feasible) != 0 {
		t.Fatalf("recommended %q, feasible %v: post-copy holds the source %v ms, over the %v ms bound", rec, feasible, held, in.MaxFrozenMs)
	}
	if !strings.Contains(reason, "the source frozen at most") || !strings.Contains(reason, "the shortest hold of the source") {
		t.Errorf("reason %q: want the bound and the shortest hold named", reason)
	}
	// Without the budget, a bound every resumable mode meets changes nothing
	// of the pick; a bound only cold's hold exceeds rules cold out.
	in.MaxFrozenMs = 0
	_, _, free, _ := Best(p, in, 0)
	in.MaxFrozenMs = 1e9
	if _, _, bound, _ := Best(p, in, 0); bound != free {
		t.Errorf("a bound no mode reaches changed the pick: %s, not %s", bound, free)
	}
	small := Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 1000, BandwidthBps: 125e6}
	preds, _, _, _ = Best(p, small, 0)
	var cold, pre Prediction
	for _, q := range preds {
		switch q.Mode {
		case ModeCold:
			cold = q
		case ModePrecopy:
			pre = q
		}
	}
	if HeldHighMs(pre) >= HeldHighMs(cold) {
		t.Fatalf("pre-copy holds %v ms, cold %v ms: want pre-copy shorter", HeldHighMs(pre), HeldHighMs(cold))
	}
	small.MaxFrozenMs = (HeldHighMs(pre) + HeldHighMs(cold)) / 2
	_, feasible, _, _ = Best(p, small, 0)
	if slices.Contains(feasible, ModeCold) || !slices.Contains(feasible, ModePrecopy) {
		t.Errorf("feasible %v under a %v ms bound: cold (%v ms) out, pre-copy (%v ms) in", feasible, small.MaxFrozenMs, HeldHighMs(cold), HeldHighMs(pre))
	}
}

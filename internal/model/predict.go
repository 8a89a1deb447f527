package model

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ferry-migrate/ferry/api"
)

// Modes Predict knows. The first four are ferry's engine modes.
const (
	ModeCold          = api.ModeCold
	ModePrecopy       = api.ModePrecopy // content-based (no kernel dirty tracking)
	ModePostcopy      = api.ModePostcopy
	ModeHybrid        = api.ModeHybrid
	ModeNativePrecopy = "precopy-native" // CRIU pre-dump with soft-dirty: PAM
)

// EngineModes are the modes ferry's engine migrates with, in the order
// reports and grids list them.
var EngineModes = []string{ModeCold, ModePrecopy, ModePostcopy, ModeHybrid}

// LazyMode says whether mode restores lazily: the copy runs while its
// pages still arrive.
func LazyMode(mode string) bool { return mode == ModePostcopy || mode == ModeHybrid }

// DefaultMaxRounds is how many live rounds Best tries when Inputs does not
// say (the engine's own default).
const DefaultMaxRounds = 8

// Inputs describe the workload and the link of one migration.
type Inputs struct {
	MemoryBytes          float64 `json:"memory_bytes"`             // M: the container's memory
	DirtyRatePagesPerSec float64 `json:"dirty_rate_pages_per_sec"` // R: pages written per second while it runs
	BandwidthBps         float64 `json:"bandwidth_bps"`            // L: link capacity in BYTES per second
	// RoundBandwidthBps optionally gives L_i per round (index 0 = round 0;
	// the switchover uses the index after the last round; the last value
	// repeats). It overrides BandwidthBps.
	RoundBandwidthBps []float64 `json:"round_bandwidth_bps,omitempty"`
	// HotBytes optionally bounds what one interval can find dirty (the
	// working set); 0 means all of memory.
	HotBytes float64 `json:"hot_bytes,omitempty"`
	// MaxRounds bounds Best's search over live rounds; 0 means DefaultMaxRounds.
	MaxRounds int `json:"max_rounds,omitempty"`
	// SharedBytes is shared memory (a database's buffers): no round reads
	// it and no lazy dump leaves it behind, so CRIU dumps it whole while
	// the container is frozen, in every mode.
	SharedBytes float64 `json:"shared_bytes,omitempty"`
	// RootfsBytes is the root filesystem's live delta (the container's
	// own layer, or its whole tree), sent before the technique starts.
	RootfsBytes float64 `json:"rootfs_bytes,omitempty"`
	// NoLazyRestore: the container's runtime restores only from complete
	// images here (CRIU's lazy pages do not work on the host), so
	// post-copy and hybrid cannot move it.
	NoLazyRestore bool `json:"no_lazy_restore,omitempty"`
	// CopiesImages: the runtime's restore copies the images first (Docker
	// streams them into containerd, which unpacks them), at the profile's
	// ImageCopyBps, while the container is down.
	CopiesImages bool `json:"copies_images,omitempty"`
	// RTTSeconds is the round trip between the source and the
	// destination (0: a near link, whose round trips cost nothing).
	RTTSeconds float64 `json:"rtt_s,omitempty"`
	// KeepsAddress: the container's address moves with it, handed over
	// at the freeze (a round trip more while it is down).
	KeepsAddress bool `json:"keeps_address,omitempty"`
	// MaxFrozenMs bounds how long Best's modes may hold the source frozen
	// (HeldHighMs); 0 means no bound. A Kubernetes pod's liveness probe
	// restarts a container silent for longer.
	MaxFrozenMs float64 `json:"max_frozen_ms,omitempty"`
}

// HeldHighMs is how long q holds the source frozen, by its upper bound:
// its downtime, and for a lazy mode the pull after it, while the frozen
// source serves the pages (scaled as the total's interval is).
func HeldHighMs(q Prediction) float64 {
	pull := q.DegradedMs
	if q.TotalMs > 0 && q.TotalHighMs > q.TotalMs {
		pull *= q.TotalHighMs / q.TotalMs
	}
	return q.DowntimeHighMs + pull
}

// Prediction is one technique's predicted cost.
type Prediction = api.Prediction

func (in Inputs) check() error {
	switch {
	case !(in.MemoryBytes >= 0) || math.IsInf(in.MemoryBytes, 0):
		return fmt.Errorf("memory must be a non-negative number, got %v", in.MemoryBytes)
	case !(in.DirtyRatePagesPerSec >= 0) || math.IsInf(in.DirtyRatePagesPerSec, 0):
		return fmt.Errorf("dirty rate must be a non-negative number, got %v", in.DirtyRatePagesPerSec)
	case !(in.BandwidthBps >= 0):
		return fmt.Errorf("bandwidth must not be negative, got %v", in.BandwidthBps)
	case !(in.SharedBytes >= 0) || math.IsInf(in.SharedBytes, 0):
		return fmt.Errorf("shared memory must be a non-negative number, got %v", in.SharedBytes)
	case !(in.RootfsBytes >= 0) || math.IsInf(in.RootfsBytes, 0):
		return fmt.Errorf("root filesystem bytes must be a non-negative number, got %v", in.RootfsBytes)
	case !(in.RTTSeconds >= 0) || in.RTTSeconds > 10:
		return fmt.Errorf("round trip must be between 0 and 10 s, got %v", in.RTTSeconds)
	}
	for _, b := range in.RoundBandwidthBps {
		if !(b >= 0) {
			return fmt.Errorf("round bandwidth must not be negative, got %v", b)
		}
	}
	return nil
}

// Predict returns the predicted downtime, total time and bytes of one mode
// with the given number of live rounds (pre-copy, hybrid and native
// pre-copy; at least 1, ignored by cold and post-copy). An unknown mode or
// invalid inputs give NaN times and the reason in Note.
func Predict(p Profile, in Inputs, mode string, rounds int) Prediction {
	bad := func(why string) Prediction {
		return Prediction{Mode: mode, DowntimeMs: math.NaN(), TotalMs: math.NaN(), Bytes: math.NaN(), Note: why}
	}
	if err := in.check(); err != nil {
		return bad(err.Error())
	}
	if err := p.Validate(); err != nil {
		return bad(err.Error())
	}
	rounds = max(rounds, 1)
	lazy := LazyMode(mode)
	if lazy && in.NoLazyRestore {
		return bad("the container's runtime cannot restore lazily")
	}
	var t timeline
	switch mode {
	case ModeCold:
		if p.coldRebuilds(in) {
			t = p.coldRebuild(in)
		} else {
			t = p.cold(in)
		}
	case ModePrecopy:
		t = p.precopy(in, rounds)
	case ModePostcopy:
		t = p.postcopy(in)
	case ModeHybrid:
		t = p.hybrid(in, rounds)
	case ModeNativePrecopy:
		t = p.native(in, rounds)
	default:
		return bad(fmt.Sprintf("unknown mode %q", mode))
	}
	t = p.unmoved(in, t)
	if in.CopiesImages {
		// A full restore's images hold all of memory; a lazy one's (and
		// one from the destination's own images, pre-copy's and cold's
		// rebuild) only what CRIU dumps whole.
		img := in.MemoryBytes + in.SharedBytes
		if lazy || p.LazyDump && !in.NoLazyRestore && (mode == ModePrecopy || mode == ModeCold) {
			img = in.SharedBytes
		}
		c := img / p.imageCopyBps()
		t.down, t.total = t.down+c, t.total+c
	}
	if rtt := in.RTTSeconds; rtt > 0 {
		// The protocol's exchanges: before the technique (connections, the
		// offer, the root filesystem's manifest and delta) and while the
		// container is down (the switchover's requests, the restore's
		// reply, the commit).
		trips := p.switchoverRoundTrips(mode)
		if in.KeepsAddress {
			trips++
		}
		down := trips * rtt
		t.down += down
		t.total += down + p.setupRoundTrips()*rtt
		if mode == ModePostcopy {
			// The pull's last requests, each for a hole the faults cut,
			// wait a round trip apiece while the service runs degraded.
			pull := p.pullRoundTrips() * rtt
			t.total, t.degraded = t.total+pull, t.degraded+pull
		}
	}
	return p.withInterval(Prediction{
		Mode: mode, Rounds: t.rounds,
		DowntimeMs: t.down * 1000, TotalMs: (t.total + p.SetupS) * 1000, Bytes: t.bytes,
		FrozenMs: t.frozen * 1000, DegradedMs: t.degraded * 1000, Note: t.note,
	})
}

// Best predicts every mode this host and runtime can run (native pre-copy
// only with soft-dirty, post-copy and hybrid only with a lazy restore),
// each live mode at its best round count, and recommends one.
//
// A mode is feasible when its downtime's upper bound (DowntimeHighMs, the
// prediction interval's) is within maxDowntimeMs (≤ 0: no budget, every
// mode is): "fits the budget" then holds for about 9 migrations in 10. The recommendation is the feasible mode with the
// lowest total time, a tie going to the lower downtime; with none feasible,
// recommended is empty and reason names the shortest downtime on offer.
//
// The best round count follows the same rule among 1..MaxRounds rounds:
// lowest total among the counts within budget (ties: lower downtime, then
// fewer rounds), or the lowest downtime when no count is within budget.
func Best(p Profile, in Inputs, maxDowntimeMs float64) (preds []Prediction, feasible []string, recommended string, reason string) {
	within := func(q Prediction) bool {
		return !math.IsNaN(q.DowntimeMs) && (maxDowntimeMs <= 0 || q.DowntimeHighMs <= maxDowntimeMs) &&
			(in.MaxFrozenMs <= 0 || HeldHighMs(q) <= in.MaxFrozenMs)
	}
	maxRounds := in.MaxRounds
	if maxRounds <= 0 {
		maxRounds = DefaultMaxRounds
	}
	modes := slices.Clone(EngineModes)
	if p.SoftDirty {
		modes = append(modes, ModeNativePrecopy)
	}
	for _, mode := range modes {
		if in.NoLazyRestore && LazyMode(mode) {
			continue // not on offer: no prediction to list
		}
		best := Predict(p, in, mode, 1)
		if mode == ModePrecopy || mode == ModeHybrid || mode == ModeNativePrecopy {
			for n := 2; n <= maxRounds; n++ {
				if q := Predict(p, in, mode, n); better(q, best, within) {
					best = q
				}
			}
		}
		preds = append(preds, best)
		if within(best) {
			feasible = append(feasible, mode)
		}
	}

	budget := "no downtime budget"
	if maxDowntimeMs > 0 {
		budget = fmt.Sprintf("a %.0f ms downtime budget", maxDowntimeMs)
	}
	if in.MaxFrozenMs > 0 {
		budget += fmt.Sprintf(" and the source frozen at most %.0f ms", in.MaxFrozenMs)
	}
	if len(feasible) == 0 {
		var low *Prediction
		for i := range preds {
			if q := &preds[i]; !math.IsNaN(q.DowntimeMs) && (low == nil || q.DowntimeMs < low.DowntimeMs) {
				low = q
			}
		}
		if low == nil {
			return preds, nil, "", "no mode has a prediction: " + preds[0].Note
		}
		reason := fmt.Sprintf("no mode meets %s by its upper bound; the shortest downtime is %s at %.0f ms (up to %.0f ms)",
			budget, describe(*low), low.DowntimeMs, low.DowntimeHighMs)
		if in.MaxFrozenMs > 0 {
			var held *Prediction
			for i := range preds {
				if q := &preds[i]; !math.IsNaN(q.DowntimeMs) && (held == nil || HeldHighMs(*q) < HeldHighMs(*held)) {
					held = q
				}
			}
			reason += fmt.Sprintf("; the shortest hold of the source is %s's, up to %.0f ms", describe(*held), HeldHighMs(*held))
		}
		return preds, nil, "", reason
	}
	// Modes that keep the source resumable until the destination runs
	// (cold, pre-copy) come first: with them a failure costs a retry, not
	// the container. Among them the lowest total time wins. Only when none
	// fits do the lazy modes compete, ranked by how long the restored
	// container depends on memory still crossing the network.
	var rec *Prediction
	resumable := false
	for i := range preds {
		q := &preds[i]
		if !within(*q) || !isResumable(q.Mode) {
			continue
		}
		if rec == nil || lowerCost(*q, *rec) {
			rec, resumable = q, true
		}
	}
	if rec == nil {
		for i := range preds {
			q := &preds[i]
			if !within(*q) {
				continue
			}
			if rec == nil || q.DegradedMs < rec.DegradedMs || (nearlyEqual(q.DegradedMs, rec.DegradedMs) && lowerCost(*q, *rec)) {
				rec = q
			}
		}
	}
	if resumable {
		reason = fmt.Sprintf("%s: the source stays resumable until the destination runs, and it has the lowest total time (%.0f ms, downtime %.0f ms, up to %.0f ms) of such modes within %s (feasible: %s)",
			describe(*rec), rec.TotalMs, rec.DowntimeMs, rec.DowntimeHighMs, budget, strings.Join(feasible, ", "))
	} else {
		reason = fmt.Sprintf("%s: only post-copy modes fit %s (feasible: %s); of them it depends least on the source after the switchover (%.0f ms with pages still arriving; downtime %.0f ms, total %.0f ms). Should the source host fail for good within that time, the container is lost: post-copy's inherent risk",
			describe(*rec), budget, strings.Join(feasible, ", "), rec.DegradedMs, rec.DowntimeMs, rec.TotalMs)
	}
	return preds, feasible, rec.Mode, reason
}

// isResumable says whether a mode leaves the source able to resume until
// the destination has confirmed the restore.
func isResumable(mode string) bool {
	return mode == ModeCold || mode == ModePrecopy || mode == ModeNativePrecopy
}

// better reports whether round count q beats the best so far (see Best).
func better(q, best Prediction, within func(Prediction) bool) bool {
	if math.IsNaN(q.TotalMs) {
		return false
	}
	qi, bi := within(q), within(best)
	switch {
	case qi != bi:
		return qi
	case qi:
		return lowerCost(q, best)
	case !nearlyEqual(q.DowntimeMs, best.DowntimeMs):
		return q.DowntimeMs < best.DowntimeMs
	default:
		return q.TotalMs < best.TotalMs && !nearlyEqual(q.TotalMs, best.TotalMs)
	}
}

// lowerCost orders by total time, then downtime; equal means not lower, so
// the earlier (fewer rounds, or earlier mode) stays.
func lowerCost(q, r Prediction) bool {
	if !nearlyEqual(q.TotalMs, r.TotalMs) {
		return q.TotalMs < r.TotalMs
	}
	return q.DowntimeMs < r.DowntimeMs && !nearlyEqual(q.DowntimeMs, r.DowntimeMs)
}

func nearlyEqual(a, b float64) bool {
	if a == b {
		return true
	}
	return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

func describe(q Prediction) string {
	switch {
	case q.Rounds == 1:
		return q.Mode + " (1 round)"
	case q.Rounds > 1:
		return fmt.Sprintf("%s (%d rounds)", q.Mode, q.Rounds)
	}
	return q.Mode
}

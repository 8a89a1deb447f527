package model

import "math"

// The technique models follow PAM's structure (fixed cost + per-byte cost
// for each step, transfer = bytes / link, dirty bytes = rate × time the
// service ran) applied to what ferry actually does for each mode. All
// durations here are in seconds; Predict converts to milliseconds.

// timeline is one technique's prediction in seconds.
type timeline struct {
	rounds   int
	down     float64
	total    float64
	bytes    float64
	frozen   float64 // freezes before the switchover
	degraded float64 // after resume, until every page is in place
	note     string
}

// link is the payload throughput of round i (the switchover uses the index
// after the last round): the round's capacity times the link efficiency.
//
// Over a far link a session keeps at most the profile's window in flight,
// so it carries no more than window/RTT whatever the link's capacity (an
// unshaped link, 0, then carries exactly that).
func (p Profile) link(in Inputs, i int) float64 {
	bw := in.BandwidthBps
	if len(in.RoundBandwidthBps) > 0 {
		bw = linkAt(in.RoundBandwidthBps, i)
	}
	bw *= p.LinkEfficiency
	if w := p.window(); in.RTTSeconds > 0 && w > 0 {
		if far := w / in.RTTSeconds; bw <= 0 || far < bw {
			return far
		}
	}
	return bw
}

// unmoved adds to a technique's timeline what no technique moves live: the
// root filesystem's live delta beyond what setup_s holds, over the link
// before the technique starts,
// and shared memory, streamed with the frozen dump (CRIU's page output and
// the link in one pipeline, as cold's memory).
func (p Profile) unmoved(in Inputs, t timeline) timeline {
	if extra := in.RootfsBytes - p.SetupRootfsBytes; extra > 0 {
		t.total += xfer(extra, p.link(in, 0))
		t.bytes += extra
	}
	if s := in.SharedBytes; s > 0 {
		d := math.Max(s/p.DumpBps, xfer(s, p.link(in, t.rounds)))
		t.down, t.total, t.bytes = t.down+d, t.total+d, t.bytes+s
	}
	return t
}

// dirtyCap bounds what one interval can find dirty: the working set when
// given, else all of memory (a page written twice is sent once).
func dirtyCap(in Inputs) float64 {
	if in.HotBytes > 0 && in.HotBytes < in.MemoryBytes {
		return in.HotBytes
	}
	return in.MemoryBytes
}

// dirtied is the bytes the service dirties while running for t seconds.
func (p Profile) dirtied(in Inputs, t float64) float64 {
	return math.Min(dirtyCap(in), in.DirtyRatePagesPerSec*p.PageSize*t)
}

// restore is ψ + ω·M for a normal (non-lazy) restore.
func (p Profile) restore(m float64) float64 { return p.RestoreFixedS + m/p.RestoreBps }

// cold: freeze, stream a full dump to the destination, restore. CRIU's page
// output and the link form one pipeline, so the slower of the two sets the
// pace; the service is down throughout.
func (p Profile) cold(in Inputs) timeline {
	m := in.MemoryBytes
	stream := math.Max(p.dumpTime(m), xfer(m, p.link(in, 0)))
	down := p.FreezeS + p.DumpFixedS + stream + p.restore(m)
	return timeline{down: down, total: down, bytes: m}
}

// coldRebuilds says cold goes through the rebuild switchover (the
// engine's coldRebuild): where the runtime's restore copies its images
// and a lazy dump and restore spare it the memory.
func (p Profile) coldRebuilds(in Inputs) bool {
	return in.CopiesImages && p.LazyDump && !in.NoLazyRestore
}

// coldRebuild is pre-copy's rebuild switchover with no live round: all of
// memory is the frozen last round, and the destination's lazy-pages
// daemon copies it in from its own images after the commit.
func (p Profile) coldRebuild(in Inputs) timeline {
	m := in.MemoryBytes
	down := p.SwitchoverS(m, m, p.link(in, 0), true)
	pull := m / LocalPullBps
	return timeline{down: down, total: down + pull, bytes: m, degraded: pull}
}

// liveRounds models n ≥ 1 content-based rounds while the service runs:
// round 0 sends all of memory, round i the pages written since round i−1
// read them; each round also reads and hashes all of memory. Both rounds
// read memory front to back at their own pace, so a page's window between
// its two reads is (t_{i−1} + t_i)/2 on average, not t_{i−1}: the
// validation runs found rounds 12-18 % smaller than the latter predicts.
// With t_i = V_i/(η·L) + M/ReadHashBps and V_i = R·σ·window (capped):
//
//	V_i = R·σ·(t_{i−1} + M/ReadHashBps) / (2 − R·σ·r/(η·L))
//
// where r is the share of a page a round sends (XOR deltas). It returns the
// bytes sent, the time taken and the last round's duration.
//
// With write tracking a round after the first reads only the pages
// written since the round before began (its scan is the kernel's, at its
// start): V_i = R·σ·t_{i−1}, and t_i = V_i/(η·L) + V_i/ReadHashBps +
// M/TrackScanBps.
func (p Profile) liveRounds(in Inputs, n int) (sent, elapsed, last float64) {
	m := in.MemoryBytes
	scan := m / p.ReadHashBps
	for i := 0; i < n; i++ {
		v := m
		if i > 0 && p.WriteTracking {
			d := p.dirtied(in, last)
			v = d * p.redirty(i)
			last = xfer(v, p.link(in, i)) + d/p.ReadHashBps + m/p.trackScan()
			sent += v
			elapsed += last
			continue
		}
		if i > 0 {
			r := p.redirty(i)
			rate := in.DirtyRatePagesPerSec * p.PageSize
			d := dirtyCap(in)
			if den := 2 - rate*r/p.link(in, i); den > 0 {
				d = math.Min(d, rate*(last+scan)/den)
			}
			v = d * r
		}
		last = xfer(v, p.link(in, i)) + scan
		sent += v
		elapsed += last
	}
	return sent, elapsed, last
}

// switchoverDirty is what the switchover finds written since the last live
// round read it: half that round's duration on average, or all of it with
// write tracking (the round's scan was at its start).
func (p Profile) switchoverDirty(in Inputs, last float64) float64 {
	if p.WriteTracking {
		return p.dirtied(in, last)
	}
	return p.dirtied(in, last/2)
}

// frozenScan is the frozen last round's reading: all of memory m, with
// write tracking too. The validation of 2026-11-28 (96-384 MiB, every live
// mode) found the switchover's dump growing by 0.28 ms a MiB, the frozen
// read's rate, not the page-table walk's 14 GB/s a tracked live round
// shows: the final round reads every page. left is sent alongside.
func (p Profile) frozenScan(m float64) float64 {
	return m / p.frozenRead()
}

// DefaultTrackScanBps is the kernel's walk of a process's page tables for
// written pages (PAGEMAP_SCAN) with ferry's bookkeeping (a lookup per page
// not written), in bytes of memory a second: a 1 GiB round that found
// ~250 pages written took 72-106 ms on the development VM.
const DefaultTrackScanBps = 14e9

func (p Profile) trackScan() float64 {
	if p.TrackScanBps > 0 {
		return p.TrackScanBps
	}
	return DefaultTrackScanBps
}

// notConverging reports whether the service dirties memory at least as fast
// as the link carries it, in which case rounds stop shrinking.
func (p Profile) notConverging(in Inputs) bool {
	return in.DirtyRatePagesPerSec*p.PageSize >= p.link(in, 0) && in.MemoryBytes > 0
}

// precopy is ferry's content-based pre-copy: n live rounds, then the
// switchover (SwitchoverS) and its restore; a lazy one leaves the memory
// to a lazy-pages daemon reading the destination's images, which copies
// it in at LocalPullBps after the commit.
func (p Profile) precopy(in Inputs, n int) timeline {
	m := in.MemoryBytes
	sent, elapsed, last := p.liveRounds(in, n)
	delta := p.switchoverDirty(in, last)
	lazy := p.LazyDump && !in.NoLazyRestore
	var down, bytes, pull float64
	if p.LazyDump {
		delta *= p.redirty(n)
		down = p.SwitchoverS(m, delta, p.link(in, n), lazy)
		bytes = delta
	} else {
		refs := (m - delta) / p.PageSize * p.DedupRefBytes
		down = p.SwitchoverS(m, delta+refs, p.link(in, n), false)
		bytes = delta + refs
	}
	if lazy {
		pull = m / LocalPullBps
	}
	t := timeline{rounds: n, down: down, total: elapsed + down + pull, bytes: sent + bytes, degraded: pull}
	if p.notConverging(in) {
		t.note = "dirty rate at or above link throughput: rounds do not shrink"
	}
	return t
}

// SwitchoverS predicts content-based pre-copy's downtime, in seconds, for
// memory m when left bytes are still to send over a link carrying linkBps
// bytes/s. Where CRIU's lazy dump works (LazyDump), the memory-less dump
// runs alongside a read of the frozen memory whose changes go as a last
// round, and the destination completes the images from its copy (a parent
// image it kept current during the rounds) before the restore: a lazy one
// (lazyRestore: the runtime restores lazily) costs what post-copy's does,
// whatever the memory, a normal one writes all of it. Otherwise a full
// local dump streams through the deduplicating proxy, which hashes every
// page (dump and hashing share the CPUs; the link carries what is left
// alongside).
func (p Profile) SwitchoverS(m, left, linkBps float64, lazyRestore bool) float64 {
	if p.LazyDump {
		final := math.Max(p.DumpFixedS, p.frozenScan(m)+xfer(left, linkBps))
		restore := p.restore(m)
		if lazyRestore {
			restore = p.RestoreFixedS + p.LazySetupS
		}
		return p.FreezeS + final + m/p.ImageFillBps + restore
	}
	stream := math.Max(p.dumpTime(m)+m/p.ReadHashBps, xfer(left, linkBps))
	return p.FreezeS + p.DumpFixedS + stream + p.restore(m)
}

// postcopy: freeze, dump everything but memory, restore lazily; the source
// then pushes the memory while faults are served on demand. Downtime does
// not depend on M; the service runs degraded until the last page arrives.
//
// Its clients wait longer than the restore: the service's first requests
// after it touch pages still at the source, a fault's round trip each
// (FirstFaultsS, and the link's round trip).
func (p Profile) postcopy(in Inputs) timeline {
	m := in.MemoryBytes
	down := p.FreezeS + p.DumpFixedS + p.RestoreFixedS + p.LazySetupS + p.firstFaults()
	pull := p.PushPull(m, p.link(in, 0), in.DirtyRatePagesPerSec)
	return timeline{down: down, total: down + pull, bytes: m, degraded: pull}
}

// PushPull is post-copy's pull with the push (engine/push.go): the source
// sends all of the memory at the slower of the link and its read of the
// frozen task, and the lazy-pages daemon (ferry's CRIU, patch 0004) places
// what arrives as it comes, a few requests in flight. What it has left
// once the push is in are the holes the faults cut in the memory's runs:
// one request each (fault_s), lazyDepth at once. linkBps 0: the link does
// not limit.
func (p Profile) PushPull(m, linkBps, rate float64) float64 {
	send := p.frozenRead()
	if linkBps > 0 {
		send = math.Min(send, linkBps)
	}
	push := m / send
	faults := p.FaultRate(rate, 0.5) * push
	return push + faults*p.FaultS/lazyDepth
}

// LocalPullBps is how fast a lazy-pages daemon reading the destination's
// own images copies them into the restored process (pre-copy's lazy
// restore): 256 MiB in ~124 ms, 1 GiB in 430-550 ms on the development
// machine (docs/BENCHMARKS.md), ferry's CRIU.
const LocalPullBps = 2e9

// lazyDepth is how many background requests ferry's CRIU keeps in flight
// when the pages are near (criu/uffd.c, xfer_depth).
const lazyDepth = 4

// The lengths of CRIU's background requests (criu/uffd.c): the lazy-pages
// daemon asks for 64 KiB, 64 KiB more each request after, up to 4 MiB, and
// back to 64 KiB after a page fault.
const (
	lazyRequestStep = 64 << 10
	lazyRequestMax  = 4 << 20
)

// FaultRate is how many faults a second a service writing rate pages a
// second causes while the share missing of its memory is not there yet:
// every write to a missing page faults, but a writer waiting for a fault's
// page cannot fault again meanwhile, so at most 1/FaultWaitS a second.
func (p Profile) FaultRate(rate, missing float64) float64 {
	f := rate * missing
	if p.FaultWaitS > 0 {
		f = math.Min(f, 1/p.FaultWaitS)
	}
	return f
}

// LazyRequests is how many background requests the daemon makes for m
// bytes when nothing faults (64 KiB, 128 KiB, ... up to 4 MiB each).
func LazyRequests(m float64) float64 {
	return Profile{LazyRequestS: 1, LazyBps: math.Inf(1)}.LazyPull(m, 0, 0)
}

// LazyPull is what post-copy's pull of m bytes took before the push, in
// seconds, request by request the way CRIU's lazy-pages daemon makes them
// (one background request in flight): calibrate still fits its terms from
// runs without the push, for comparison. A request takes the hosts LazyRequestS (its round trip through
// both agents and CRIU's page server) plus its bytes at LazyBps (the page
// server reading the frozen task, both agents' TLS, the daemon placing the
// pages), and the link its bytes; the slower side sets the pace and
// LazySerialShare of the faster side's time adds to it (0: they overlap
// fully). The service writes rate pages a second; a write to a page not
// there yet faults (FaultRate): a one-page request taking the hosts FaultS,
// which stretches their time and sends the next background request back to
// 64 KiB. At a few thousand pages a second the pull therefore runs in small
// requests, and unless the link is slow the hosts' round trips set its
// pace. The recursion follows expected values (a fault resets the length
// with probability 1 − e^(−faults expected during the request)). linkBps 0
// means the link does not limit (unshaped).
func (p Profile) LazyPull(m, linkBps, rate float64) float64 {
	daemon := 1 / p.LazyBps
	var wire float64
	if linkBps > 0 {
		wire = 1 / linkBps
	}
	var t, got float64
	length := float64(lazyRequestStep)
	for got < m {
		s := math.Min(length, m-got)
		var fr float64
		if rate > 0 {
			fr = p.FaultRate(rate, (m-got)/m)
		}
		// Faults take this share of the hosts' time meanwhile.
		load := math.Min(fr*p.FaultS, 0.9)
		onLink, onHosts := s*wire, (p.LazyRequestS+s*daemon)/(1-load)
		dt := math.Max(onLink, onHosts) + p.LazySerialShare*math.Min(onLink, onHosts)
		var faults float64
		if fr > 0 {
			faults = math.Min(fr*dt, (m-got-s)/p.PageSize)
		}
		t += dt + faults*p.PageSize*math.Max(wire, daemon)
		got += s + faults*p.PageSize
		reset := 1 - math.Exp(-faults)
		length = reset*lazyRequestStep + (1-reset)*math.Min(length+lazyRequestStep, lazyRequestMax)
	}
	return t
}

// hybrid: n live rounds, then freeze; a memory-less dump runs alongside a
// final read of the frozen memory, whose changed pages go as one more
// round; the lazy restore is then served from the destination's own copy.
func (p Profile) hybrid(in Inputs, n int) timeline {
	m := in.MemoryBytes
	sent, elapsed, last := p.liveRounds(in, n)
	delta := p.switchoverDirty(in, last)
	left := delta * p.redirty(n)
	final := math.Max(p.DumpFixedS, p.frozenScan(m)+xfer(left, p.link(in, n)))
	down := p.FreezeS + final + p.RestoreFixedS + p.LazySetupS
	fill := m / p.localFill() // placing every page from the local copy
	t := timeline{rounds: n, down: down, total: elapsed + down + fill, bytes: sent + delta*p.redirty(n), degraded: fill}
	if p.notConverging(in) {
		t.note = "dirty rate at or above link throughput: rounds do not shrink"
	}
	return t
}

// native is CRIU's own pre-copy (pre-dump with soft-dirty tracking): PAM
// with n iterations before Stop&Copy (I = n-1) on this profile's link.
func (p Profile) native(in Inputs, n int) timeline {
	ls := make([]float64, n+1)
	for i := range ls {
		ls[i] = p.link(in, i)
	}
	r := PAM(p.PAM, PAMInputs{M: in.MemoryBytes, R: in.DirtyRatePagesPerSec, L: ls, I: n - 1})
	t := timeline{rounds: n, down: r.Downtime, total: r.Total, bytes: r.Bytes, frozen: r.Frozen}
	if !p.SoftDirty {
		t.note = "needs soft-dirty tracking, which this host's kernel lacks"
	}
	return t
}

// frozenRead is the last round's reading rate, the container frozen.
func (p Profile) frozenRead() float64 {
	if p.FrozenReadBps > 0 {
		return p.FrozenReadBps
	}
	return p.ReadHashBps
}

// localFill is hybrid's local fill rate; profiles from before it existed
// fall back to the lazy rate.
func (p Profile) localFill() float64 {
	if p.LocalFillBps > 0 {
		return p.LocalFillBps
	}
	return p.LazyBps
}

// redirty is the share of a page round i sends per dirty page. A page
// enters the source's delta cache when it is first found dirty again, so
// round 1 sends whole pages; from round 2 on RedirtyRatio applies (1 for
// profiles from before it existed).
func (p Profile) redirty(round int) float64 {
	if round >= 2 && p.RedirtyRatio > 0 {
		return p.RedirtyRatio
	}
	return 1
}

// dumpTime is a full dump's memory part: one rate, or two around a knee.
func (p Profile) dumpTime(m float64) float64 {
	if p.DumpKneeBytes > 0 && p.DumpBpsAbove > 0 && m > p.DumpKneeBytes {
		return p.DumpKneeBytes/p.DumpBps + (m-p.DumpKneeBytes)/p.DumpBpsAbove
	}
	return m / p.DumpBps
}

package model

import (
	"encoding/json"
	"fmt"
)

// Profile holds one host's fitted rates and fixed costs: what the
// technique models need beyond the workload and the link. It is
// JSON-serialisable so a calibration run can store it per host.
type Profile struct {
	Host   string `json:"host,omitempty"`
	Source string `json:"source,omitempty"` // where the numbers come from

	PageSize float64 `json:"page_size_bytes"` // σ

	FreezeS    float64 `json:"freeze_s"`     // β: pausing the container (cgroup freezer)
	DumpFixedS float64 `json:"dump_fixed_s"` // CRIU dump time besides memory; also a memory-less (lazy) dump
	DumpBps    float64 `json:"dump_bps"`     // CRIU's page output in a full dump, bytes/s
	// Above DumpKneeBytes of memory a full dump goes at DumpBpsAbove
	// instead (0: one rate throughout); measured here, the rate bends.
	DumpKneeBytes float64 `json:"dump_knee_bytes,omitempty"`
	DumpBpsAbove  float64 `json:"dump_bps_above,omitempty"`

	ReadHashBps float64 `json:"read_hash_bps"` // reading memory from the host and hashing it, bytes/s
	// FrozenReadBps is the same for the last round, read while the
	// container is frozen (hybrid, pre-copy's rebuild switchover): nothing
	// competes for the CPUs but CRIU. 0: read_hash_bps.
	FrozenReadBps float64 `json:"frozen_read_bps,omitempty"`

	RestoreFixedS float64 `json:"restore_fixed_s"` // ψ: restore at M = 0
	RestoreBps    float64 `json:"restore_bps"`     // 1/ω: restore's memory part, bytes/s

	LazySetupS float64 `json:"lazy_setup_s"` // extra fixed cost of a lazy restore (lazy-pages daemon, userfaultfd)
	// The lazy-pages daemon's pull (LazyPull): each request takes the
	// hosts LazyRequestS (its round trip through both agents and CRIU's
	// page server) plus its bytes at LazyBps, while the link carries them.
	LazyBps      float64 `json:"lazy_bps"`
	LazyRequestS float64 `json:"lazy_request_s"`
	// LazySerialShare is the share of a request's time on the faster of
	// link and hosts that does not overlap the slower's (0: fully
	// overlapped, 1: they add).
	LazySerialShare float64 `json:"lazy_serial_share"`
	// FaultS is the daemon's time per page fault: a one-page request ahead
	// of the background ones.
	FaultS float64 `json:"fault_s"`
	// FaultWaitS: a writer waits for each fault's page about this long, so
	// it faults at most 1/FaultWaitS times a second (0: no bound).
	FaultWaitS float64 `json:"fault_wait_s,omitempty"`
	// FirstFaultsS is what post-copy's clients wait beyond the restore:
	// the service's first requests fault on pages still at the source (0:
	// DefaultFirstFaultsS).
	FirstFaultsS float64 `json:"first_faults_s,omitempty"`
	// RedirtyRatio is the share of a page a live round (from the second
	// on) sends for a page dirtied again since it was last sent: XOR
	// deltas make it small for sparse writes, 1 for pages rewritten whole.
	// Round 1 and the switchover's dump send changed pages whole.
	RedirtyRatio float64 `json:"redirty_ratio"`
	// LocalFillBps: hybrid's lazy-pages daemon served from the
	// destination's own copy, bytes/s (no network in the way).
	LocalFillBps float64 `json:"local_fill_bps"`
	// ImageFillBps: pre-copy's rebuild switchover completing the lazy
	// dump's images at the destination, bytes of memory per second (pages
	// its parent image holds are referenced, the few others written).
	ImageFillBps float64 `json:"image_fill_bps"`

	// ImageCopyBps is how fast a runtime that copies the images before
	// its restore (Inputs.CopiesImages: Docker) gets through them, both
	// copies together (0: DefaultImageCopyBps).
	ImageCopyBps float64 `json:"image_copy_bps,omitempty"`

	LinkEfficiency float64 `json:"link_efficiency"` // payload throughput / link capacity
	// SetupS is what every migration spends before its technique starts
	// (connecting, the offer, the live root filesystem sync) and on the
	// commit: part of the total, never of the downtime.
	SetupS float64 `json:"setup_s"`
	// SetupRootfsBytes is the root filesystem the calibration's setup
	// sent (memhog's); Inputs.RootfsBytes beyond it adds to a total.
	SetupRootfsBytes float64 `json:"setup_rootfs_bytes,omitempty"`
	DedupRefBytes    float64 `json:"dedup_ref_bytes"` // link bytes for a page the destination already holds

	// Far links (Inputs.RTTSeconds). A session keeps at most WindowBytes
	// in flight, so a link carries at most WindowBytes/RTT; a migration
	// spends SetupRoundTrips round trips before its technique and on its
	// commit, SwitchoverRoundTrips (ColdRoundTrips for cold, whose
	// stream ramps up while it is down) while the container is down, and
	// post-copy PullRoundTrips more on its pull's last requests. 0: the
	// defaults (DefaultWindowBytes and the like).
	WindowBytes          float64 `json:"window_bytes,omitempty"`
	SetupRoundTrips      float64 `json:"setup_round_trips,omitempty"`
	SwitchoverRoundTrips float64 `json:"switchover_round_trips,omitempty"`
	ColdRoundTrips       float64 `json:"cold_round_trips,omitempty"`
	PullRoundTrips       float64 `json:"pull_round_trips,omitempty"`
	// SoftDirty: the kernel tracks dirty pages, so CRIU's native pre-copy
	// (PAM) is possible; Best only considers it then.
	SoftDirty bool `json:"soft_dirty"`
	// LazyDump: CRIU's lazy dump works here, so content-based pre-copy
	// switches over by rebuilding (memory-less dump, frozen last round,
	// images completed at the destination) instead of a full dump.
	LazyDump bool `json:"lazy_dump"`
	// WriteTracking: the kernel says which pages were written (userfaultfd
	// write protection), so content pre-copy's rounds after the first and
	// the frozen last round read only those, after a walk of the page
	// tables that covers TrackScanBps bytes of memory a second (0:
	// DefaultTrackScanBps).
	WriteTracking bool      `json:"write_tracking,omitempty"`
	TrackScanBps  float64   `json:"track_scan_bps,omitempty"`
	PAM           PAMParams `json:"pam"`
	// Intervals are the modes' prediction intervals (interval.go), from
	// the agent's past migrations; a mode without one, or with too few
	// migrations behind it, gets the default.
	Intervals []Interval `json:"intervals,omitempty"`
}

// The far-link terms measured in the lab with its delay lines (64 MiB
// memhog at 200 pages/s, 1 Gbit/s, round trips of 0, 50 and 100 ms, every
// mode; docs/MODEL.md, "Far links"), after the hosts' TCP buffers grew to
// 16-32 MiB (the window no longer binds at 1 Gbit/s up to about 130 ms)
// and the switchover stopped waiting for the frozen state's
// acknowledgements: connecting, the offer and the root filesystem took 14
// round trips more; the live modes' downtime 2 (the restore's reply, the
// commit), cold's 6 (its stream's ramp and the same two); post-copy's
// total 7 more (the pull's last requests).
const (
	DefaultWindowBytes          = 16e6
	DefaultSetupRoundTrips      = 14
	DefaultSwitchoverRoundTrips = 2
	DefaultColdRoundTrips       = 6
	DefaultPullRoundTrips       = 7
)

// DefaultFirstFaultsS: post-copy's client waited 22-39 ms longer than
// its downtime in the validation of 2026-11-28 (96-384 MiB, memhog's
// probe), hybrid's 0-9 ms.
const DefaultFirstFaultsS = 0.03

func (p Profile) firstFaults() float64 { return cmpOr(p.FirstFaultsS, DefaultFirstFaultsS) }

func (p Profile) window() float64 { return cmpOr(p.WindowBytes, DefaultWindowBytes) }

func (p Profile) pullRoundTrips() float64 { return cmpOr(p.PullRoundTrips, DefaultPullRoundTrips) }

func (p Profile) setupRoundTrips() float64 { return cmpOr(p.SetupRoundTrips, DefaultSetupRoundTrips) }

func (p Profile) switchoverRoundTrips(mode string) float64 {
	if mode == ModeCold {
		return cmpOr(p.ColdRoundTrips, DefaultColdRoundTrips)
	}
	return cmpOr(p.SwitchoverRoundTrips, DefaultSwitchoverRoundTrips)
}

// cmpOr is v, or def where v is not positive.
func cmpOr(v, def float64) float64 {
	if v > 0 {
		return v
	}
	return def
}

// DefaultImageCopyBps is Docker 20.10's images copy on the development
// machine: its restore took 4.1-4.7 s longer than runc's at 256 MiB
// (docs/BENCHMARKS.md, "containerd and Docker").
const DefaultImageCopyBps = 61e6

func (p Profile) imageCopyBps() float64 {
	if p.ImageCopyBps > 0 {
		return p.ImageCopyBps
	}
	return DefaultImageCopyBps
}

// DefaultProfile returns rough values measured on the development machine
// (2 cores, Linux 6.18, CRIU 4.2.1, runc 1.1.5, no soft-dirty). They give
// sensible predictions until a calibration replaces them.
func DefaultProfile() Profile {
	// Rounded from `ferry-lab calibrate` on the development VM (2 cores, CRIU
	// 4.2.1 with ferry's patches and its probes cached, runc 1.1.5),
	// docs/MODEL.md §8, eighth run.
	return Profile{
		Source:          "defaults: development VM, CRIU 4.2.1 + runc 1.1.5 (calibrated 2026-11-22)",
		PageSize:        4096,
		FreezeS:         0.006,
		DumpFixedS:      0.022,
		DumpBps:         0.245e9,
		ReadHashBps:     2.17e9,
		FrozenReadBps:   2.8e9,
		RestoreFixedS:   0.035,
		RestoreBps:      2.05e9,
		LazySetupS:      0.004,
		LazyBps:         0.174e9,
		LazyRequestS:    0,      // small requests cost through their faults here (fault_s)
		LazySerialShare: 0.27,   // over 300 Mbit/s the pull took 4.2 s quiet and faulting alike
		FaultS:          0.0006, // each fault's one-page request
		FaultWaitS:      0.00094,
		RedirtyRatio:    0.59,
		LocalFillBps:    0.63e9,
		ImageFillBps:    26e9, // the parent image leaves ~10 ms per 256 MiB
		LazyDump:        true,
		LinkEfficiency:  0.94,
		SetupS:          0.155,
		DedupRefBytes:   29,
		PAM:             DefaultPAM(),
	}
}

// ParseProfile reads a JSON profile; fields it does not name keep their
// defaults, so a partial calibration still yields a usable profile.
func ParseProfile(data []byte) (Profile, error) {
	p := DefaultProfile()
	if err := json.Unmarshal(data, &p); err != nil {
		return Profile{}, fmt.Errorf("profile: %w", err)
	}
	return p, p.Validate()
}

// Validate rejects values that make the models meaningless.
func (p Profile) Validate() error {
	type field struct {
		name string
		v    float64
	}
	for _, f := range []field{{"page_size_bytes", p.PageSize}, {"dump_bps", p.DumpBps},
		{"read_hash_bps", p.ReadHashBps}, {"restore_bps", p.RestoreBps}, {"lazy_bps", p.LazyBps}, {"image_fill_bps", p.ImageFillBps},
		{"link_efficiency", p.LinkEfficiency}} {
		if !(f.v > 0) {
			return fmt.Errorf("profile: %s must be positive, got %v", f.name, f.v)
		}
	}
	for _, f := range []field{{"freeze_s", p.FreezeS}, {"dump_fixed_s", p.DumpFixedS},
		{"restore_fixed_s", p.RestoreFixedS}, {"lazy_setup_s", p.LazySetupS}, {"lazy_request_s", p.LazyRequestS}, {"fault_s", p.FaultS}, {"fault_wait_s", p.FaultWaitS}, {"lazy_serial_share", p.LazySerialShare},
		{"dedup_ref_bytes", p.DedupRefBytes}, {"image_copy_bps", p.ImageCopyBps}} {
		if !(f.v >= 0) {
			return fmt.Errorf("profile: %s must not be negative, got %v", f.name, f.v)
		}
	}
	if p.LazySerialShare < 0 || p.LazySerialShare > 1 {
		return fmt.Errorf("profile: lazy_serial_share %v is not between 0 and 1", p.LazySerialShare)
	}
	if p.LinkEfficiency > 1 {
		return fmt.Errorf("profile: link_efficiency %v is above 1", p.LinkEfficiency)
	}
	if !(p.PAM.Sigma > 0) {
		return fmt.Errorf("profile: pam.sigma must be positive")
	}
	for _, iv := range p.Intervals {
		if err := validateInterval(iv); err != nil {
			return err
		}
	}
	return nil
}

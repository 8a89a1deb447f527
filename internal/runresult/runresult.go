// Package runresult is what one `ferry-lab bench migrate` measured: its
// runs, their medians and the baselines beside them. It holds no lab (and
// lives outside internal/bench), so that fitting a profile from runs
// (internal/fit) and an agent learning from its reports link none of the
// benchmark's machinery.
package runresult

import (
	"slices"

	"github.com/ferry-migrate/ferry/api"
)

// Run is one measured migration.
type Run struct {
	OK               bool    `json:"ok"`
	DowntimeMs       float64 `json:"downtime_ms"`
	ClientDowntimeMs float64 `json:"client_downtime_ms"`
	// ClientGapFromMs and ClientGapToMs place the client's longest gap on
	// the phases' clock (ms from the migration's start): the last answer
	// before it and the first after, against the freeze and the downtime's
	// end.
	ClientGapFromMs float64 `json:"client_gap_from_ms,omitempty"`
	ClientGapToMs   float64 `json:"client_gap_to_ms,omitempty"`
	TotalMs         float64 `json:"total_ms"`
	// TotalVsLink is TotalMs over the result's LinkFloorMs.
	TotalVsLink float64 `json:"total_vs_link,omitempty"`
	FrozenMs    float64 `json:"frozen_ms"`
	BytesSent   int64   `json:"bytes_sent"`
	MemoryBytes int64   `json:"memory_bytes"`
	StateOK     bool    `json:"state_ok"`
	Error       string  `json:"error,omitempty"`
	ProbeReason string  `json:"probe_reason,omitempty"`
	// PathCutAtBytes is how many bytes had been sent when a path went down;
	// OutageAtBytes when every path did.
	PathCutAtBytes int64 `json:"path_cut_at_bytes,omitempty"`
	OutageAtBytes  int64 `json:"outage_at_bytes,omitempty"`
	// SourceState is what became of the source copy (removed, resumed).
	SourceState     string  `json:"source_state,omitempty"`
	Transport       string  `json:"transport,omitempty"`
	RestoreMs       float64 `json:"restore_ms"`
	PagesFaulted    uint64  `json:"pages_faulted,omitempty"`
	PagesPushed     uint64  `json:"pages_pushed,omitempty"`
	PushMs          float64 `json:"push_ms,omitempty"`
	PagesReferenced uint64  `json:"pages_referenced,omitempty"`
	PagesFetched    uint64  `json:"pages_fetched,omitempty"`
	FillMs          float64 `json:"fill_ms,omitempty"`
	// Hybrid's and post-copy's pages the restore wrote itself (engine.Report's).
	PagesLastWritten uint64  `json:"pages_last_written,omitempty"`
	LastWritesMs     float64 `json:"last_writes_ms,omitempty"`
	// RestoreFromOwnImages: pre-copy's destination restored lazily from
	// its images (engine.Report's).
	RestoreFromOwnImages bool            `json:"restore_from_own_images,omitempty"`
	Rounds               []api.Round     `json:"rounds"`
	StopReason           string          `json:"stop_reason,omitempty"`
	ThrottlePct          int             `json:"throttle_pct,omitempty"`
	Phases               []api.PhaseSpan `json:"phases,omitempty"`
	// With TCPClient: the longest wait of the client on one established
	// connection, and the packets the destination held for it between the
	// freeze and the commit.
	TCPStallMs  float64 `json:"tcp_stall_ms,omitempty"`
	HeldPackets int     `json:"held_packets,omitempty"`
	// With a volume: whether its contents checked out after the move
	// (memhog read back every record it wrote), and its live delta and
	// frozen pass.
	VolumeOK          *bool `json:"volume_ok,omitempty"`
	VolumeBytes       int64 `json:"volume_bytes,omitempty"`
	FrozenVolumeBytes int64 `json:"frozen_volume_bytes,omitempty"`
	// The root filesystem's live delta and frozen pass (engine.Report).
	RootfsBytes       int64 `json:"rootfs_bytes"`
	RootfsEntries     int   `json:"rootfs_entries"`
	FrozenRootfsBytes int64 `json:"frozen_rootfs_bytes"`
}

// LinkBaseline is plain TCP over the same link.
type LinkBaseline struct {
	ThroughputBps float64 `json:"throughput_bps"`
}

// PodmanBaseline is the same workload moved with podman checkpoint/restore.
type PodmanBaseline struct {
	DowntimeMs       float64 `json:"downtime_ms"`
	ClientDowntimeMs float64 `json:"client_downtime_ms"`
	StateOK          bool    `json:"state_ok"`
	CheckpointMs     float64 `json:"checkpoint_ms"`
	CopyMs           float64 `json:"copy_ms"`
	RestoreMs        float64 `json:"restore_ms"`
	ArchiveBytes     int64   `json:"archive_bytes"`
	Error            string  `json:"error,omitempty"`
}

// PathsBaseline compares one TCP connection over one path with one MPTCP
// connection over all the lab's paths, and with TCP connections striped
// over them.
type PathsBaseline struct {
	SinglePathBps float64 `json:"single_path_bps"`
	MultipathBps  float64 `json:"multipath_bps"`
	Ratio         float64 `json:"ratio"`
	// Striped: one TCP connection per path, striped (no MPTCP).
	StripedBps   float64 `json:"striped_bps"`
	StripedRatio float64 `json:"striped_ratio"`
}

// Baselines holds whichever baselines were asked for.
type Baselines struct {
	Link   *LinkBaseline   `json:"link,omitempty"`
	Podman *PodmanBaseline `json:"podman,omitempty"`
	Paths  *PathsBaseline  `json:"paths,omitempty"`
	// Recreate: --runtime kubernetes, Kubernetes' delete-and-recreate.
	Recreate *RecreateBaseline `json:"recreate,omitempty"`
}

// MigrateResult is what `ferry-lab bench migrate --json` prints.
type MigrateResult struct {
	Runtime      string `json:"runtime,omitempty"`
	Mode         string `json:"mode"`
	MemoryBytes  int64  `json:"memory_bytes"`
	DirtyRate    int    `json:"dirty_rate"`
	BandwidthBps int64  `json:"bandwidth_bps"`
	// RTTMs is the round trip set between the source and the destination.
	RTTMs float64 `json:"rtt_ms,omitempty"`
	// Network and VolumeBytes are the options' (the link floor counts the
	// volume's bytes with the memory's).
	Network                string    `json:"network,omitempty"`
	VolumeBytes            int64     `json:"volume_bytes,omitempty"`
	Runs                   []Run     `json:"runs"`
	MedianDowntimeMs       float64   `json:"median_downtime_ms"`
	MedianClientDowntimeMs float64   `json:"median_client_downtime_ms"`
	MedianTotalMs          float64   `json:"median_total_ms"`
	MedianTCPStallMs       float64   `json:"median_tcp_stall_ms,omitempty"`
	Paths                  int       `json:"paths"`
	Baselines              Baselines `json:"baselines"`
	// With the link baseline: LinkFloorMs is the memory asked for at the
	// link's measured throughput, the least any technique can take, and
	// MedianTotalVsLink the median of the runs' totals over it.
	LinkFloorMs       float64 `json:"link_floor_ms,omitempty"`
	MedianTotalVsLink float64 `json:"median_total_vs_link,omitempty"`
	// Against is the same bench at AgainstMemoryBytes, its runs
	// alternating with these; ClientDowntimeRatio is its median client
	// downtime over this one's (1.0: the downtime does not grow with
	// memory).
	Against             *MigrateResult `json:"against,omitempty"`
	ClientDowntimeRatio float64        `json:"client_downtime_ratio,omitempty"`
	// --runtime kubernetes: Against is plain containerd's runs, and these
	// the median client downtime over containerd's and over Kubernetes'
	// delete-and-recreate (Baselines.Recreate).
	ClientDowntimeVsContainerd float64 `json:"client_downtime_vs_containerd,omitempty"`
	ClientDowntimeVsRecreate   float64 `json:"client_downtime_vs_recreate,omitempty"`
}

// RecreateBaseline is what Kubernetes' own way costs: the pod deleted
// (its node cordoned) and its Deployment making a new one elsewhere, its
// memory lost.
type RecreateBaseline struct {
	// ClientDowntimeMs: from the deletion until the new pod answers.
	ClientDowntimeMs float64 `json:"client_downtime_ms"`
	// StateOK is false: the new pod starts afresh (the probe says so).
	StateOK bool   `json:"state_ok"`
	Error   string `json:"error,omitempty"`
}

// RunOf is what a run records of a migration's report.
func RunOf(rep api.Report) Run {
	r := Run{OK: rep.OK, DowntimeMs: rep.DowntimeMs, TotalMs: rep.TotalMs, FrozenMs: rep.FrozenMs,
		BytesSent: rep.BytesSent, MemoryBytes: rep.MemoryBytes, Error: rep.Error, Phases: rep.Phases,
		SourceState: rep.SourceState, Transport: rep.Transport,
		RestoreMs: rep.RestoreMs, PagesFaulted: rep.PagesFaulted, PagesPushed: rep.PagesPushed, PushMs: rep.PushMs,
		PagesReferenced: rep.PagesReferenced, PagesFetched: rep.PagesFetched, FillMs: rep.FillMs,
		PagesLastWritten: rep.PagesLastWritten, LastWritesMs: rep.LastWritesMs, RestoreFromOwnImages: rep.RestoreFromOwnImages, Rounds: rep.Rounds, StopReason: rep.StopReason, ThrottlePct: rep.ThrottlePct,
		RootfsBytes: rep.RootfsBytes, RootfsEntries: rep.RootfsEntries, FrozenRootfsBytes: rep.FrozenRootfsBytes}
	for _, v := range rep.Volumes {
		r.VolumeBytes += v.Bytes
		r.FrozenVolumeBytes += v.FrozenBytes
	}
	if r.Rounds == nil {
		r.Rounds = []api.Round{}
	}
	return r
}

// Summarize takes the runs' medians, their totals over the link, and
// those of the size run against them, over the same link.
func (res *MigrateResult) Summarize() {
	res.MedianDowntimeMs = median(res.Runs, func(r Run) float64 { return r.DowntimeMs })
	res.MedianClientDowntimeMs = median(res.Runs, func(r Run) float64 { return r.ClientDowntimeMs })
	res.MedianTotalMs = median(res.Runs, func(r Run) float64 { return r.TotalMs })
	res.MedianTCPStallMs = median(res.Runs, func(r Run) float64 { return r.TCPStallMs })
	res.againstLink()
	if a := res.Against; a != nil {
		a.Baselines.Link, a.Baselines.Paths = res.Baselines.Link, res.Baselines.Paths
		a.Summarize()
		if res.MedianClientDowntimeMs > 0 {
			res.ClientDowntimeRatio = a.MedianClientDowntimeMs / res.MedianClientDowntimeMs
		}
	}
}

// againstLink puts each run's total over the link floor, where the link
// was measured.
func (res *MigrateResult) againstLink() {
	if res.Baselines.Link == nil {
		return
	}
	res.LinkFloorMs = LinkFloorMs(res.MemoryBytes+res.VolumeBytes, res.Baselines.Link.ThroughputBps)
	if res.LinkFloorMs <= 0 {
		return
	}
	for i := range res.Runs {
		res.Runs[i].TotalVsLink = res.Runs[i].TotalMs / res.LinkFloorMs
	}
	res.MedianTotalVsLink = median(res.Runs, func(r Run) float64 { return r.TotalVsLink })
}

// LinkFloorMs is how long bytes take at bps, in milliseconds (0 for no
// throughput).
func LinkFloorMs(bytes int64, bps float64) float64 {
	if bps <= 0 {
		return 0
	}
	return float64(bytes) * 8 / bps * 1000
}

// median of the successful runs' values; 0 when none succeeded.
func median(runs []Run, f func(Run) float64) float64 {
	var xs []float64
	for _, r := range runs {
		if r.OK {
			xs = append(xs, f(r))
		}
	}
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

package api

import "time"

// ReportSchemaVersion numbers the Report's JSON form (docs/report.schema.json):
// raised whenever a field changes meaning or goes; a new field does not.
const ReportSchemaVersion = 1

// Report is the outcome of one migration.
type Report struct {
	// SchemaVersion is the ReportSchemaVersion the report was written
	// under.
	SchemaVersion int `json:"schema_version"`
	// ID is the migration's, as ferry ps, cancel and wait name it.
	ID        string    `json:"id"`
	StartedAt time.Time `json:"started_at"`
	// FerryVersion is the source agent's.
	FerryVersion string `json:"ferry_version,omitempty"`
	Container    string `json:"container"`
	// Runtime is the runtime the container was found in.
	Runtime     string  `json:"runtime,omitempty"`
	Mode        string  `json:"mode"`
	From        string  `json:"from"`
	To          string  `json:"to"`
	OK          bool    `json:"ok"`
	DowntimeMs  float64 `json:"downtime_ms"`
	TotalMs     float64 `json:"total_ms"`
	FrozenMs    float64 `json:"frozen_ms"`
	BytesSent   int64   `json:"bytes_sent"`
	MemoryBytes int64   `json:"memory_bytes"`
	// Transport is what the session to the destination ran over: mptcp,
	// tcp, or striped tcp xN.
	Transport string `json:"transport,omitempty"`
	// RestoreMs is the destination's runc restore, until the container ran.
	RestoreMs float64 `json:"restore_ms"`
	// Post-copy: pages the destination pulled on a fault and in the
	// background.
	PagesFaulted uint64 `json:"pages_faulted,omitempty"`
	PagesPushed  uint64 `json:"pages_pushed,omitempty"`
	// PushMs is how long post-copy's push took to send all of the memory
	// (0: it did not finish before the last page was in).
	PushMs   float64  `json:"push_ms,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// HeldPackets: see Committed.
	HeldPackets int `json:"held_packets,omitempty"`
	// Pre-copy: each round, why the rounds stopped, the CPU throttle
	// auto-converge reached, and how many pages of the final dump the
	// destination already held.
	Rounds          []Round `json:"rounds,omitempty"`
	StopReason      string  `json:"stop_reason,omitempty"`
	ThrottlePct     int     `json:"throttle_pct,omitempty"`
	PagesReferenced uint64  `json:"pages_referenced,omitempty"`
	// WriteTracking says how content pre-copy's rounds found the changed
	// pages: the kernel's write tracking, or hashing all memory, and why.
	WriteTracking string `json:"write_tracking,omitempty"`
	// The rebuild switchover: pages the destination had to ask the source
	// for (its rounds never saw them), and how long completing the images
	// took while the container was down.
	PagesFetched uint64  `json:"pages_fetched,omitempty"`
	FillMs       float64 `json:"fill_ms,omitempty"`
	// Hybrid and post-copy: the pages the container wrote last, which the
	// destination's restore wrote into the copy itself instead of leaving
	// them to faults, and how long adding them to the images took while it
	// was down.
	PagesLastWritten uint64  `json:"pages_last_written,omitempty"`
	LastWritesMs     float64 `json:"last_writes_ms,omitempty"`
	// RestoreFromOwnImages: the destination restored without copying the
	// memory in; a lazy-pages daemon there copies it from the completed
	// images after the commit, the source no longer needed.
	RestoreFromOwnImages bool `json:"restore_from_own_images,omitempty"`
	// FrozenRootfsScan says how the frozen root filesystem sync found
	// what changed since the live one: "N changed paths" (watched), or
	// "full walk: WHY".
	FrozenRootfsScan string `json:"frozen_rootfs_scan,omitempty"`
	// RootfsBytes and RootfsEntries are the live root filesystem sync's
	// delta (its tar stream, and the entries changed or added in it);
	// FrozenRootfsBytes the frozen pass's, sent inside the downtime.
	RootfsBytes       int64 `json:"rootfs_bytes"`
	RootfsEntries     int   `json:"rootfs_entries"`
	FrozenRootfsBytes int64 `json:"frozen_rootfs_bytes"`
	// Volumes are the volumes that moved, each synced as the root
	// filesystem is.
	Volumes []VolumeSync `json:"volumes,omitempty"`
	// Shared are the host directories the container bind-mounts that the
	// destination has as the same storage: remounted there, not copied.
	Shared []SharedDir `json:"shared,omitempty"`
	// Networks are the runtime's networks the container was attached to,
	// and what became of its address and connections on each (said
	// before the freeze too, in the events, and by ferry plan).
	Networks []NetworkMove `json:"networks,omitempty"`
	// Auto is what mode auto measured and chose.
	Auto *AutoChoice `json:"auto,omitempty"`
	// Model is the prediction the migration was planned with and what it
	// measured against it, term by term (nil: it failed before the freeze).
	Model *ModelCheck `json:"model,omitempty"`
	// MemoryEstimate is the memory the first round found, for predictions.
	MemoryEstimate int64       `json:"-"`
	Phases         []PhaseSpan `json:"phases"`
	Error          string      `json:"error,omitempty"`
	// SourceState says what became of the source copy: "removed" after a
	// commit, "resumed" after a failure, "frozen" when the outcome is in
	// doubt, "lost" when its processes died before it could resume (and no
	// copy runs anywhere).
	SourceState string `json:"source_state,omitempty"`
	// InDoubtID names a migration whose outcome the source could not know
	// (its copy stays frozen); the agent resolves it with the destination.
	InDoubtID string `json:"in_doubt_id,omitempty"`
	// Settled says how a migration left in doubt ended once the agent
	// settled it with the destination (SourceState is then the final one).
	Settled string `json:"settled,omitempty"`
	// FailedAt names the phase and host where a failed migration stopped.
	FailedAt string `json:"failed_at,omitempty"`
	// Logs is where the source kept a failed migration's CRIU and runtime
	// logs (a destination that failed keeps its own under its state
	// directory's logs/ID).
	Logs string `json:"logs,omitempty"`
}

// PhaseSpan is one phase of a migration, in ms since it started.
type PhaseSpan struct {
	Name    string  `json:"name"`
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
}

// Round describes one pre-copy round.
type Round struct {
	Index      int     `json:"index"`
	Bytes      int64   `json:"bytes"`       // on the wire
	RawBytes   int64   `json:"raw_bytes"`   // the round stream before compression
	Pages      uint64  `json:"pages"`       // pages sent (whole or as a delta)
	DeltaPages uint64  `json:"delta_pages"` // of which as XOR deltas
	DurationMs float64 `json:"duration_ms"`
	FrozenMs   float64 `json:"frozen_ms"`  // content-based rounds never freeze
	DirtyRate  float64 `json:"dirty_rate"` // pages per second changed since the round before
	// ThrottlePct is the CPU throttle auto-converge applied during the round.
	ThrottlePct int `json:"throttle_pct,omitempty"`
	// Final marks hybrid's last round, read while the container is frozen.
	Final bool `json:"final,omitempty"`
	// UnchangedPages were not read: the kernel's write tracking said they
	// were not written since the round before.
	UnchangedPages uint64 `json:"unchanged_pages,omitempty"`
}

// VolumeSync is what moving one volume sent.
type VolumeSync struct {
	Name string `json:"name"`
	Path string `json:"path"` // where the container sees it
	// Bytes and Entries are the live sync's delta, FrozenBytes the
	// frozen pass's; FrozenScan says how it found what changed (see
	// Report.FrozenRootfsScan).
	Bytes       int64  `json:"bytes"`
	Entries     int    `json:"entries"`
	FrozenBytes int64  `json:"frozen_bytes"`
	FrozenScan  string `json:"frozen_scan,omitempty"`
}

// SharedDir is a host directory a container bind-mounts. It is the
// host's, not the container's: never copied, it follows only where the
// destination has the same storage at that path (a network filesystem).
type SharedDir struct {
	// Source is its path on the host; Path where the container sees it.
	Source string `json:"source"`
	Path   string `json:"path"`
	// Identity names the storage at the source (shareddir.Identity).
	Identity string `json:"identity,omitempty"`
}

// NetworkMove is what a migration does to the container's place on one
// of its runtime's networks.
type NetworkMove struct {
	Network
	// Outcome, in words: the address kept or given anew, the connections
	// kept or closed, the ports published again.
	Outcome string `json:"outcome"`
}

// Network is a network the runtime attached the container to.
type Network struct {
	// Name is the runtime's name for it (Docker's "bridge", a user's own),
	// which the destination must have too; Driver its kind.
	Name   string `json:"name"`
	Driver string `json:"driver"`
	// Address is the container's address on it at the source, in
	// Subnet.
	Address string `json:"address,omitempty"`
	Subnet  string `json:"subnet,omitempty"`
	// Ports are the ports published on the host for it, as
	// "HOSTPORT->PORT/PROTO".
	Ports []string `json:"ports,omitempty"`
	// HostLocal says the network ends at its host (a bridge behind the
	// host's NAT): the container's address there means nothing elsewhere,
	// so its established connections cannot follow it and are closed at
	// the destination, while listening sockets and published ports move.
	// Otherwise the network is a segment both hosts share (macvlan,
	// ipvlan): the container keeps its address and connections.
	HostLocal bool `json:"host_local"`
}

// AutoChoice records what mode auto measured and decided.
type AutoChoice struct {
	MemoryBytes   int64        `json:"memory_bytes"`
	SharedBytes   int64        `json:"shared_bytes,omitempty"` // dumped while frozen in every mode
	DirtyRate     float64      `json:"dirty_rate"`             // pages per second
	ThroughputBps float64      `json:"throughput_bps"`         // bits per second
	Predictions   []Prediction `json:"predictions"`
	Chosen        string       `json:"chosen"`
	Rounds        int          `json:"rounds,omitempty"`
	Reason        string       `json:"reason"`
}

// Prediction is one technique's predicted cost.
type Prediction struct {
	Mode       string  `json:"mode"`
	Rounds     int     `json:"rounds"` // live rounds before the switchover (0 for cold and post-copy)
	DowntimeMs float64 `json:"downtime_ms"`
	TotalMs    float64 `json:"total_ms"`
	Bytes      float64 `json:"bytes"` // sent over the link
	// FrozenMs: freezes before the switchover (native pre-copy only).
	FrozenMs float64 `json:"frozen_ms,omitempty"`
	// DegradedMs: after the service resumes, until every page is in place
	// (post-copy and hybrid; faults may wait meanwhile).
	DegradedMs float64 `json:"degraded_ms,omitempty"`
	// The interval a measurement is expected in (about 80 % of them):
	// the prediction scaled by the 10th and 90th percentiles of measured
	// over predicted on this host's past migrations of the mode, or by a
	// default width until there are enough (docs/MODEL.md, "Intervals").
	DowntimeLowMs  float64 `json:"downtime_low_ms,omitempty"`
	DowntimeHighMs float64 `json:"downtime_high_ms,omitempty"`
	TotalLowMs     float64 `json:"total_low_ms,omitempty"`
	TotalHighMs    float64 `json:"total_high_ms,omitempty"`
	Note           string  `json:"note,omitempty"`
}

// ModelCheck is a migration's prediction beside its measurement: what the
// agent learns from (docs/MODEL.md, "Learning from every migration").
type ModelCheck struct {
	// Inputs are what was known before the freeze.
	Inputs PlanInputs `json:"inputs"`
	// Profile names the profile the prediction came from (its source).
	Profile string `json:"profile"`
	// Prediction is the mode's, at the rounds it ran (the plan's for mode
	// auto), with its interval.
	Prediction Prediction `json:"prediction"`
	// Terms are the profile's terms this migration measured, each
	// predicted and measured over the same phases.
	Terms []TermCheck `json:"terms,omitempty"`
	// Outside names what fell outside the prediction's interval:
	// "downtime", "total" (empty: both inside, or the migration failed).
	Outside []string `json:"outside,omitempty"`
}

// PlanInputs are a prediction's inputs (model.Inputs' measured part).
type PlanInputs struct {
	MemoryBytes float64 `json:"memory_bytes"`
	// DirtyRate is pages written per second: mode auto's measurement, or
	// the last live round's (0 where no round ran before the freeze).
	DirtyRate   float64 `json:"dirty_rate"`
	SharedBytes float64 `json:"shared_bytes,omitempty"`
	// BandwidthBps is the link's payload rate in bytes per second: mode
	// auto's probe or the request's cap; 0 when unknown, predicted as a
	// link that does not limit.
	BandwidthBps float64 `json:"bandwidth_bps,omitempty"`
	// Rounds are the live rounds the migration ran (pre-copy, hybrid).
	Rounds int `json:"rounds,omitempty"`
	// Tracked: rounds read only the pages the kernel saw written, so they
	// say nothing of read_hash_bps.
	Tracked bool `json:"tracked,omitempty"`
	// NoLazyRestore and CopiesImages are the runtime's (model.Inputs).
	NoLazyRestore bool `json:"no_lazy_restore,omitempty"`
	CopiesImages  bool `json:"copies_images,omitempty"`
}

// TermCheck is one profile term on one migration: what the profile
// predicted for the phases the term governs and what they took.
type TermCheck struct {
	// Name is the term's, as ferry calibrate names it (freeze, dump,
	// restore, read-hash, ...).
	Name        string  `json:"name"`
	PredictedMs float64 `json:"predicted_ms"`
	MeasuredMs  float64 `json:"measured_ms"`
}

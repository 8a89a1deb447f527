// Package engine is ferry's migration state machine: the source side of each
// technique (one file per technique) and the destination side that receives,
// restores and commits. It talks to the peer only through transport channels
// and reaches the kernel only through packages named for what they touch:
// internal/runtime and internal/criu (containers and their checkpoints),
// internal/cgroups (auto-converge's CPU limit), internal/cnet and
// internal/privnet (network namespaces), internal/procs (the container's
// resident memory), internal/mounts (a killed CRIU's leftovers) and
// internal/memwarm (pre-warming the destination's memory).
package engine

import (
	"encoding/json"
	"time"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/rootfs"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Channel kinds on a session between a source and a destination agent.
const (
	ChanIncoming    = "incoming"     // control: offer, restore, commit
	ChanRootfsLive  = "rootfs.live"  // root filesystem sync while running: manifest up, delta down
	ChanRootfsFinal = "rootfs.final" // the same, while frozen: only what changed since
	ChanPages       = "pages"        // CRIU page-server protocol, tunneled
	ChanImages      = "images"       // the rest of the CRIU images, as a tar
)

// ChanQuery is how a source asks a destination what became of a migration
// (journal.Entry's state), to resolve one in doubt.
const ChanQuery = "query"

// Query asks about one migration; QueryAnswer is the destination's
// journal state for it ("unknown": it never restored anything of it).
type Query struct {
	ID string `json:"id"`
}
type QueryAnswer struct {
	State string `json:"state"`
}

// Channel kinds on a session between the CLI and an agent.
const (
	ChanMigrate = "migrate" // CLI asks the agent to migrate one of its containers
	ChanStatus  = "status"  // CLI asks what the agent runs
	ChanJobs    = "jobs"    // CLI lists migrations (JobsQuery -> []Job)
	ChanCancel  = "cancel"  // CLI cancels one (JobRef -> CancelReply)
	ChanWait    = "wait"    // CLI follows one to its end (JobRef -> Events)
	ChanResolve = "resolve" // CLI settles one left in doubt (JobRef -> Resolution)
)

// Resolution is what ferry resolve found and did: the source's state of
// the migration (the journal's: frozen, in-doubt, removed, resumed, lost,
// diverged), whether that is final, and why.
type Resolution struct {
	ID        string `json:"id"`
	Container string `json:"container"`
	State     string `json:"state"`
	Settled   bool   `json:"settled"`
	Note      string `json:"note,omitempty"`
}

// Job is a migration as the source agent knows it: from when it was
// accepted, with its last progress, and its report once it ended.
type Job struct {
	ID        string    `json:"id"`
	Container string    `json:"container"`
	To        string    `json:"to"`
	Mode      string    `json:"mode"`
	Started   time.Time `json:"started"`
	Progress  Progress  `json:"progress"`
	// Ended is zero while it runs; Report is set once it ended.
	Ended  time.Time `json:"ended,omitzero"`
	Report *Report   `json:"report,omitempty"`
}

// JobsQuery asks for the running migrations, and with All the ended ones
// the agent kept too.
type JobsQuery struct {
	All bool `json:"all"`
}

// JobRef names one migration.
type JobRef struct {
	ID string `json:"id"`
}

// CancelReply says whether a cancel was taken: a migration past its
// commit cannot be, and Reason says why.
type CancelReply struct {
	Cancelled bool   `json:"cancelled"`
	Reason    string `json:"reason,omitempty"`
}

// RuntimeAuto finds a container by name in every runtime present.
const RuntimeAuto = "auto"

// Modes: the model's names, one definition.
const (
	ModeCold     = model.ModeCold
	ModePrecopy  = model.ModePrecopy
	ModePostcopy = model.ModePostcopy
	ModeHybrid   = model.ModeHybrid
)

// Offer opens a migration at the destination.
type Offer struct {
	ID         string `json:"id"`
	Container  string `json:"container"`
	Mode       string `json:"mode"`
	SourceHost string `json:"source_host"`
	// Runtime is the kind of runtime the container runs under; the
	// destination restores it into its own runtime of that kind.
	Runtime string          `json:"runtime"`
	Spec    json.RawMessage `json:"spec,omitempty"` // the container's OCI config.json
	// Image is the image the container's writable layer sits on, which
	// the destination must hold; Meta the runtime's own records.
	Image string            `json:"image,omitempty"`
	Meta  map[string][]byte `json:"meta,omitempty"`
	// MemoryBytes is the container's resident memory when offered, so the
	// destination can prepare for it.
	MemoryBytes int64          `json:"memory_bytes"`
	Faults      []string       `json:"faults,omitempty"`
	Precopy     PrecopyOptions `json:"precopy,omitempty"`
	// Network describes the container's own network namespace, which the
	// destination rebuilds (nil: the container uses its host's).
	Network *cnet.Spec `json:"network,omitempty"`
	// Volumes move with the container (each synced on its own channels);
	// Networks are the runtime's own, which the destination's runtime
	// attaches it to again.
	Volumes  []runtime.Volume  `json:"volumes,omitempty"`
	Networks []runtime.Network `json:"networks,omitempty"`
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

// NetworkMove is what a migration does to the container's place on one
// of its runtime's networks.
type NetworkMove struct {
	runtime.Network
	// Outcome, in words: the address kept or given anew, the connections
	// kept or closed, the ports published again.
	Outcome string `json:"outcome"`
}

// Accept is the destination's yes to an Offer.
type Accept struct {
	Host        string `json:"host"`
	CRIUVersion string `json:"criu_version"`
	// PrecopyEngine is the pre-copy engine both ends agreed on.
	PrecopyEngine string `json:"precopy_engine,omitempty"`
}

// Step is a control message naming what the source asks for next.
type Step struct {
	// "mode", "address" (the source froze: the destination takes the
	// container's address, holding its packets, and answers AddressTaken),
	// "restore", "commit", "abort".
	Do string `json:"do"`
	// With "mode" (mode auto): the technique the source chose, and its
	// pre-copy options, before any of its channels open.
	Mode    string          `json:"mode,omitempty"`
	Precopy *PrecopyOptions `json:"precopy,omitempty"`
}

// AddressTaken answers the step "address": Taken says the destination
// announced the address and holds its packets until the commit; if not,
// it brings the address up after its restore.
type AddressTaken struct {
	Taken bool `json:"taken"`
}

// Restored is the destination's confirmation that the container runs.
type Restored struct {
	Pid int `json:"pid"`
	// WaitMs is how long the destination still waited for state after the
	// source asked for the restore; RestoreMs how long runc restore took
	// until the container ran.
	WaitMs    float64 `json:"wait_ms"`
	RestoreMs float64 `json:"restore_ms"`
	// Pre-copy's rebuild switchover: the time spent completing the lazy
	// dump's images, and where their pages came from.
	FillMs       float64 `json:"fill_ms,omitempty"`
	PagesLocal   uint64  `json:"pages_local,omitempty"`
	PagesFetched uint64  `json:"pages_fetched,omitempty"`
	MemoryBytes  int64   `json:"memory_bytes,omitempty"` // the completed images'
	// FromOwnImages: the restore left the memory to a lazy-pages daemon
	// reading the completed images there (localpull.go).
	FromOwnImages bool `json:"from_own_images,omitempty"`
	// Hybrid and post-copy: the pages the container wrote last that the
	// restore wrote itself (lastwrites.go), and how long adding them to the
	// images took.
	LastWrites   uint64  `json:"last_writes,omitempty"`
	LastWritesMs float64 `json:"last_writes_ms,omitempty"`
}

// Committed acknowledges a commit: the destination owns the container.
type Committed struct {
	// HeldPackets counts the packets the container's peers sent between
	// the freeze and the commit, held at the destination and delivered at
	// the commit.
	HeldPackets int `json:"held_packets,omitempty"`
	// HoldError says why the destination could not hold them (its address
	// moved at the restore instead).
	HoldError string `json:"hold_error,omitempty"`
}

// RootfsHave opens a rootfs sync: the destination's copy, described in
// full, or AsLive: exactly as the live sync left it, which the source
// knows (the frozen sync then scans only the source).
type RootfsHave struct {
	AsLive   bool            `json:"as_live,omitempty"`
	Manifest rootfs.Manifest `json:"manifest,omitempty"`
}

// RootfsDone is the destination's summary of an applied rootfs delta.
type RootfsDone struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Request is what the CLI asks of a source agent.
type Request struct {
	// ID names the migration: the caller's choice (12 lowercase hex
	// digits), or, left empty, the source agent's when it accepts the
	// request. A request repeated with the same ID (a controller
	// retrying) follows the migration that ID names, running or ended,
	// instead of starting a second one.
	ID        string `json:"id,omitempty"`
	Container string `json:"container"`
	To        string `json:"to"`
	Mode      string `json:"mode"`
	// Runtime names the container's runtime (runc, podman, lxc); auto
	// (or empty) finds it by name in the runtimes this host has.
	Runtime string `json:"runtime,omitempty"`
	// RuncRoot is the runc root a runc container lives under, when not
	// the agent's own.
	RuncRoot string `json:"runc_root,omitempty"`
	// KeepVolumes leaves the source's copy of the volumes that moved in
	// place after the commit (by default they are removed with it).
	KeepVolumes bool `json:"keep_volumes,omitempty"`
	// Faults to inject, for tests (see package fault: ACTION@PHASE);
	// honoured only by agents started with --allow-faults.
	Faults []string `json:"faults,omitempty"`
	// Precopy shapes pre-copy and hybrid rounds.
	Precopy PrecopyOptions `json:"precopy,omitempty"`
	// MaxBandwidthBps caps what the source sends, in bits per second.
	MaxBandwidthBps int64 `json:"max_bandwidth_bps,omitempty"`
	// Line puts the migration in a line of this host's migrations (a
	// drain's) whose memory crosses a few at a time (line.go).
	Line *LineSpec `json:"line,omitempty"`
}

// Progress is a live update from a running migration.
type Progress struct {
	Phase string `json:"phase"`
	// Bytes is what the session sent so far, at RateBps (bits/s) lately.
	Bytes   int64   `json:"bytes"`
	RateBps float64 `json:"rate_bps"`
	// MemoryBytes is the container's memory as pre-copy's first round
	// found it.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pre-copy: rounds done, the dirty rate (pages/s) the last one
	// measured, and the downtime a switchover after it would have.
	Rounds              int     `json:"rounds,omitempty"`
	DirtyRate           float64 `json:"dirty_rate,omitempty"`
	PredictedDowntimeMs float64 `json:"predicted_downtime_ms,omitempty"`
	// LazyPagesPending: post-copy and hybrid, the pages of the frozen
	// source the destination has not yet stored, as far as the push's
	// acknowledgments tell (the container's resident pages less those
	// acknowledged).
	LazyPagesPending int64 `json:"lazy_pages_pending,omitempty"`
	// Networks are the report's, known from the prepare on: what the
	// move does to the container's addresses and connections, told
	// before anything is frozen.
	Networks []NetworkMove `json:"networks,omitempty"`
}

// Event is one message on a migrate channel: the job's ID once it is
// accepted, progress, then a report.
type Event struct {
	Job      *JobRef   `json:"job,omitempty"`
	Progress *Progress `json:"progress,omitempty"`
	Report   *Report   `json:"report,omitempty"`
}

// PhaseSpan is one phase of a migration, in ms since it started.
type PhaseSpan struct {
	Name    string  `json:"name"`
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
}

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
	// Networks are the runtime's networks the container was attached to,
	// and what became of its address and connections on each (said
	// before the freeze too, in the events, and by ferry plan).
	Networks []NetworkMove `json:"networks,omitempty"`
	// Auto is what mode auto measured and chose.
	Auto *AutoChoice `json:"auto,omitempty"`
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

// Status lists an agent's containers.
type Status struct {
	Host       string            `json:"host"`
	Containers []ContainerStatus `json:"containers"`
}

// ContainerStatus is one container on a host.
type ContainerStatus struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
	// ResidentBytes is the memory its processes hold, as the host sees it.
	ResidentBytes int64 `json:"resident_bytes"`
}

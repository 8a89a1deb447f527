// Package engine is ferry's migration state machine: each technique's source
// and destination halves (one file per technique, named in techniques.go),
// and the drivers of each side: the source's, which offers, syncs and
// freezes, and the destination's, which receives, restores and commits. It talks to the peer only through transport channels
// and reaches the kernel only through packages named for what they touch:
// internal/runtime and internal/criu (containers and their checkpoints),
// internal/cgroups (auto-converge's CPU limit), internal/cnet and
// internal/privnet (network namespaces), internal/procs (the container's
// resident memory), internal/mounts (a killed CRIU's leftovers) and
// internal/memwarm (pre-warming the destination's memory).
package engine

import (
	"encoding/json"

	"github.com/ferry-migrate/ferry/api"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/rootfs"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
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

// Channel kinds on a session between a client and an agent (see api).
const (
	ChanMigrate = api.ChanMigrate
	ChanStatus  = api.ChanStatus
	ChanJobs    = api.ChanJobs
	ChanCancel  = api.ChanCancel
	ChanWait    = api.ChanWait
	ChanResolve = api.ChanResolve
)

// RuntimeAuto finds a container by name in every runtime present.
const RuntimeAuto = api.RuntimeAuto

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
	// Shared are host directories the container bind-mounts, which the
	// destination must have as the same storage (never copied).
	Shared []shareddir.Dir `json:"shared,omitempty"`
	// SourceCRIU is the source's CRIU, so that the destination can tell
	// whether it restores what that CRIU dumps (nil: not told).
	SourceCRIU *CRIUCaps `json:"source_criu,omitempty"`
}

// CRIUCaps is what an agent tells its peer of its CRIU: its release and
// the ferry patches it carries (criu.ParsePatches: none for a stock
// CRIU). A migration whose technique needs a patch one end lacks is
// refused before anything is frozen (criucheck.go).
type CRIUCaps struct {
	Path    string       `json:"path,omitempty"`
	Version string       `json:"version"`
	Patches criu.Patches `json:"patches"`
}

// Accept is the destination's yes to an Offer.
type Accept struct {
	Host        string `json:"host"`
	CRIUVersion string `json:"criu_version"`
	// PrecopyEngine is the pre-copy engine both ends agreed on.
	PrecopyEngine string `json:"precopy_engine,omitempty"`
	// CRIU is the destination's (nil from an agent that does not tell).
	CRIU *CRIUCaps `json:"criu,omitempty"`
}

// StepName is what a Step asks of the destination.
type StepName string

// The steps a source sends, in this order where a migration has them.
const (
	// StepMode (mode auto): the technique the source chose.
	StepMode StepName = "mode"
	// StepAddress: the source froze; the destination takes the
	// container's address, holding its packets, and answers AddressTaken.
	StepAddress StepName = "address"
	StepRestore StepName = "restore"
	StepCommit  StepName = "commit"
)

// Step is a control message naming what the source asks for next.
type Step struct {
	Do StepName `json:"do"`
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

// The client's types (package api), under the names the engine has
// always used.
type (
	Request         = api.Request
	Progress        = api.Progress
	Event           = api.Event
	Report          = api.Report
	PhaseSpan       = api.PhaseSpan
	VolumeSync      = api.VolumeSync
	NetworkMove     = api.NetworkMove
	Job             = api.Job
	JobsQuery       = api.JobsQuery
	JobRef          = api.JobRef
	CancelReply     = api.CancelReply
	Resolution      = api.Resolution
	Status          = api.Status
	ContainerStatus = api.ContainerStatus
)

// ReportSchemaVersion numbers the Report's JSON form (api.ReportSchemaVersion).
const ReportSchemaVersion = api.ReportSchemaVersion

package api

import "time"

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

// Status lists an agent's containers.
type Status struct {
	Host       string            `json:"host"`
	Containers []ContainerStatus `json:"containers"`
	// Model is what the agent learned from its migrations (nil: an agent
	// that keeps no history).
	Model *ModelStatus `json:"model,omitempty"`
	// Ferry and Protocol are the agent's build and protocol version, CRIU
	// its CRIU (empty from an older agent): ferry check --peer compares
	// them with its own.
	Ferry    string      `json:"ferry,omitempty"`
	Protocol int         `json:"protocol,omitempty"`
	CRIU     *CRIUStatus `json:"criu,omitempty"`
}

// CRIUStatus is an agent's CRIU: where, which release, and the ferry
// patches it carries (none: a stock CRIU).
type CRIUStatus struct {
	Path    string   `json:"path"`
	Version string   `json:"version"`
	Patches []string `json:"patches"`
}

// ContainerStatus is one container on a host.
type ContainerStatus struct {
	Name string `json:"name"`
	// Runtime is the kind of runtime it runs under (empty from an agent
	// that listed runc's only).
	Runtime string `json:"runtime,omitempty"`
	Status  string `json:"status"`
	Pid     int    `json:"pid"`
	// ResidentBytes is the memory its processes hold, as the host sees it.
	ResidentBytes int64 `json:"resident_bytes"`
}

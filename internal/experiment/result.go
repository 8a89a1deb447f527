package experiment

import (
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/labtool"
)

// Point is one cell of an experiment's grid.
type Point struct {
	// Workload is memhog or a real service: redis, memcached, mosquitto,
	// postgresql.
	Workload string `json:"workload"`
	Runtime  string `json:"runtime"`
	Mode     string `json:"mode"`
	// StateBytes is the state the workload holds before the migration
	// (memhog's memory, a service's preloaded data).
	StateBytes int64 `json:"state_bytes"`
	// DirtyRate is memhog's pages per second; Load a service client's
	// requests per second.
	DirtyRate    int   `json:"dirty_rate,omitempty"`
	Load         int   `json:"load,omitempty"`
	BandwidthBps int64 `json:"bandwidth_bps"`
}

// Prediction is what `ferry plan` predicted for a point.
type Prediction struct {
	TotalMs          float64 `json:"total_ms"`
	DowntimeMs       float64 `json:"downtime_ms"`
	ClientDowntimeMs float64 `json:"client_downtime_ms"`
}

// Run is one measured migration of a point.
type Run struct {
	Point
	Repeat int    `json:"repeat"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`

	DowntimeMs float64 `json:"downtime_ms"`
	// ClientDowntimeMs is the longest stall the service's client saw.
	ClientDowntimeMs float64 `json:"client_downtime_ms"`
	TotalMs          float64 `json:"total_ms"`
	FrozenMs         float64 `json:"frozen_ms"`
	BytesSent        int64   `json:"bytes_sent"`
	// MemoryBytes is the container's memory as the migration found it.
	MemoryBytes int64 `json:"memory_bytes"`
	// DirtyRateMeasured is the pages per second the migration saw
	// written (pre-copy's rounds), for the model.
	DirtyRateMeasured float64 `json:"dirty_rate_measured,omitempty"`
	// WorkingSetBytes is the private memory the service's processes
	// touched in the second before the migration, under the load (real
	// services only).
	WorkingSetBytes int64 `json:"working_set_bytes,omitempty"`
	// SharedBytes is the shared memory its processes hold (a database's
	// buffers), measured then too: dumped while frozen in every mode.
	SharedBytes int64 `json:"shared_bytes,omitempty"`
	StateOK     bool  `json:"state_ok"`
	// The root filesystem's live delta (tar bytes, entries) and its
	// frozen pass's bytes.
	RootfsBytes       int64 `json:"rootfs_bytes"`
	RootfsEntries     int   `json:"rootfs_entries"`
	FrozenRootfsBytes int64 `json:"frozen_rootfs_bytes"`

	Rounds []engine.Round     `json:"rounds"`
	Phases []engine.PhaseSpan `json:"phases"`
	// StartUnixMs is the wall-clock time of the migration's start: the
	// phases' zero.
	StartUnixMs int64 `json:"start_unix_ms"`

	// Client is what the service's clients felt (nil for memhog, whose
	// probe reports ClientDowntimeMs alone).
	Client *labtool.LoadResult `json:"client,omitempty"`
	// Predicted, when the experiment names a profile.
	Predicted *Prediction `json:"predicted,omitempty"`
}

// Results are an experiment's runs, in the order they ran.
type Results struct {
	Name string `json:"name"`
	// Machine says where it ran (kernel, CPUs, fresh or warmed), for the
	// report's reader.
	Machine string `json:"machine"`
	Started string `json:"started"` // RFC 3339
	Runs    []Run  `json:"runs"`
	// BudgetMs is the spec's budget; Auto, with a profile, --mode auto
	// held to it (CheckAuto).
	BudgetMs float64     `json:"budget_ms,omitempty"`
	Auto     []AutoCheck `json:"auto,omitempty"`
}

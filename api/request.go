package api

import (
	"encoding/json"
	"time"
)

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
	// Runtime names the container's runtime (runc, podman, lxc, ...);
	// auto (or empty) finds it by name in the runtimes this host has.
	Runtime string `json:"runtime,omitempty"`
	// RuntimeOptions are options for runtimes, by kind, each the
	// runtime's own (runc: "root", the runc root a container lives under
	// when not the agent's). The source agent refuses options a runtime
	// does not take.
	RuntimeOptions map[string]map[string]string `json:"runtime_options,omitempty"`
	// KeepVolumes leaves the source's copy of the volumes that moved in
	// place after the commit (by default they are removed with it).
	KeepVolumes bool `json:"keep_volumes,omitempty"`
	// Faults to inject, for tests (see package fault: ACTION@PHASE);
	// honoured only by agents started with --allow-faults.
	Faults []string `json:"faults,omitempty"`
	// Precopy shapes pre-copy and hybrid rounds.
	Precopy PrecopyOptions `json:"precopy,omitempty"`
	// MaxFrozen bounds how long the source may stay frozen: from its
	// freeze until its removal after the commit (a post-copy or hybrid
	// source serves its pages frozen until the last is pulled). A
	// Kubernetes pod's liveness probe restarts a container silent for
	// longer. The source measures the container and the link first, and
	// refuses a mode predicted (by its upper bound) to hold it longer
	// before anything is frozen; auto picks among the others. 0: no bound.
	MaxFrozen time.Duration `json:"max_frozen,omitempty"`
	// MaxBandwidthBps caps what the source sends, in bits per second.
	MaxBandwidthBps int64 `json:"max_bandwidth_bps,omitempty"`
	// Line puts the migration in a line of this host's migrations (a
	// drain's) whose memory crosses a few at a time (line.go).
	Line *LineSpec `json:"line,omitempty"`
}

// PrecopyOptions are the stop rule and the stream's shape.
type PrecopyOptions struct {
	MaxRounds int `json:"max_rounds,omitempty"`
	// MinRoundBytes: stop once a round sends less than this.
	MinRoundBytes int64 `json:"min_round_bytes,omitempty"`
	// MaxDowntime: stop once the predicted downtime fits.
	MaxDowntime time.Duration `json:"max_downtime,omitempty"`
	// AutoConverge throttles the container's CPU when rounds stop shrinking.
	AutoConverge bool   `json:"auto_converge,omitempty"`
	Compress     string `json:"compress,omitempty"` // "none" or "zstd"
	// Engine: auto (native where the kernel tracks dirty pages), native
	// or content.
	Engine string `json:"engine,omitempty"`
	// Switchover, for the content engine: rebuild or dump (see below);
	// auto picks rebuild where CRIU's lazy dump works.
	Switchover string `json:"switchover,omitempty"`
	// WriteTracking, for the content engine: auto (read only what the
	// kernel says was written, where it can say) or off (see tracking.go).
	WriteTracking string `json:"write_tracking,omitempty"`
}

// LineSpec names a line and how many of its migrations cross at once.
type LineSpec struct {
	Name string `json:"name"`
	// Width is how many cross at once (0: one).
	Width int `json:"width,omitempty"`
	// Handoff is when a migration with live rounds gives its turn away:
	// HandoffCommit (the default) or HandoffFreeze.
	Handoff string `json:"handoff,omitempty"`
}

// RuncOptionRoot is runc's RuntimeOptions key naming its root.
const RuncOptionRoot = "root"

// KubernetesOptionShared is the kubernetes runtime's RuntimeOptions key
// listing (comma-separated) where the container mounts persistent volumes
// its controller found the target node shares: they move as host
// directories of the same storage there, never copied.
const KubernetesOptionShared = "shared"

// request is Request without its JSON methods.
type request Request

// UnmarshalJSON reads a Request, taking an older CLI's runc_root as runc's
// root option.
func (r *Request) UnmarshalJSON(b []byte) error {
	var v struct {
		request
		RuncRoot string `json:"runc_root"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Request(v.request)
	if v.RuncRoot != "" && r.RuntimeOptions["runc"][RuncOptionRoot] == "" {
		r.SetRuntimeOption("runc", RuncOptionRoot, v.RuncRoot)
	}
	return nil
}

// SetRuntimeOption sets one of a runtime's options.
func (r *Request) SetRuntimeOption(kind, key, value string) {
	if r.RuntimeOptions == nil {
		r.RuntimeOptions = map[string]map[string]string{}
	}
	if r.RuntimeOptions[kind] == nil {
		r.RuntimeOptions[kind] = map[string]string{}
	}
	r.RuntimeOptions[kind][key] = value
}

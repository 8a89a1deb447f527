// Package api is what a program needs to ask a ferry agent for a
// migration and to read what became of it: the request, the progress
// events, the report, the jobs an agent keeps, and (in api/client) the
// client that talks to an agent's control socket or to its address over
// TLS. It holds types only and imports nothing of ferry's internals, so
// that the CLI, a Kubernetes controller and other Go programs share one
// definition of the wire format.
package api

// Techniques: the names a Request's Mode takes (and ModeAuto, which lets
// the source measure and choose).
const (
	ModeCold     = "cold"
	ModePrecopy  = "precopy"
	ModePostcopy = "postcopy"
	ModeHybrid   = "hybrid"
	ModeAuto     = "auto"
)

// RuntimeAuto finds a container by name in every runtime present.
const RuntimeAuto = "auto"

// Channel kinds on a session between a client and an agent.
const (
	ChanMigrate = "migrate" // a client asks the agent to migrate one of its containers (Request -> Events)
	ChanStatus  = "status"  // a client asks what the agent runs (-> Status)
	ChanJobs    = "jobs"    // a client lists migrations (JobsQuery -> []Job)
	ChanCancel  = "cancel"  // a client cancels one (JobRef -> CancelReply)
	ChanWait    = "wait"    // a client follows one to its end (JobRef -> Events)
	ChanResolve = "resolve" // a client settles one left in doubt (JobRef -> Resolution)
)

// How content-based pre-copy switches over (PrecopyOptions.Switchover).
const (
	// SwitchoverRebuild: CRIU dumps without memory while ferry sends the
	// frozen memory's changes as a last round; the destination completes
	// the images from its copy and restores them. Needs CRIU's lazy dump.
	SwitchoverRebuild = "rebuild"
	// SwitchoverDump: a full CRIU dump whose page stream carries references
	// to the pages the destination holds.
	SwitchoverDump = "dump"
)

// When a migration in a line gives its turn to the next (LineSpec.Handoff).
const (
	HandoffCommit = "commit"
	HandoffFreeze = "freeze"
)

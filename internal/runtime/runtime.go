// Package runtime is the narrow interface between ferry's migration engine
// and the container runtimes whose containers it moves (runc, Podman, LXC,
// containerd, Docker, Kubernetes' containerd), and the registry of their
// kinds (registry.go; package all lists them).
// A technique never knows which runtime it drives: it inspects, freezes,
// checkpoints with typed options, and at the destination prepares a target
// and restores into it. Each runtime is one adapter package below this one.
//
// Memory always travels through ferry's page server, never through a
// runtime's own archive: every adapter passes CheckpointOptions.PageServer
// to CRIU (as a flag, or through a CRIU configuration file where the
// runtime has no flag for it).
package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/ferry-migrate/ferry/api"

	"github.com/ferry-migrate/ferry/internal/privnet"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/shareddir"
)

// ErrNotFound is returned when a runtime does not know the container.
var ErrNotFound = errors.New("container not found")

// Caps is what a runtime can do for a migration on this host. The engine
// refuses a technique whose needs are missing before anything is frozen.
type Caps struct {
	// Freeze: the runtime can freeze the container without dumping it and
	// then dump it frozen, leaving it frozen (runc pause, lxc-freeze). The
	// source is then resumable until the commit by thawing it. Without it
	// the dump itself freezes and Dump.Release decides the source's fate.
	Freeze bool
	// LazyDump: a dump can leave the memory in the frozen source, served
	// by CRIU's page server (pre-copy's rebuild switchover; the source of
	// post-copy and hybrid).
	LazyDump bool
	// LazyRestore: a restore can run with a lazy-pages daemon filling the
	// memory on demand (post-copy, hybrid).
	LazyRestore bool
	// PreDump: CRIU's native pre-dump (also needs soft-dirty tracking).
	PreDump bool
	// RestoreStopped: a restored copy can stay stopped until the commit
	// (CRIU's leave-stopped), so an uncommitted copy never runs.
	RestoreStopped bool
	// SmapsSnapshot: the dump's CRIU reads the tasks' mappings from a
	// snapshot taken before the freeze where they are unchanged
	// (CheckpointOptions.SmapsSnapshot; ferry's CRIU).
	SmapsSnapshot bool
	// CopiesImages: the restore reads a copy of the images directory
	// (Docker's), so the images must be whole: no parent directory that
	// pre-copy's switchover could refer to pages in.
	CopiesImages bool
}

// Container is what a runtime says about one of its containers, at the
// source, and what the destination's runtime needs to re-create it.
type Container struct {
	// Runtime is the adapter's Kind.
	Runtime string `json:"runtime"`
	// Name is the name users know the container by; ID the runtime's own
	// (the same for runc and LXC).
	Name string `json:"name"`
	ID   string `json:"id"`
	// PID is the container's init process, as this host sees it (pre-copy
	// reads its memory). Not meaningful at another host.
	PID int `json:"-"`
	// Status is running, paused or stopped.
	Status string `json:"status"`
	// Rootfs is the directory whose contents move: a runc bundle's root,
	// Podman's writable layer, an LXC rootfs. Source-local.
	Rootfs string `json:"-"`
	// Spec is the container's OCI config.json, where the runtime has one.
	Spec []byte `json:"spec,omitempty"`
	// Image names the image the writable layer sits on (by ID); the
	// destination must hold it. Empty: the rootfs moves whole.
	Image string `json:"image,omitempty"`
	// Meta carries the runtime's own records of the container (Podman's
	// configuration, an LXC config file), opaque to the engine.
	Meta map[string][]byte `json:"meta,omitempty"`
	// Volumes are the runtime's volumes mounted into the container whose
	// data moves with it, synced as its root filesystem is.
	Volumes []Volume `json:"volumes,omitempty"`
	// Networks are the runtime's networks the container is attached to,
	// which the destination's runtime attaches it to again.
	Networks []Network `json:"networks,omitempty"`
	// Shared are host directories it bind-mounts, which are not copied:
	// the destination must have the same storage there (shareddir).
	Shared []shareddir.Dir `json:"shared,omitempty"`
}

// Volume is a directory of data the runtime mounts into the container
// (a named volume), which moves with it.
type Volume struct {
	// Name is the runtime's name for it, the same at the destination.
	Name string `json:"name"`
	// Path is where the container sees it.
	Path string `json:"path"`
	// Dir holds its data at the source.
	Dir string `json:"-"`
	// Bytes is its size as the migration found it (the engine's, not
	// the runtime's), for the destination's space check.
	Bytes int64 `json:"bytes"`
}

// Network is a network the runtime attached the container to.
type Network = api.Network

// PublishedPort is a port binding as Network.Ports holds it:
// HOSTPORT->PORT/PROTO, with HOSTIP: first where it is bound to one
// address.
func PublishedPort(hostIP, hostPort, port string) string {
	if hostIP != "" && hostIP != "0.0.0.0" {
		hostPort = hostIP + ":" + hostPort
	}
	return hostPort + "->" + port
}

// HostLocal says whether any of nets ends at its host.
func HostLocal(nets []Network) bool {
	for _, n := range nets {
		if n.HostLocal {
			return true
		}
	}
	return false
}

// CheckpointOptions are what a technique asks of a dump.
type CheckpointOptions struct {
	// ImagesDir receives CRIU's images (all but the memory, which goes to
	// PageServer); WorkDir its logs and statistics.
	ImagesDir, WorkDir string
	// ParentDir is a previous pre-dump the dump builds on, relative to
	// ImagesDir (native pre-copy).
	ParentDir string
	// PageServer is the loopback ADDR:PORT that receives the pages.
	PageServer string
	// Lazy leaves the memory in the source for a lazy-pages daemon; the
	// dump's page server serves it until the last page is pulled.
	Lazy bool
	// PageNet, for a lazy dump, is a private network namespace to run it
	// in, so that its page server (which serves whoever connects first)
	// listens where only the engine can connect. Nil: the host's own.
	PageNet *privnet.NS
	// PreDump dumps memory only, the container running on (native pre-copy).
	PreDump bool
	// TCPEstablished carries established TCP connections; TCPClose dumps
	// them to be restored closed (their peers cannot reach the copy).
	TCPEstablished, TCPClose bool
	// NetworkQuiet says the engine keeps the container's network silent
	// itself (its links down from the freeze, the destination holding
	// what arrives until the commit), so the dump need not lock it.
	NetworkQuiet bool
	// SmapsSnapshot is a directory of the tasks' smaps read just before
	// the freeze (criu.TakeSmapsSnapshot), which CRIU reads instead of the
	// frozen tasks' own where their mappings are unchanged; the engine
	// checks it before the commit (criu.SmapsSnapshot.Check).
	SmapsSnapshot string
	// IrmapScanPaths are where CRIU looks for the path of a watched file
	// whose handle it cannot open (criu.IrmapScanPaths).
	IrmapScanPaths []string
}

// Refuse says why a runtime of kind, which can do what c says, cannot make
// this dump (a lazy dump without LazyDump, a pre-dump without PreDump);
// nil when it can. The engine asks no such dump; adapters check anyway.
func (o CheckpointOptions) Refuse(kind string, c Caps) error {
	switch {
	case o.Lazy && !c.LazyDump:
		return fmt.Errorf("%s: lazy dumps are not available on this host (see ferry check)", kind)
	case (o.PreDump || o.ParentDir != "") && !c.PreDump:
		return fmt.Errorf("%s: CRIU pre-dumps are not supported", kind)
	}
	return nil
}

// Dump is a checkpoint under way or done. Checkpoint returns it once the
// images are written (for a lazy dump: once CRIU's page server listens).
type Dump interface {
	// Wait returns the dump's outcome once CRIU has exited. A lazy dump
	// exits when its page server is closed (see internal/criu).
	Wait() error
	// Release ends a dump that still holds the container: after a commit
	// (kill) the source's processes end, otherwise they run on. A no-op
	// where the runtime froze the container itself (Caps.Freeze): thawing
	// or removing it is the engine's next step then.
	Release(ctx context.Context, kill bool) error
}

// RestoreOptions are what a technique asks of a restore.
type RestoreOptions struct {
	ImagesDir, WorkDir string
	// Lazy restores with a lazy-pages daemon serving the memory.
	Lazy           bool
	TCPEstablished bool
	// TCPClose restores the connections a TCPClose dump left closed.
	TCPClose bool
}

// PrepareOptions say how the container is to sit on this host.
type PrepareOptions struct {
	// WorkDir is the migration's scratch directory here.
	WorkDir string
	// NetNS is the network namespace the container joins here, when it
	// had one of its own at the source and ferry rebuilt it ("": none).
	NetNS string
}

// Target is a container being received: prepared before the source
// freezes (so the destination refuses early), restored at the switchover.
type Target interface {
	// RootfsDir is where the source's root filesystem changes are applied.
	RootfsDir() string
	// Restore restores from images and returns once the runtime reports
	// the container running, with its init process. Where Caps says
	// RestoreStopped, its processes stay stopped until Start: a copy that
	// is never committed never runs.
	Restore(ctx context.Context, o RestoreOptions) (pid int, err error)
	// Start lets a copy restored stopped run (a no-op otherwise); it may
	// be called again, also on a container that runs.
	Start(ctx context.Context) error
	// Discard removes everything Prepare and Restore made: the migration
	// did not commit.
	Discard(ctx context.Context) error
}

// ImagesChecker is a Target that checks the CRIU images it is to restore
// against its own configuration (an LXC config), where the engine's check
// against the container's OCI spec does not apply.
type ImagesChecker interface {
	CheckImages(dir string) error
}

// VolumeTarget is a Target whose runtime receives volumes.
type VolumeTarget interface {
	// VolumeDir is where the named volume's data is synced into: one of
	// the Container's Volumes, made by Prepare, empty.
	VolumeDir(name string) (string, error)
}

// Runtime drives one container runtime on this host.
type Runtime interface {
	// Kind names the runtime: runc, podman, lxc, containerd, docker.
	Kind() string
	// Caps says what it can do here.
	Caps() Caps
	// Inspect describes a container, or returns ErrNotFound.
	Inspect(ctx context.Context, name string) (*Container, error)
	// List lists the runtime's containers on this host, each with its
	// Name (as Inspect takes it), ID, Status and, running or paused, PID;
	// none where the runtime's daemon is not running.
	List(ctx context.Context) ([]Container, error)
	// Freeze and Thaw stop and restart every process of the container
	// (only where Caps.Freeze).
	Freeze(ctx context.Context, c *Container) error
	Thaw(ctx context.Context, c *Container) error
	// Checkpoint dumps the container; see Dump.
	Checkpoint(ctx context.Context, c *Container, o CheckpointOptions) (Dump, error)
	// Remove deletes the source's copy after a commit: the runtime no
	// longer lists it.
	Remove(ctx context.Context, c *Container) error
	// Prepare readies this host to receive c (config, records, an empty
	// rootfs to sync into). It refuses what cannot work here (the name is
	// taken, the image is missing) before the source freezes anything.
	Prepare(ctx context.Context, c *Container, o PrepareOptions) (Target, error)
}

// EarlyCheckpointer is a runtime whose dump can begin before the freeze:
// its own work before CRIU touches the container (runc's start, CRIU's
// start and probes: ~14 ms here) then runs while the container still
// runs, not in the downtime.
type EarlyCheckpointer interface {
	// StartCheckpoint begins a dump of c that touches it only at Go, and
	// returns once it waits there; ctx is the dump's, as Checkpoint's. An
	// error leaves nothing begun (Checkpoint still works).
	StartCheckpoint(ctx context.Context, c *Container, o CheckpointOptions) (Checkpointing, error)
}

// Checkpointing is a dump begun before the freeze.
type Checkpointing interface {
	// Go lets it dump the container, frozen now, and returns as
	// Checkpoint does.
	Go() (Dump, error)
	// Cancel ends it with the container untouched, once it has stopped;
	// after Go, a no-op.
	Cancel()
}

// CRIUElsewhere is a Target whose restore has CRIU work outside
// RestoreOptions.WorkDir, in its runtime's own directories (Docker's
// shim): the engine looks there too for the tasks a CRIU killed mid-way
// left holding the runtime (criu.WatchAbandoned).
type CRIUElsewhere interface {
	Target
	// CRIUDirs are where the restore's CRIU keeps files open.
	CRIUDirs() []string
}

// EarlyTarget is a Target whose restore can begin before its images are
// complete: the runtime's own work before CRIU reads an image (runc's
// start, its mounts, CRIU's start and cgroups: ~30 ms here) then runs
// while the source still dumps, not in the downtime.
type EarlyTarget interface {
	Target
	// StartRestore begins a restore that reads no image and restores
	// nothing until Go. Once the root filesystem is final only: the
	// runtime may mount it. An error leaves the target as it was
	// (Restore still works).
	StartRestore(o RestoreOptions) (Restoring, error)
}

// Restoring is a restore begun before its images were complete.
type Restoring interface {
	// Go lets it read the images, complete now, and returns as
	// Target.Restore does (it is one: where the early start failed, or
	// the images do not match what it started with, Go restores anew).
	Go(ctx context.Context) (pid int, err error)
	// Cancel ends it with nothing restored, once it has stopped; after
	// Go, a no-op.
	Cancel()
}

// Continuer is a runtime that can let a container restored stopped run,
// by name (an agent restarted between the commit and the start).
type Continuer interface {
	Continue(ctx context.Context, c *Container) error
}

// State reports whether a container is running, read from its runtime.
// The engine checks this before it reports a state. A container whose
// init is dying (a zombie, or dumping core: a process a killed CRIU let
// go inside its injected code dies as soon as it runs) is stopped, though
// its runtime calls it running until the core is written.
func State(ctx context.Context, r Runtime, name string) (string, error) {
	c, err := r.Inspect(ctx, name)
	if err != nil {
		return "", err
	}
	if c.Status == "running" && c.PID > 0 && procs.Dying(c.PID) {
		return "stopped", nil
	}
	return c.Status, nil
}

// Set is the runtimes present on a host, by kind.
type Set map[string]Runtime

// Get returns the runtime of a kind, or an error naming those present.
func (s Set) Get(kind string) (Runtime, error) {
	if r, ok := s[kind]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("runtime %q is not available on this host (present: %s)", kind, s.kinds())
}

// Find looks a container up by name in every runtime present (at once:
// each asks its own tool) and fails when none or more than one has it.
func (s Set) Find(ctx context.Context, name string) (Runtime, *Container, error) {
	kinds := s.sorted()
	type answer struct {
		c   *Container
		err error
	}
	answers := make([]answer, len(kinds))
	var wg sync.WaitGroup
	for i, k := range kinds {
		wg.Go(func() {
			c, err := s[k].Inspect(ctx, name)
			answers[i] = answer{c, err}
		})
	}
	wg.Wait()
	var found []string
	var rt Runtime
	var c *Container
	for i, k := range kinds {
		a := answers[i]
		if errors.Is(a.err, ErrNotFound) {
			continue
		}
		if a.err != nil {
			return nil, nil, fmt.Errorf("looking for %q in %s: %w (name the container's runtime with --runtime to skip the others)", name, k, a.err)
		}
		found = append(found, k)
		rt, c = s[k], a.c
	}
	switch len(found) {
	case 0:
		return nil, nil, fmt.Errorf("no container %q in any runtime here (%s): %w", name, s.kinds(), ErrNotFound)
	case 1:
		return rt, c, nil
	}
	return nil, nil, fmt.Errorf("container %q exists in several runtimes (%s): name one with --runtime", name, strings.Join(found, ", "))
}

func (s Set) sorted() []string {
	ks := make([]string, 0, len(s))
	for k := range s {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func (s Set) kinds() string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s.sorted(), ", ")
}

// Client is an adapter's connection to its runtime's daemon (containerd,
// Docker): dialled at first use, kept until Close.
type Client[C io.Closer] struct {
	mu   sync.Mutex
	c    C
	open bool
}

// Get returns the connection, dialling it first if there is none.
func (l *Client[C]) Get(dial func() (C, error)) (C, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.open {
		c, err := dial()
		if err != nil {
			return c, err
		}
		l.c, l.open = c, true
	}
	return l.c, nil
}

// Close drops the connection, if there is one.
func (l *Client[C]) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.open {
		return nil
	}
	var zero C
	err := l.c.Close()
	l.c, l.open = zero, false
	return err
}

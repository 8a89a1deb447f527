// Package docker is Docker (20.10, on containerd) as a ferry runtime,
// through Docker's Go client: a container moves to another host's Docker,
// which runs it afterwards under the same name (docker ps, logs, stop and
// rm work there) while the source's no longer lists it.
//
// Source. A Docker container is a runc container under Docker's runc root
// (EXEC-ROOT/runtime-runc/moby). Freeze is `docker pause`, so Docker too
// says paused; the dump is ferry's usual `runc checkpoint --leave-running
// --page-server` of it, memory streaming to ferry's page server (Docker's
// own checkpoint writes it to a directory first, and needs the daemon's
// experimental mode). The container stays paused, resumable by `docker
// unpause` until the commit; Remove is `docker rm --force`.
//
// Destination. Prepare checks the source's configuration against this
// host's admission policy, that the image is here (by ID: only the
// container's writable layer moves) and the name is free, then has Docker
// create the container from the source's configuration: same name, a new
// ID (Docker chooses it). Its writable layer, not mounted yet, is
// RootfsDir. Restore is `docker start --checkpoint`: Docker reads a
// checkpoint only from the container's own checkpoints directory, where
// ferry's images directory is bind-mounted (no copy there); but Docker
// 20.10 then tars the images into containerd's content store and
// containerd unpacks them again for the restore, two copies of the memory
// that ferry cannot avoid (docs/BENCHMARKS.md measures them): symbolic
// links to the images instead cross both copies, but CRIU opens the
// memory's images from inside the container's root, where they lead
// nowhere. The restore needs the daemon's experimental mode.
//
// Docker passes no OCI annotations to its containers (20.10), through
// which runc would hand CRIU ferry's configuration file (leave-stopped, so
// that a copy that is never committed never runs). Where the daemon has
// ferry's runtime, StoppedRuntime (ferry-runc.sh: runc, except that a
// restore of ferry's checkpoint runs CRIU with the file the checkpoint
// carries), the container is created under it at the destination and its
// processes stay stopped until the commit; elsewhere the restored copy
// runs at once (Caps.RestoreStopped false).
//
// Named volumes of the local driver move with the container, and a
// container on a bridge network is attached to the destination's network
// of that name (attach.go). A bind mount of a host directory is not
// copied: it is remounted where the destination allows its source
// (--allow-bind) and has the same storage there (runtime.Container.Shared).
// Not moved: other network drivers, logs written before the move.
package docker

import (
	"context"
	_ "embed" // ferry-runc.sh
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// DefaultHost is Docker's own socket.
const DefaultHost = "unix:///var/run/docker.sock"

// DefaultExecRoot is dockerd's --exec-root default.
const DefaultExecRoot = "/var/run/docker"

// StoppedRuntime is the name of the Docker runtime that runs
// ferry-runc.sh (dockerd --add-runtime, or daemon.json's "runtimes").
const StoppedRuntime = "ferry-runc"

// Wrapper is ferry-runc.sh, for a daemon's StoppedRuntime.
//
//go:embed ferry-runc.sh
var Wrapper []byte

// criuConf is the CRIU configuration file a checkpoint of ferry's
// carries for StoppedRuntime.
const criuConf = "ferry-criu.conf"

// metaConfig is the Container.Meta key of the source's configuration.
const metaConfig = "docker.config"

// Runtime is one host's Docker daemon.
type Runtime struct {
	// Host is the daemon's address (unix://PATH); empty means DefaultHost.
	Host string
	// ExecRoot is dockerd's --exec-root, below which runc keeps its
	// containers; empty means DefaultExecRoot.
	ExecRoot string
	// NetNS is set where the daemon runs in a network namespace ferry's
	// host gives containers: a host-network container joins it.
	NetNS string
	// Admission is what this host accepts of an incoming configuration.
	Admission admission.Policy
	// Lazy says CRIU's lazy pages work here: a lazy dump at the source
	// (post-copy, hybrid, pre-copy's rebuild switchover), and a lazy
	// restore where the daemon has StoppedRuntime, which hands CRIU the
	// lazy option and the lazy-pages daemon's work directory.
	Lazy bool

	conn    runtime.Client[*client.Client]
	mu      sync.Mutex
	stopped *bool // whether the daemon has StoppedRuntime, once asked
}

var _ runtime.Runtime = (*Runtime)(nil)

// Kind is "docker".
func (r *Runtime) Kind() string { return "docker" }

// Caps: Docker pauses without a dump and the container stays paused
// through ferry's runc dump; its restore reads a copy of complete images
// (so pre-copy's switchover refers to no parent directory). Where the
// daemon has StoppedRuntime, the restore leaves the processes stopped and
// can be lazy: the copy Docker makes then holds no memory.
func (r *Runtime) Caps() runtime.Caps { return CapsFor(r.Lazy, r.hasStoppedRuntime()) }

// CapsFor is Caps where CRIU's lazy pages work (lazy) and the daemon has
// StoppedRuntime (stopped).
func CapsFor(lazy, stopped bool) runtime.Caps {
	return runtime.Caps{Freeze: true, LazyDump: lazy, LazyRestore: lazy && stopped, CopiesImages: true, RestoreStopped: stopped, SmapsSnapshot: true}
}

// HasStoppedRuntime says whether the daemon at host (empty: DefaultHost)
// runs and has StoppedRuntime.
func HasStoppedRuntime(host string) bool {
	r := &Runtime{Host: host}
	defer r.Close()
	return r.hasStoppedRuntime()
}

// hasStoppedRuntime asks the daemon, once, whether it has StoppedRuntime.
func (r *Runtime) hasStoppedRuntime() bool {
	r.mu.Lock()
	known := r.stopped
	r.mu.Unlock()
	if known != nil {
		return *known
	}
	if sock, ok := strings.CutPrefix(r.host(), "unix://"); ok {
		if _, err := os.Stat(sock); err != nil {
			return false // no daemon: ask again later
		}
	}
	cl, err := r.connect()
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := cl.Info(ctx)
	if err != nil {
		return false
	}
	_, has := info.Runtimes[StoppedRuntime]
	r.mu.Lock()
	r.stopped = &has
	r.mu.Unlock()
	return has
}

func (r *Runtime) host() string {
	if r.Host == "" {
		return DefaultHost
	}
	return r.Host
}

// runc is runc for the daemon's containers: Docker 20.10 keeps every
// runtime's (StoppedRuntime's too) under runtime-runc.
func (r *Runtime) runc() runc.Host {
	return runc.Host{Root: filepath.Join(r.execRoot(), "runtime-runc", "moby")}
}

func (r *Runtime) execRoot() string {
	if r.ExecRoot == "" {
		return DefaultExecRoot
	}
	return r.ExecRoot
}

// shimWorkDir is where containerd's shim has CRIU work (and log) for the
// daemon's container id.
func (r *Runtime) shimWorkDir(id string) string {
	return filepath.Join(r.execRoot(), "containerd", "daemon", "io.containerd.runtime.v2.task", "moby", id, "work")
}

// connect returns the client, made once; the API version is the daemon's.
func (r *Runtime) connect() (*client.Client, error) {
	return r.conn.Get(func() (*client.Client, error) {
		c, err := client.NewClientWithOpts(client.WithHost(r.host()), client.WithAPIVersionNegotiation())
		if err != nil {
			return nil, fmt.Errorf("docker at %s: %w", r.host(), err)
		}
		return c, nil
	})
}

// Close drops the connection to the daemon.
func (r *Runtime) Close() error { return r.conn.Close() }

// config is what the destination needs to create the container again.
type config struct {
	Name       string                `json:"name"`
	Image      string                `json:"image"` // by ID
	Config     *container.Config     `json:"config"`
	HostConfig *container.HostConfig `json:"host_config"`
}

func parseConfig(c *runtime.Container) (*config, error) {
	b := c.Meta[metaConfig]
	if len(b) == 0 {
		return nil, errors.New("docker: the container's description carries no Docker configuration")
	}
	var cfg config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("docker: bad container configuration: %w", err)
	}
	if cfg.Name == "" || cfg.Image == "" || cfg.Config == nil || cfg.HostConfig == nil {
		return nil, errors.New("docker: the container configuration is incomplete")
	}
	return &cfg, nil
}

// inspect reads a container; ErrNotFound when Docker does not know it.
func (r *Runtime) inspect(ctx context.Context, name string) (container.InspectResponse, error) {
	if sock, ok := strings.CutPrefix(r.host(), "unix://"); ok {
		if _, err := os.Stat(sock); err != nil {
			// No daemon here, so none of its containers.
			return container.InspectResponse{}, fmt.Errorf("docker: no socket at %s (is dockerd running? agent --docker): %w: %w", sock, err, runtime.ErrNotFound)
		}
	}
	cl, err := r.connect()
	if err != nil {
		return container.InspectResponse{}, err
	}
	j, err := cl.ContainerInspect(ctx, name)
	if errdefs.IsNotFound(err) {
		return j, fmt.Errorf("docker (%s): no container %q: %w", r.host(), name, runtime.ErrNotFound)
	}
	if err == nil && (j.ContainerJSONBase == nil || j.State == nil || j.Config == nil) {
		err = fmt.Errorf("docker (%s): container %q: incomplete inspect answer", r.host(), name)
	}
	return j, err
}

// status maps Docker's states on the engine's running, paused, stopped.
func status(s string) string {
	switch s {
	case "running", "paused":
		return s
	}
	return "stopped" // created, restarting, removing, exited, dead
}

// Inspect describes a container; for a running or paused one also its
// writable layer and configuration.
func (r *Runtime) Inspect(ctx context.Context, name string) (*runtime.Container, error) {
	j, err := r.inspect(ctx, name)
	if err != nil {
		return nil, err
	}
	c := &runtime.Container{Runtime: r.Kind(), Name: strings.TrimPrefix(j.Name, "/"), ID: j.ID, Status: status(j.State.Status), Image: j.Image}
	if c.Status == "stopped" {
		return c, nil
	}
	c.PID = j.State.Pid
	if j.GraphDriver.Name != "overlay2" {
		return nil, fmt.Errorf("docker container %q uses the %q storage driver: ferry moves the writable layer of overlay2 only", c.Name, j.GraphDriver.Name)
	}
	if c.Rootfs = j.GraphDriver.Data["UpperDir"]; c.Rootfs == "" {
		return nil, fmt.Errorf("docker container %q has no writable layer", c.Name)
	}
	if j.Config.Tty {
		return nil, fmt.Errorf("docker container %q has a terminal: CRIU can restore it only as a shell job, which ferry does not move", c.Name)
	}
	b, err := json.Marshal(config{Name: c.Name, Image: j.Image, Config: j.Config, HostConfig: j.HostConfig})
	if err != nil {
		return nil, err
	}
	c.Meta = map[string][]byte{metaConfig: b}
	cl, err := r.connect()
	if err != nil {
		return nil, err
	}
	if c.Volumes, err = volumesOf(ctx, cl, j); err != nil {
		return nil, err
	}
	c.Shared = sharedOf(j)
	if c.Networks, err = networksOf(ctx, cl, j); err != nil {
		return nil, err
	}
	return c, nil
}

// Freeze is `docker pause`.
func (r *Runtime) Freeze(ctx context.Context, c *runtime.Container) error {
	cl, err := r.connect()
	if err != nil {
		return err
	}
	return cl.ContainerPause(ctx, c.ID)
}

// Thaw is `docker unpause`. A CRIU killed mid-dump leaves the cgroup
// thawed while Docker still says paused, and runc refuses to resume a
// container that is not paused: Thaw pauses it through runc first.
func (r *Runtime) Thaw(ctx context.Context, c *runtime.Container) error {
	cl, err := r.connect()
	if err != nil {
		return err
	}
	err = cl.ContainerUnpause(ctx, c.ID)
	if err == nil || !strings.Contains(err.Error(), "not paused") {
		return err
	}
	j, ierr := r.inspect(ctx, c.Name) // a recovering agent has the name from its journal
	if ierr != nil {
		return errors.Join(err, ierr)
	}
	if perr := r.runc().Pause(ctx, j.ID); perr != nil {
		return errors.Join(err, perr)
	}
	return cl.ContainerUnpause(ctx, c.ID)
}

// Checkpoint dumps the paused container with ferry's runc checkpoint (see
// the package comment); it stays paused.
func (r *Runtime) Checkpoint(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions) (runtime.Dump, error) {
	if err := o.Refuse(r.Kind(), r.Caps()); err != nil {
		return nil, err
	}
	cfg, err := parseConfig(c)
	if err != nil {
		return nil, err
	}
	if rt := cfg.HostConfig.Runtime; rt != "" && rt != "runc" && rt != StoppedRuntime {
		return nil, fmt.Errorf("docker container %q runs under runtime %q: ferry checkpoints Docker containers only under runc", c.Name, rt)
	}
	rc := r.runc()
	if err := rc.RequirePaused(ctx, c.ID, fmt.Sprintf("docker container %q", c.Name), " (dockerd with another --exec-root? agent --docker-exec-root)"); err != nil {
		return nil, err
	}
	return rc.Dump(ctx, c.ID, o)
}

// Remove is `docker rm --force` (a paused container too), then `docker
// volume rm` of the volumes that moved with it (c.Volumes); a container
// or volume already gone counts as removed.
func (r *Runtime) Remove(ctx context.Context, c *runtime.Container) error {
	cl, err := r.connect()
	if err != nil {
		return err
	}
	id := c.ID
	if id == "" {
		id = c.Name
	}
	err = cl.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return removeVolumes(ctx, cl, c.Volumes)
}

// List is Docker's container list, with each live container's PID from
// its inspect (the list has none).
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	if sock, ok := strings.CutPrefix(r.host(), "unix://"); ok {
		if _, err := os.Stat(sock); err != nil {
			return nil, nil // no daemon here, so none of its containers
		}
	}
	cl, err := r.connect()
	if err != nil {
		return nil, err
	}
	sums, err := cl.ContainerList(ctx, container.ListOptions{All: true})
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Container, 0, len(sums))
	for _, s := range sums {
		c := runtime.Container{Runtime: r.Kind(), Name: s.ID, ID: s.ID, Status: status(s.State)}
		if len(s.Names) > 0 {
			c.Name = strings.TrimPrefix(s.Names[0], "/")
		}
		if c.Status != "stopped" {
			if j, err := r.inspect(ctx, s.ID); err == nil {
				c.PID = j.State.Pid
			}
		}
		out = append(out, c)
	}
	return out, nil
}

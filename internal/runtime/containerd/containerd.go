// Package containerd is containerd as a ferry runtime, through
// containerd's own Go client: a container of a containerd namespace moves
// to another host's containerd, which owns its task afterwards (`ctr -n NS
// tasks ls` lists it there under the same ID; kill, delete and `ctr
// containers rm` work) while the source's no longer lists it.
//
// Source. A containerd task is a runc container under the shim's runc
// root (/run/containerd/runc/NS, or the root its runtime options name).
// Freeze is the task's Pause (so containerd, too, says paused); the dump
// is ferry's usual `runc checkpoint --leave-running --page-server` of that
// container, memory streaming to ferry's page server: the shim's own
// checkpoint would write memory into an images directory (or containerd's
// content store) first. The container stays paused, resumable by the
// task's Resume until the commit; Remove deletes task, container and
// snapshot.
//
// Destination. Prepare checks, before anything is frozen, that the ID is
// free and that the image is here under the same name and digest (only
// the container's own layer, its snapshot's upper directory, moves), then
// creates the container from the source's record: the same ID, labels,
// runtime and spec (adapted to this host's cgroup parent and network
// namespace), a new snapshot of the image whose upper directory is
// RootfsDir. Restore creates the task from ferry's images directory in
// place (containerd's WithRestoreImagePath: nothing is copied into the
// content store) and starts it; CRIU leaves its processes stopped until
// Start, through the CRIU configuration file the spec's org.criu.config
// annotation names.
//
// Names: NS/ID, or ID in the "default" namespace.
//
// Not moved: the task's standard input and output (the destination's task
// writes both to a log file of ferry's, LogPath), a terminal, volumes and
// other bind mounts (refused by admission unless allowed), snapshotters
// other than overlayfs.
package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// DefaultAddress is containerd's own socket.
const DefaultAddress = "/run/containerd/containerd.sock"

// defaultRuncRoot is where the runc shim keeps its containers unless the
// runtime options name a root.
const defaultRuncRoot = "/run/containerd/runc"

// metaRecord is the Container.Meta key of the container's record.
const metaRecord = "containerd.record"

// Runtime is one host's containerd.
type Runtime struct {
	// Address is containerd's socket; empty means DefaultAddress.
	Address string
	// RuncRoot is the runc root (runc adds the namespace) a container
	// restored here is given; empty keeps the one its source used.
	RuncRoot string
	// CgroupParent is the cgroup restored containers live under.
	CgroupParent string
	// NetNS is the network namespace a restored container joins when its
	// source joined one by path that ferry does not rebuild.
	NetNS string
	// StateDir holds, per restored container, the CRIU configuration file
	// its spec names and its task's log.
	StateDir string
	// Admission is what this host accepts of an incoming spec.
	Admission admission.Policy
	// CNI is this host's CNI setup, for containers on a CNI network
	// (cni.go); the zero value is DefaultCNI.
	CNI CNI
	// Lazy says CRIU's lazy pages work here: a lazy dump at the source
	// (post-copy, hybrid, pre-copy's rebuild switchover) and a lazy
	// restore at the destination, which the shim's runc runs with the
	// options of the container's CRIU configuration file.
	Lazy bool

	conn runtime.Client[*client.Client]
}

var _ runtime.Runtime = (*Runtime)(nil)

// Kind is "containerd".
func (r *Runtime) Kind() string { return "containerd" }

// Caps: the task pauses without a dump and stays paused through ferry's
// runc dump; the shim's restore reads ferry's images in place, lazily
// where CRIU's lazy pages work, and leaves the processes stopped: both
// through the CRIU configuration file the spec names.
func (r *Runtime) Caps() runtime.Caps {
	return runtime.Caps{Freeze: true, LazyDump: r.Lazy, LazyRestore: r.Lazy, RestoreStopped: true, SmapsSnapshot: true}
}

func (r *Runtime) address() string {
	if r.Address == "" {
		return DefaultAddress
	}
	return r.Address
}

// Connect returns the client, dialled once.
func (r *Runtime) Connect() (*client.Client, error) {
	return r.conn.Get(func() (*client.Client, error) {
		if _, err := os.Stat(r.address()); err != nil {
			return nil, fmt.Errorf("containerd: no socket at %s (is containerd running? agent --containerd): %w", r.address(), err)
		}
		c, err := client.New(r.address(), client.WithTimeout(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("containerd at %s: %w", r.address(), err)
		}
		return c, nil
	})
}

// Close drops the connection to containerd.
func (r *Runtime) Close() error { return r.conn.Close() }

// SplitName returns a name's namespace and container ID: NS/ID, or ID in
// the default namespace.
func SplitName(name string) (ns, id string) {
	if ns, id, ok := strings.Cut(name, "/"); ok {
		return ns, id
	}
	return namespaces.Default, name
}

// JoinName is SplitName's inverse.
func JoinName(ns, id string) string {
	if ns == namespaces.Default {
		return id
	}
	return ns + "/" + id
}

func withNS(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}

// record is what the destination needs to create the container again.
type record struct {
	Namespace   string            `json:"namespace"`
	ID          string            `json:"id"`
	Image       string            `json:"image"`
	ImageDigest string            `json:"image_digest"`
	Snapshotter string            `json:"snapshotter"`
	Runtime     string            `json:"runtime"`
	OptionsType string            `json:"options_type,omitempty"`
	Options     []byte            `json:"options,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
}

func parseRecord(c *runtime.Container) (*record, error) {
	b := c.Meta[metaRecord]
	if len(b) == 0 {
		return nil, errors.New("containerd: the container's description carries no containerd record")
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("containerd: bad container record: %w", err)
	}
	if identifiers.Validate(rec.Namespace) != nil || identifiers.Validate(rec.ID) != nil {
		return nil, fmt.Errorf("containerd: bad namespace or ID in the record: %q/%q", rec.Namespace, rec.ID)
	}
	return &rec, nil
}

// runcOptions decodes the runtime options of the runc shim (nil when the
// container has none).
func runcOptions(typeURL string, value []byte) (any, error) {
	if typeURL == "" {
		return nil, nil
	}
	v, err := typeurl.UnmarshalAny(anyValue{typeURL, value})
	if err != nil {
		return nil, fmt.Errorf("containerd: runtime options of type %s: %w", typeURL, err)
	}
	return v, nil
}

// anyValue is a typed value as a record carries it.
type anyValue struct {
	typeURL string
	value   []byte
}

func (a anyValue) GetTypeUrl() string { return a.typeURL } //nolint:revive // typeurl.Any's name
func (a anyValue) GetValue() []byte   { return a.value }

// runcRoot is where runc keeps a container of namespace ns whose runtime
// options are opts.
func runcRoot(opts any, ns string) string {
	root := defaultRuncRoot
	if o, ok := opts.(*options.Options); ok && o.GetRoot() != "" {
		root = o.GetRoot()
	}
	return filepath.Join(root, ns)
}

// Inspect describes a container: its task's state and PID, its snapshot's
// upper directory, its image by name and digest, its record.
func (r *Runtime) Inspect(ctx context.Context, name string) (*runtime.Container, error) {
	ns, id := SplitName(name)
	if identifiers.Validate(ns) != nil || identifiers.Validate(id) != nil {
		return nil, fmt.Errorf("containerd: %q is no containerd name (NS/ID or ID): %w", name, runtime.ErrNotFound)
	}
	cl, err := r.Connect()
	if errors.Is(err, os.ErrNotExist) {
		// No daemon here, so none of its containers.
		return nil, fmt.Errorf("%w: %w", err, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, ns)
	ctr, err := cl.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("containerd (%s): no container %q in namespace %s: %w", r.address(), id, ns, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	info, err := ctr.Info(ctx)
	if err != nil {
		return nil, err
	}
	c := &runtime.Container{Runtime: r.Kind(), Name: JoinName(ns, id), ID: id, Status: "stopped"}
	if c.Spec, err = specJSON(info); err != nil {
		return nil, err
	}
	if c.Status, c.PID, err = taskState(ctx, ctr); err != nil {
		return nil, err
	}
	rec := record{Namespace: ns, ID: id, Image: info.Image, Snapshotter: info.Snapshotter, Runtime: info.Runtime.Name, Labels: info.Labels}
	if o := info.Runtime.Options; o != nil {
		rec.OptionsType, rec.Options = o.GetTypeUrl(), o.GetValue()
	}
	if c.Status == "stopped" {
		return c, nil
	}
	// What moves: the snapshot's upper directory, over an image the
	// destination must hold.
	if info.Image == "" || info.SnapshotKey == "" {
		return nil, fmt.Errorf("containerd container %q has no image or snapshot: ferry moves a container's own layer over its image", c.Name)
	}
	if info.Snapshotter != "overlayfs" {
		return nil, fmt.Errorf("containerd container %q uses the %q snapshotter: ferry moves the writable layer of overlayfs only", c.Name, info.Snapshotter)
	}
	img, err := cl.GetImage(ctx, info.Image)
	if err != nil {
		return nil, fmt.Errorf("containerd container %q: its image %s: %w", c.Name, info.Image, err)
	}
	rec.ImageDigest = img.Target().Digest.String()
	c.Image = info.Image + "@" + rec.ImageDigest
	if c.Rootfs, err = UpperDir(ctx, cl, info.Snapshotter, info.SnapshotKey); err != nil {
		return nil, fmt.Errorf("containerd container %q: %w", c.Name, err)
	}
	var s specs.Spec
	if err := json.Unmarshal(c.Spec, &s); err != nil {
		return nil, err
	}
	if s.Process != nil && s.Process.Terminal {
		return nil, fmt.Errorf("containerd container %q has a terminal: CRIU can restore it only as a shell job, which ferry does not move", c.Name)
	}
	n, err := cniNetwork(info.Labels, netnsPathOf(&s))
	if err != nil {
		return nil, fmt.Errorf("containerd container %q: %w", c.Name, err)
	}
	if n != nil {
		c.Networks = []runtime.Network{*n}
	}
	if c.Meta == nil {
		c.Meta = map[string][]byte{}
	}
	if c.Meta[metaRecord], err = json.Marshal(rec); err != nil {
		return nil, err
	}
	return c, nil
}

// specJSON is the container's OCI spec as JSON.
func specJSON(info containers.Container) ([]byte, error) {
	if info.Spec == nil {
		return nil, errors.New("containerd: the container has no spec")
	}
	var s specs.Spec
	if err := typeurl.UnmarshalTo(info.Spec, &s); err != nil {
		return nil, fmt.Errorf("containerd: the container's spec: %w", err)
	}
	return json.Marshal(&s)
}

// UpperDir is an overlayfs snapshot's writable directory.
func UpperDir(ctx context.Context, cl *client.Client, snapshotter, key string) (string, error) {
	ms, err := cl.SnapshotService(snapshotter).Mounts(ctx, key)
	if err != nil {
		return "", fmt.Errorf("its snapshot %s: %w", key, err)
	}
	for _, m := range ms {
		for _, o := range m.Options {
			if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
				return dir, nil
			}
		}
	}
	return "", fmt.Errorf("its snapshot %s has no writable layer (mounts %v)", key, ms)
}

// task loads a container's task.
func (r *Runtime) task(ctx context.Context, name string) (client.Task, context.Context, error) {
	ns, id := SplitName(name)
	cl, err := r.Connect()
	if err != nil {
		return nil, nil, err
	}
	ctx = withNS(ctx, ns)
	ctr, err := cl.LoadContainer(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	t, err := ctr.Task(ctx, nil)
	return t, ctx, err
}

// Freeze pauses the task: containerd knows the container is paused.
func (r *Runtime) Freeze(ctx context.Context, c *runtime.Container) error {
	t, ctx, err := r.task(ctx, c.Name)
	if err != nil {
		return err
	}
	return t.Pause(ctx)
}

// Thaw resumes the task. A CRIU killed mid-dump leaves the cgroup thawed
// while the shim still says paused, and runc then refuses to resume a
// container that is not paused: Thaw pauses it through runc first.
func (r *Runtime) Thaw(ctx context.Context, c *runtime.Container) error {
	t, tctx, err := r.task(ctx, c.Name)
	if err != nil {
		return err
	}
	err = t.Resume(tctx)
	if err == nil || !strings.Contains(err.Error(), "not paused") {
		return err
	}
	rc, rerr := r.RuncOf(tctx, c.Name)
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	_, id := SplitName(c.Name)
	if perr := rc.Pause(ctx, id); perr != nil {
		return errors.Join(err, perr)
	}
	return t.Resume(tctx)
}

// RuncOf is runc for a container's runc root, from its runtime options.
func (r *Runtime) RuncOf(ctx context.Context, name string) (runc.Host, error) {
	ns, id := SplitName(name)
	cl, err := r.Connect()
	if err != nil {
		return runc.Host{}, err
	}
	ctx = withNS(ctx, ns)
	ctr, err := cl.LoadContainer(ctx, id)
	if err != nil {
		return runc.Host{}, err
	}
	info, err := ctr.Info(ctx)
	if err != nil {
		return runc.Host{}, err
	}
	var opts any
	if o := info.Runtime.Options; o != nil {
		if opts, err = runcOptions(o.GetTypeUrl(), o.GetValue()); err != nil {
			return runc.Host{}, err
		}
	}
	return runc.Host{Root: runcRoot(opts, ns)}, nil
}

// Checkpoint dumps the paused task's container with ferry's runc
// checkpoint (see the package comment); it stays paused.
func (r *Runtime) Checkpoint(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions) (runtime.Dump, error) {
	if err := o.Refuse(r.Kind(), r.Caps()); err != nil {
		return nil, err
	}
	rec, err := parseRecord(c)
	if err != nil {
		return nil, err
	}
	if rec.Runtime != "io.containerd.runc.v2" && rec.Runtime != "io.containerd.runc.v1" {
		return nil, fmt.Errorf("containerd container %q runs under %q: ferry checkpoints containerd's runc shim only", c.Name, rec.Runtime)
	}
	opts, err := runcOptions(rec.OptionsType, rec.Options)
	if err != nil {
		return nil, err
	}
	rc := runc.Host{Root: runcRoot(opts, rec.Namespace)}
	if err := rc.RequirePaused(ctx, rec.ID, fmt.Sprintf("containerd container %q", c.Name), ""); err != nil {
		return nil, err
	}
	return rc.Dump(ctx, rec.ID, o)
}

// Remove kills and deletes the task, then the container and its
// snapshot; a container already gone counts as removed.
func (r *Runtime) Remove(ctx context.Context, c *runtime.Container) error {
	cl, err := r.Connect()
	if err != nil {
		return err
	}
	ns, id := SplitName(c.Name)
	ctx = withNS(ctx, ns)
	attached, err := r.cniAttachment(ctx, cl, id)
	if err != nil {
		return err
	}
	if err := removeContainer(ctx, cl, id); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if attached != nil {
		if err := r.detach(ctx, attached); err != nil {
			return err
		}
	}
	if r.StateDir != "" {
		_ = os.RemoveAll(r.containerDir(ns, id))
	}
	return nil
}

// cniAttachment is container id's attachment to a CNI network, if any.
func (r *Runtime) cniAttachment(ctx context.Context, cl *client.Client, id string) (*attachment, error) {
	ctr, err := cl.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	info, err := ctr.Info(ctx)
	if err != nil {
		return nil, err
	}
	name := info.Labels[LabelCNINetwork]
	if name == "" || info.Spec == nil {
		return nil, nil
	}
	var s specs.Spec
	if err := typeurl.UnmarshalTo(info.Spec, &s); err != nil {
		return nil, err
	}
	if netnsPathOf(&s) == "" {
		return nil, nil
	}
	ports, _ := ParsePorts(info.Labels[LabelCNIPorts]) // what Inspect accepted
	return &attachment{network: name, id: id, netns: netnsPathOf(&s), ports: ports}, nil
}

// removeContainer deletes a container of ctx's namespace, its task
// killed first.
func removeContainer(ctx context.Context, cl *client.Client, id string) error {
	ctr, err := cl.LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	if t, err := ctr.Task(ctx, nil); err == nil {
		if err := killTask(ctx, t); err != nil {
			return err
		}
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	return ctr.Delete(ctx, client.WithSnapshotCleanup)
}

// killTask kills every process of a task (a paused one too) and deletes
// it once its init has exited.
func killTask(ctx context.Context, t client.Task) error {
	exited, err := t.Wait(ctx)
	if err != nil {
		return err
	}
	st, err := t.Status(ctx)
	if err != nil {
		return err
	}
	if st.Status != client.Stopped && st.Status != client.Created {
		if err := t.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if st.Status == client.Paused {
			// SIGKILL is delivered to frozen processes once they thaw.
			_ = t.Resume(ctx)
		}
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			return fmt.Errorf("task %s did not exit 20 s after SIGKILL", t.ID())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_, err = t.Delete(ctx, client.WithProcessKill)
	return err
}

// containerDir holds a restored container's CRIU configuration and log.
func (r *Runtime) containerDir(ns, id string) string {
	return filepath.Join(r.StateDir, ns, id)
}

// taskState is a container's status (running, paused or stopped) and, not
// stopped, its task's PID.
func taskState(ctx context.Context, ctr client.Container) (string, int, error) {
	task, err := ctr.Task(ctx, nil)
	switch {
	case errdefs.IsNotFound(err):
		return "stopped", 0, nil
	case err != nil:
		return "", 0, err
	}
	st, err := task.Status(ctx)
	if err != nil {
		return "", 0, err
	}
	switch st.Status {
	case client.Running:
		return "running", int(task.Pid()), nil
	case client.Paused, client.Pausing:
		return "paused", int(task.Pid()), nil
	}
	return "stopped", 0, nil
}

// criNamespace is the kubelet's namespace, whose containers runtime
// kubernetes lists and moves.
const criNamespace = "k8s.io"

// List lists the containers of every namespace but the kubelet's.
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	cl, err := r.Connect()
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no daemon here, so none of its containers
	}
	if err != nil {
		return nil, err
	}
	nss, err := cl.NamespaceService().List(ctx)
	if err != nil {
		return nil, err
	}
	var out []runtime.Container
	for _, ns := range nss {
		if ns == criNamespace {
			continue
		}
		cs, err := r.ListNamespace(ctx, ns)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// ListNamespace lists one namespace's containers that match filters
// (containerd's container filters), named as Inspect takes them.
func (r *Runtime) ListNamespace(ctx context.Context, ns string, filters ...string) ([]runtime.Container, error) {
	cl, err := r.Connect()
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, ns)
	ctrs, err := cl.Containers(ctx, filters...)
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Container, 0, len(ctrs))
	for _, ctr := range ctrs {
		st, pid, err := taskState(ctx, ctr)
		if errdefs.IsNotFound(err) {
			continue // removed since
		}
		if err != nil {
			return nil, err
		}
		out = append(out, runtime.Container{Runtime: r.Kind(), Name: JoinName(ns, ctr.ID()), ID: ctr.ID(), Status: st, PID: pid})
	}
	return out, nil
}

package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Prepare creates the container here from the source's record, with a
// new snapshot of its image and no task (see the package comment). It
// refuses first, with nothing created, what cannot work here: another
// runtime's container, a spec this host's admission policy refuses, a
// missing image or one of another digest, a taken ID.
func (r *Runtime) Prepare(ctx context.Context, c *runtime.Container, o runtime.PrepareOptions) (runtime.Target, error) {
	if c.Runtime != r.Kind() {
		return nil, fmt.Errorf("containerd cannot receive a %s container", c.Runtime)
	}
	rec, err := parseRecord(c)
	if err != nil {
		return nil, err
	}
	if r.StateDir == "" {
		return nil, errors.New("containerd: this agent has no state directory for restored containers")
	}
	if err := r.Admission.CheckSpec(c.Spec); err != nil {
		return nil, err
	}
	opts, err := runcOptions(rec.OptionsType, rec.Options)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &options.Options{}
	}
	ro, ok := opts.(*options.Options)
	if !ok {
		return nil, fmt.Errorf("containerd: runtime options of type %s: ferry restores under the runc shim only", rec.OptionsType)
	}
	if r.RuncRoot != "" {
		ro.Root = r.RuncRoot
	}
	cl, err := r.Connect()
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, rec.Namespace)
	img, err := cl.GetImage(ctx, rec.Image)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("containerd (%s) has no image %s in namespace %s: ferry moves only the container's own layer; pull or import the same image here first",
			r.address(), rec.Image, rec.Namespace)
	}
	if err != nil {
		return nil, err
	}
	if got := img.Target().Digest.String(); got != rec.ImageDigest {
		return nil, fmt.Errorf("containerd (%s): image %s is %s here, %s at the source: ferry moves only the container's own layer over the same image",
			r.address(), rec.Image, got, rec.ImageDigest)
	}
	if _, err := cl.LoadContainer(ctx, rec.ID); err == nil {
		return nil, fmt.Errorf("containerd (%s) already has a container %q in namespace %s: remove it before moving this one here", r.address(), rec.ID, rec.Namespace)
	} else if !errdefs.IsNotFound(err) {
		return nil, err
	}
	if ok, err := img.IsUnpacked(ctx, rec.Snapshotter); err != nil {
		return nil, err
	} else if !ok {
		if err := img.Unpack(ctx, rec.Snapshotter); err != nil {
			return nil, fmt.Errorf("containerd: unpack %s: %w", rec.Image, err)
		}
	}
	t := &target{r: r, cl: cl, ns: rec.Namespace, id: rec.ID, runc: runc.Host{Root: runcRoot(ro, rec.Namespace)}}
	netns := o.NetNS
	if n := cniNetworkOf(c.Networks); n != nil {
		var got netip.Prefix
		ports, err := ParsePorts(rec.Labels[LabelCNIPorts])
		if err != nil {
			return nil, err
		}
		if other, port, err := portTaken(ctx, cl, ports); err != nil {
			return nil, err
		} else if other != "" {
			return nil, fmt.Errorf("containerd (%s): container %s publishes port %s here already: ferry does not take it over; move this one elsewhere or free the port", r.address(), other, port)
		}
		if t.cni, got, err = r.attach(ctx, *n, ports, rec.Namespace, rec.ID); err != nil {
			return nil, fmt.Errorf("containerd (%s): %w", r.address(), err)
		}
		netns = t.cni.netns
		if got.Addr().String() != n.Address {
			slog.Info("containerd: the container gets another address on its CNI network here", "container", c.Name, "network", n.Name, "source", n.Address, "here", got)
		}
	}
	spec, err := r.adaptSpec(c.Spec, rec, netns, t.criuConf())
	if err == nil {
		err = os.MkdirAll(t.dir(), 0o700)
	}
	if err != nil {
		_ = t.detach(ctx)
		return nil, err
	}
	ctr, err := cl.NewContainer(ctx, rec.ID,
		client.WithImageName(rec.Image),
		client.WithSnapshotter(rec.Snapshotter),
		client.WithNewSnapshot(rec.ID, img),
		client.WithRuntime(rec.Runtime, ro),
		client.WithContainerLabels(rec.Labels),
		client.WithSpec(spec))
	if err != nil {
		_ = os.RemoveAll(t.dir())
		_ = t.detach(ctx)
		if errdefs.IsAlreadyExists(err) {
			return nil, fmt.Errorf("containerd (%s) already has a container %q in namespace %s", r.address(), rec.ID, rec.Namespace)
		}
		return nil, fmt.Errorf("containerd: create %s: %w", c.Name, err)
	}
	t.ctr = ctr
	if t.upper, err = UpperDir(ctx, cl, rec.Snapshotter, rec.ID); err != nil {
		_ = t.Discard(ctx)
		return nil, err
	}
	return t, nil
}

// adaptSpec rewrites the source's spec for this host: its cgroup under
// this host's parent, the network namespace it joins here, ferry's CRIU
// configuration file.
func (r *Runtime) adaptSpec(b []byte, rec *record, netns, criuConf string) (*specs.Spec, error) {
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("containerd: the source sent a bad spec: %w", err)
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if r.CgroupParent != "" {
		s.Linux.CgroupsPath = "/" + r.CgroupParent + "/" + rec.Namespace + "-" + rec.ID
	}
	if netns == "" {
		netns = r.NetNS
	}
	if err := runc.JoinNetNS(&s, netns); err != nil {
		return nil, err
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[runc.CRIUConfigAnnotation] = criuConf
	return &s, nil
}

// target is a container created here, waiting for its task.
type target struct {
	r      *Runtime
	cl     *client.Client
	ns, id string
	ctr    client.Container
	upper  string
	runc   runc.Host
	pid    int // the restored task's, once restored
	// cni is its attachment to its CNI network here, if it has one.
	cni *attachment
}

func (t *target) dir() string       { return t.r.containerDir(t.ns, t.id) }
func (t *target) criuConf() string  { return filepath.Join(t.dir(), "criu.conf") }
func (t *target) RootfsDir() string { return t.upper }

// detach undoes the container's attachment to its CNI network, if any.
func (t *target) detach(ctx context.Context) error {
	if t.cni == nil {
		return nil
	}
	err := t.r.detach(ctx, t.cni)
	if err == nil {
		t.cni = nil
	}
	return err
}

// StateDir is where an agent whose state lives in agentState keeps its
// containerd containers' files (Runtime.StateDir).
func StateDir(agentState string) string { return filepath.Join(agentState, "containerd-tasks") }

// LogPath is where a restored container's task writes its output.
func (r *Runtime) LogPath(name string) string {
	ns, id := SplitName(name)
	return filepath.Join(r.containerDir(ns, id), "task.log")
}

// Restore creates the task from the images in place and starts it (the
// shim's runc restore), and returns once containerd reports it running.
func (t *target) Restore(ctx context.Context, o runtime.RestoreOptions) (int, error) {
	// The shim passes CRIU neither the TCP nor the lazy option: CRIU reads
	// them from the configuration file (the work directory, where a lazy
	// restore finds the lazy-pages daemon's socket, the shim does pass).
	conf := runc.CRIUConfig{LeaveStopped: true, TCPEstablished: o.TCPEstablished, TCPClose: o.TCPClose, LazyPages: o.Lazy}.WithYard(o.WorkDir)
	if err := conf.Write(t.criuConf()); err != nil {
		return 0, err
	}
	ctx = withNS(ctx, t.ns)
	task, err := t.ctr.NewTask(ctx, cio.LogFile(t.r.LogPath(JoinName(t.ns, t.id))),
		client.WithRestoreImagePath(o.ImagesDir), client.WithRestoreWorkPath(o.WorkDir))
	if err == nil {
		err = task.Start(ctx)
	}
	// Read by now: later dumps of this container must not leave it
	// stopped.
	_ = runc.ClearCRIUConfig(t.criuConf())
	if err != nil {
		return 0, fmt.Errorf("containerd: restore %s: %w", JoinName(t.ns, t.id), err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := task.Status(ctx)
		if err != nil {
			return 0, err
		}
		if st.Status == client.Running {
			t.pid = int(task.Pid())
			return t.pid, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("containerd: the restored task is %s, not running", st.Status)
		}
	}
}

// Start continues the processes CRIU left stopped.
func (t *target) Start(ctx context.Context) error { return t.runc.ContinueRestored(ctx, t.id, t.pid) }

// Continue sends every process of a container restored here SIGCONT.
func (r *Runtime) Continue(ctx context.Context, c *runtime.Container) error {
	rc, err := r.RuncOf(ctx, c.Name)
	if err != nil {
		return err
	}
	return rc.ContinueAll(ctx, c.ID)
}

// Discard deletes the task, the container and its snapshot, and the
// cgroup a restore whose CRIU was killed may have left.
func (t *target) Discard(ctx context.Context) error {
	if err := removeContainer(withNS(ctx, t.ns), t.cl, t.id); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if err := t.detach(ctx); err != nil {
		return err
	}
	if t.r.CgroupParent != "" {
		if err := cgroups.Destroy(cgroups.Root, "/"+t.r.CgroupParent+"/"+t.ns+"-"+t.id); err != nil {
			return err
		}
	}
	_ = os.RemoveAll(t.dir())
	return nil
}

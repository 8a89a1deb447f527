package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// Daemon is a containerd of ferry's own whose state lives under one
// directory: each lab host runs one, and so do the tests, beside (never
// instead of) the machine's own. Its shims keep their runc state under
// RuncRoot, given to every container made through it (WithRuntime's
// options), so two daemons on one machine never share a container ID.
type Daemon struct {
	// Dir holds the configuration, the socket, content, snapshots, the
	// shims' bundles and the log.
	Dir string
	// NetNS, when set, is the network namespace (a path) the daemon and
	// its shims run in.
	NetNS string
}

// Socket is the daemon's gRPC address.
func (d Daemon) Socket() string { return filepath.Join(d.Dir, "containerd.sock") }

// RuncRoot is the runc root its containers use (runc adds the namespace).
func (d Daemon) RuncRoot() string { return filepath.Join(d.Dir, "runc") }

func (d Daemon) pidFile() string { return filepath.Join(d.Dir, "containerd.pid") }
func (d Daemon) logFile() string { return filepath.Join(d.Dir, "containerd.log") }

// config is the daemon's configuration (containerd 1.6's version 2): its
// own root, state and sockets; Kubernetes' CRI plugin off (ferry does not
// use it, and it wants a CNI setup).
func (d Daemon) config() string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %q

[ttrpc]
  address = %q
`, filepath.Join(d.Dir, "root"), filepath.Join(d.Dir, "state"), d.Socket(), d.Socket()+".ttrpc")
}

// PID is the running daemon's PID, 0 if none runs.
func (d Daemon) PID() int { return procs.FromPIDFile(d.pidFile(), "containerd") }

// Start runs the daemon unless it runs already, and returns once it
// answers.
func (d Daemon) Start(ctx context.Context) error {
	if pid := d.PID(); pid != 0 {
		return procs.Started{PID: pid}.AwaitReady(ctx, 10*time.Second, 100*time.Millisecond, d.ping)
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return errors.New("containerd is not installed (apt-get install containerd)")
	}
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return err
	}
	conf := filepath.Join(d.Dir, "config.toml")
	if err := os.WriteFile(conf, []byte(d.config()), 0o600); err != nil {
		return err
	}
	// It outlives the process that started it (the lab's command).
	p, err := procs.StartDetached([]string{bin, "--config", conf}, d.NetNS, d.logFile(), nil)
	if err != nil {
		return err
	}
	if err := os.WriteFile(d.pidFile(), []byte(strconv.Itoa(p.PID)), 0o600); err != nil {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
		return err
	}
	if err := p.AwaitReady(ctx, 20*time.Second, 100*time.Millisecond, d.ping); err != nil {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
		b, _ := os.ReadFile(d.logFile())
		return fmt.Errorf("containerd (%s) did not start: %w: %s", d.Dir, err, tail.Lines(string(b), 6))
	}
	return nil
}

func (d Daemon) ping(ctx context.Context) error {
	if _, err := os.Stat(d.Socket()); err != nil {
		return err
	}
	c, err := client.New(d.Socket(), client.WithTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	ok, err := c.IsServing(ctx)
	if err == nil && !ok {
		err = errors.New("not serving")
	}
	return err
}

// Stop kills every container's task, deletes the containers and their
// snapshots in every namespace, stops the daemon (by its PID) and detaches
// what it left mounted under Dir. The directory itself stays.
func (d Daemon) Stop(ctx context.Context) error {
	pid := d.PID()
	if pid == 0 {
		return mounts.UnmountUnder(d.Dir)
	}
	var errs []error
	if err := d.ping(ctx); err == nil {
		errs = append(errs, d.deleteAll(ctx))
	}
	errs = append(errs, procs.Terminate([]int{pid}, 10*time.Second))
	_ = os.Remove(d.pidFile())
	errs = append(errs, mounts.UnmountUnder(d.Dir))
	return errors.Join(errs...)
}

// deleteAll removes every container the daemon has, with its task.
func (d Daemon) deleteAll(ctx context.Context) error {
	c, err := client.New(d.Socket())
	if err != nil {
		return err
	}
	defer c.Close()
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		ctrs, err := c.Containers(withNS(ctx, ns))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, ctr := range ctrs {
			if err := removeContainer(withNS(ctx, ns), c, ctr.ID()); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// RunOptions describe a container Run starts.
type RunOptions struct {
	// Namespace, ID and Image (a reference this daemon holds) name it.
	Namespace, ID, Image string
	// Args is the command.
	Args []string
	// NetNS is a network namespace (a path) it joins; "" makes its own.
	NetNS string
	// CgroupsPath is its cgroup; "" is containerd's default.
	CgroupsPath string
	// Log receives its output.
	Log string
	// Labels are the container's.
	Labels map[string]string
}

// Run creates a container from an image and starts its task, under the
// daemon's runc root, as `ctr run -d` would.
func (d Daemon) Run(ctx context.Context, o RunOptions) error {
	c, err := client.New(d.Socket())
	if err != nil {
		return err
	}
	defer c.Close()
	if o.Namespace == "" {
		o.Namespace = namespaces.Default
	}
	ctx = withNS(ctx, o.Namespace)
	img, err := c.GetImage(ctx, o.Image)
	if err != nil {
		return fmt.Errorf("containerd (%s): image %s: %w", d.Dir, o.Image, err)
	}
	specOpts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs(o.Args...)}
	if o.NetNS != "" {
		specOpts = append(specOpts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: o.NetNS}))
	}
	if o.CgroupsPath != "" {
		specOpts = append(specOpts, oci.WithCgroup(o.CgroupsPath))
	}
	ctr, err := c.NewContainer(ctx, o.ID, client.WithImage(img), client.WithSnapshotter("overlayfs"),
		client.WithNewSnapshot(o.ID, img), client.WithRuntime("io.containerd.runc.v2", &options.Options{Root: d.RuncRoot()}),
		client.WithNewSpec(specOpts...), client.WithContainerLabels(o.Labels))
	if err != nil {
		return fmt.Errorf("containerd (%s): create %s: %w", d.Dir, o.ID, err)
	}
	creator := cio.NullIO
	if o.Log != "" {
		creator = cio.LogFile(o.Log)
	}
	task, err := ctr.NewTask(ctx, creator)
	if err == nil {
		if err = task.Start(ctx); err != nil {
			_, _ = task.Delete(ctx, client.WithProcessKill)
		}
	}
	if err != nil {
		_ = ctr.Delete(ctx, client.WithSnapshotCleanup)
		return fmt.Errorf("containerd (%s): start %s: %w", d.Dir, o.ID, err)
	}
	return nil
}

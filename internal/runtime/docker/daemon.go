package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/docker/go-connections/nat"

	"github.com/ferry-migrate/ferry/internal/imagearchive"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// Daemon is a dockerd of ferry's own whose state lives under one
// directory (data root, exec root, socket, its containerd's unpacked
// checkpoints): each lab host runs one, beside (never instead of) the
// machine's own. It runs with experimental features (checkpoint restore
// needs them) and ferry's StoppedRuntime. With NetNS set it has its own
// default bridge and firewall rules there (published ports), as any
// dockerd has, and forwarding on without changing the namespace's
// forwarding policy (the lab's segment is bridged there too).
type Daemon struct {
	Dir string
	// NetNS, when set, is the network namespace (a path) the daemon, and
	// so its host-network containers, run in.
	NetNS string
}

// Host is the daemon's address for the client.
func (d Daemon) Host() string { return "unix://" + d.socket() }

// ExecRoot is its --exec-root.
func (d Daemon) ExecRoot() string { return filepath.Join(d.Dir, "exec") }

func (d Daemon) socket() string  { return filepath.Join(d.Dir, "docker.sock") }
func (d Daemon) pidFile() string { return filepath.Join(d.Dir, "docker.pid") }
func (d Daemon) logFile() string { return filepath.Join(d.Dir, "dockerd.log") }

// PID is the running daemon's PID, 0 if none runs.
func (d Daemon) PID() int { return procs.FromPIDFile(d.pidFile(), "dockerd") }

// Start runs the daemon unless it runs already, and returns once it
// answers.
func (d Daemon) Start(ctx context.Context) error {
	if pid := d.PID(); pid != 0 {
		return procs.Started{PID: pid}.AwaitReady(ctx, 20*time.Second, 200*time.Millisecond, d.ping)
	}
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		return errors.New("dockerd is not installed (apt-get install docker.io)")
	}
	xdg := filepath.Join(d.Dir, "xdg")
	if err := os.MkdirAll(xdg, 0o700); err != nil {
		return err
	}
	wrapper := filepath.Join(d.Dir, "ferry-runc")
	if err := os.WriteFile(wrapper, Wrapper, 0o755); err != nil {
		return err
	}
	args := []string{bin, "--experimental", "--ip6tables=false"}
	if d.NetNS != "" {
		// dockerd that turns forwarding on itself also sets the FORWARD
		// policy to DROP, which would drop the lab segment's bridged
		// traffic in this namespace.
		if out, err := exec.CommandContext(ctx, "nsenter", "--net="+d.NetNS, "--", "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
			return fmt.Errorf("forwarding in %s: %v: %s", d.NetNS, err, out)
		}
		args = append(args, "--ip-forward=false")
	} else {
		// On the machine's own network: no bridge, no firewall rules.
		args = append(args, "--iptables=false", "--ip-masq=false", "--bridge=none")
	}
	args = append(args, "--data-root", filepath.Join(d.Dir, "data"), "--exec-root", d.ExecRoot(), "--pidfile", d.pidFile(), "-H", d.Host(),
		"--add-runtime", StoppedRuntime+"="+wrapper)
	// Its containerd keeps the checkpoints it unpacks under xdg; its
	// shims' runc finds a CRIU ferry built in /usr/local/sbin.
	p, err := procs.StartDetached(args, d.NetNS, d.logFile(),
		[]string{"XDG_RUNTIME_DIR=" + xdg, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
	if err != nil {
		return err
	}
	if err := p.AwaitReady(ctx, 60*time.Second, 200*time.Millisecond, d.ping); err != nil {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
		b, _ := os.ReadFile(d.logFile())
		return fmt.Errorf("dockerd (%s) did not start: %w: %s", d.Dir, err, tail.Lines(string(b), 6))
	}
	return nil
}

func (d Daemon) ping(ctx context.Context) error {
	if _, err := os.Stat(d.socket()); err != nil {
		return err
	}
	c, err := client.NewClientWithOpts(client.WithHost(d.Host()), client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Ping(ctx)
	return err
}

// Stop removes every container, stops the daemon (by its PID; its
// containerd goes with it) and detaches what it left mounted under Dir.
func (d Daemon) Stop(ctx context.Context) error {
	pid := d.PID()
	if pid == 0 {
		return mounts.UnmountUnder(d.Dir)
	}
	var errs []error
	if c, err := client.NewClientWithOpts(client.WithHost(d.Host()), client.WithAPIVersionNegotiation()); err == nil {
		if cs, err := c.ContainerList(ctx, container.ListOptions{All: true}); err == nil {
			for _, ct := range cs {
				errs = append(errs, c.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true}))
			}
		}
		_ = c.Close()
	}
	errs = append(errs, procs.Terminate([]int{pid}, 20*time.Second))
	errs = append(errs, mounts.UnmountUnder(d.Dir))
	return errors.Join(errs...)
}

// ImportRootfs packs rootfsDir as a one-layer image tagged tag and loads
// it into the daemon; the same directory gives the same image ID on every
// host (imagearchive).
func (d Daemon) ImportRootfs(ctx context.Context, rootfsDir, tag string) error {
	tmp, err := os.MkdirTemp("", "ferry-docker-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	archive := filepath.Join(tmp, "image.tar")
	if _, err := imagearchive.FromDir(ctx, rootfsDir, archive, tag); err != nil {
		return err
	}
	c, err := client.NewClientWithOpts(client.WithHost(d.Host()), client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer c.Close()
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	resp, err := c.ImageLoad(ctx, f, client.ImageLoadWithQuiet(true))
	if err != nil {
		return fmt.Errorf("docker: load %s: %w", tag, err)
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// RunOptions say how Run starts a container.
type RunOptions struct {
	Name, Image string
	Args        []string
	// Bridge puts it on the daemon's default bridge, publishing Ports
	// (PORT/PROTO, published on the same host port); otherwise it runs on
	// the host's network (the daemon's namespace).
	Bridge bool
	Ports  []string
	// Volumes mount named volumes: NAME -> path in the container.
	Volumes map[string]string
}

// Run starts a container, detached, as `docker run -d` would.
func (d Daemon) Run(ctx context.Context, o RunOptions) error {
	c, err := client.NewClientWithOpts(client.WithHost(d.Host()), client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer c.Close()
	hc := &container.HostConfig{NetworkMode: "host"}
	cfg := &container.Config{Image: o.Image, Cmd: o.Args}
	if o.Bridge {
		hc.NetworkMode = "bridge"
		exposed, bindings, err := nat.ParsePortSpecs(o.Ports)
		if err != nil {
			return err
		}
		for p := range bindings {
			bindings[p] = []nat.PortBinding{{HostPort: p.Port()}}
		}
		cfg.ExposedPorts, hc.PortBindings = exposed, bindings
	}
	for name, path := range o.Volumes {
		hc.Binds = append(hc.Binds, name+":"+path)
	}
	resp, err := c.ContainerCreate(ctx, cfg, hc, nil, nil, o.Name)
	if err != nil {
		return fmt.Errorf("docker (%s): create %s: %w", d.Dir, o.Name, err)
	}
	if err := c.ContainerStart(ctx, resp.ID, container.StartOptions{}); err != nil {
		_ = c.ContainerRemove(ctx, resp.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		return fmt.Errorf("docker (%s): start %s: %w", d.Dir, o.Name, err)
	}
	return nil
}

package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/lxc"
	"github.com/ferry-migrate/ferry/internal/runtime/podman"
)

// Lab containers under Podman and LXC: each lab host has a Podman instance
// and an lxcpath of its own (PodmanDir, LXCPath), which its agent uses.

// Podman is the host's own Podman instance.
func (h *Host) Podman() podman.Host { return podman.Host{Dir: h.PodmanDir(), NetNS: h.NetNS} }

// LXC is the host's LXC, its tools run in the host's network namespace
// (where the containers' monitors run).
func (h *Host) LXC() *lxc.Runtime {
	r := lxc.New(h.LXCPath())
	r.NetNS = h.NetNS
	return r
}

// workloadImage is the image lab Podman containers run: the busybox root
// filesystem with ferry's workloads.
const workloadImage = "ferry-workload"

// ImportWorkloadImage builds the busybox root filesystem with ferry's
// workloads and imports it into the Podman instances of the named hosts,
// with the same image ID on each (a restore needs the source's image).
func (l *Lab) ImportWorkloadImage(ctx context.Context, hostNames ...string) error {
	bin, err := l.ferryBin()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ferry-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := buildRootfs(filepath.Join(dir, "rootfs"), filepath.Dir(bin)); err != nil {
		return err
	}
	for _, n := range hostNames {
		h, err := l.Host(n)
		if err != nil {
			return err
		}
		if err := h.Podman().ImportRootfs(ctx, filepath.Join(dir, "rootfs"), workloadImage); err != nil {
			return fmt.Errorf("import the workload image on %s: %w", n, err)
		}
	}
	return nil
}

// RunPodman starts a container in the host's Podman from the workload
// image (ImportWorkloadImage), on the host's network.
func (l *Lab) RunPodman(ctx context.Context, hostName, container string, args []string) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	full := append([]string{"run", "--detach", "--name", container, "--network", "host",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pull", "never",
		"localhost/" + workloadImage + ":latest"}, args...)
	c := h.Podman().Command(ctx, full...)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("podman run %s on %s: %v: %s", container, h.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RunLXC starts an LXC container under the host's lxcpath with the busybox
// root filesystem, sharing the host's network namespace, running args.
func (l *Lab) RunLXC(ctx context.Context, hostName, container string, args []string) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	if !containerIDRe.MatchString(container) || container == "." || container == ".." {
		return fmt.Errorf("bad container name %q", container)
	}
	bin, err := l.ferryBin()
	if err != nil {
		return err
	}
	dir := filepath.Join(h.LXCPath(), container)
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("LXC container %q exists on %s", container, h.Name)
	}
	root := filepath.Join(dir, "rootfs")
	if err := buildRootfs(root, filepath.Dir(bin)); err != nil {
		return err
	}
	// Type none shares the namespace lxc-start runs in: the host's. CRIU
	// does not dump a namespace it shares, so the container joins the
	// destination host's on restore. No ttys: CRIU cannot dump them.
	cfg := fmt.Sprintf(`lxc.uts.name = %s
lxc.rootfs.path = dir:%s
lxc.net.0.type = none
lxc.tty.max = 0
lxc.pty.max = 1
lxc.autodev = 1
lxc.mount.auto = proc:mixed sys:ro
lxc.init.cmd = %s
lxc.signal.halt = SIGTERM
lxc.log.file = %s/lxc.log
lxc.log.level = INFO
`, container, root, strings.Join(args, " "), dir)
	if err := os.WriteFile(filepath.Join(dir, "config"), []byte(cfg), 0o640); err != nil {
		return err
	}
	c := h.Command(ctx, "lxc-start", "-P", h.LXCPath(), "-n", container)
	if out, err := c.CombinedOutput(); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "lxc.log"))
		_ = os.RemoveAll(dir)
		return fmt.Errorf("lxc-start %s on %s: %v: %s\n%s", container, h.Name, err, out, b)
	}
	return nil
}

// RunIn starts a workload container in a runtime of a lab host: runc (the
// lab's own bundles), podman or lxc.
func (l *Lab) RunIn(ctx context.Context, kind, hostName, container string, args []string) error {
	switch kind {
	case "", "runc":
		return l.Run(ctx, hostName, container, args)
	case "podman":
		return l.RunPodman(ctx, hostName, container, args)
	case "lxc":
		return l.RunLXC(ctx, hostName, container, args)
	}
	return fmt.Errorf("unknown runtime %q (runc, podman, lxc)", kind)
}

// RemoveFrom deletes a container from a runtime of a lab host, if there.
func (l *Lab) RemoveFrom(ctx context.Context, kind, hostName, container string) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	switch kind {
	case "", "runc":
		err := h.Runc().Delete(ctx, container)
		return errors.Join(err, mounts.RemoveAll(h.BundleDir(container)))
	case "podman":
		return h.Podman().Remove(ctx, container)
	case "lxc":
		return h.LXC().Remove(ctx, &runtime.Container{Name: container, ID: container})
	}
	return fmt.Errorf("unknown runtime %q", kind)
}

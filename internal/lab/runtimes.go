package lab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
	"github.com/ferry-migrate/ferry/internal/runtime/docker"
	"github.com/ferry-migrate/ferry/internal/runtime/lxc"
	"github.com/ferry-migrate/ferry/internal/runtime/podman"
)

// Lab containers under Podman, LXC and containerd: each lab host has a
// Podman instance, an lxcpath and a containerd daemon of its own
// (PodmanDir, LXCPath, Containerd), which its agent uses.

// Podman is the host's own Podman instance.
func (h *Host) Podman() podman.Host { return podman.Host{Dir: h.PodmanDir(), NetNS: h.NetNS} }

// LXC is the host's LXC, its tools run in the host's network namespace
// (where the containers' monitors run).
func (h *Host) LXC() *lxc.Runtime {
	r := lxc.New(h.LXCPath())
	r.NetNS = h.NetNS
	return r
}

// Containerd is the host's own containerd daemon, run in its network
// namespace (started by RunContainerd or ImportWorkloadImage).
func (h *Host) Containerd() containerd.Daemon {
	return containerd.Daemon{Dir: filepath.Join(h.StateDir, "containerd"), NetNS: h.NetNS}
}

// ContainerdRuntime is the adapter for the host's containerd daemon, as
// its agent sees it (Close it after use).
func (h *Host) ContainerdRuntime() *containerd.Runtime {
	d := h.Containerd()
	return &containerd.Runtime{Address: d.Socket(), RuncRoot: d.RuncRoot(), StateDir: containerd.StateDir(h.StateDir), CNI: h.CNI()}
}

// Docker is the host's own dockerd, run in its network namespace (started
// by RunDocker or ImportWorkloadImage).
func (h *Host) Docker() docker.Daemon {
	return docker.Daemon{Dir: filepath.Join(h.StateDir, "docker"), NetNS: h.NetNS}
}

// DockerRuntime is the adapter for the host's dockerd, as its agent sees
// it (Close it after use).
func (h *Host) DockerRuntime() *docker.Runtime {
	d := h.Docker()
	return &docker.Runtime{Host: d.Host(), ExecRoot: d.ExecRoot(), NetNS: h.NetNS}
}

// workloadImage is the image lab Podman and containerd containers run: the
// busybox root filesystem with ferry's workloads.
const workloadImage = "ferry-workload"

// workloadRef is workloadImage as containerd names it.
const workloadRef = "localhost/" + workloadImage + ":latest"

// NeedsImage says whether a runtime's lab containers run from an image
// that ImportWorkloadImage must load on both hosts first.
func NeedsImage(kind string) bool {
	return kind == "podman" || kind == "containerd" || kind == "docker"
}

// ImportWorkloadImage builds the busybox root filesystem with ferry's
// workloads and imports it into the named hosts' Podman instances or
// containerd daemons (kind), with the same image ID on each (a restore
// needs the source's image).
func (l *Lab) ImportWorkloadImage(ctx context.Context, kind string, hostNames ...string) error {
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
		switch kind {
		case "podman":
			err = h.Podman().ImportRootfs(ctx, filepath.Join(dir, "rootfs"), workloadImage)
		case "containerd":
			d := h.Containerd()
			if err = d.Start(ctx); err == nil {
				err = containerd.ImportRootfs(ctx, d.Socket(), namespaces.Default, filepath.Join(dir, "rootfs"), workloadRef)
			}
		case "docker":
			d := h.Docker()
			if err = d.Start(ctx); err == nil {
				err = d.ImportRootfs(ctx, filepath.Join(dir, "rootfs"), workloadRef)
			}
		default:
			err = fmt.Errorf("%s containers run from no image", kind)
		}
		if err != nil {
			return fmt.Errorf("import the workload image on %s: %w", n, err)
		}
	}
	return nil
}

// RunPodman starts a container in the host's Podman from the workload
// image (ImportWorkloadImage), on the host's network.
func (l *Lab) RunPodman(ctx context.Context, hostName, container string, args []string, a ...Attachments) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	full := []string{"run", "--detach", "--name", container, "--network", "host"}
	if len(a) > 0 {
		if a[0].Bridge {
			full = full[:len(full)-2]
			for _, p := range a[0].Ports {
				port, _, _ := strings.Cut(p, "/")
				full = append(full, "--publish", port+":"+p)
			}
		}
		if a[0].VolumePath != "" {
			full = append(full, "--volume", VolumeName(container)+":"+a[0].VolumePath)
		}
	}
	full = append(full, "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pull", "never",
		"localhost/"+workloadImage+":latest")
	full = append(full, args...)
	c := h.Podman().Command(ctx, full...)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("podman run %s on %s: %v: %s", container, h.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RunContainerd starts a container in the host's containerd (default
// namespace) from the workload image (ImportWorkloadImage), in the host's
// network namespace unless a says Bridge (then on the host's CNI network,
// CNINetwork), its cgroup under the host's parent.
func (l *Lab) RunContainerd(ctx context.Context, hostName, container string, args []string, a ...Attachments) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	d := h.Containerd()
	if err := d.Start(ctx); err != nil {
		return err
	}
	o := containerd.RunOptions{ID: container, Image: workloadRef, Args: args, NetNS: h.NetNS,
		CgroupsPath: "/" + h.CgroupParent + "/" + namespaces.Default + "-" + container, Log: filepath.Join(d.Dir, container+".log")}
	if len(a) > 0 && a[0].Bridge {
		want, _ := netip.ParseAddr(a[0].IP)
		o.Labels = map[string]string{containerd.LabelCNINetwork: CNINetwork}
		var label []string
		for _, p := range a[0].Ports { // PORT/PROTO, on the same host port
			port, proto, _ := strings.Cut(p, "/")
			label = append(label, port+":"+port+"/"+cmp.Or(proto, "tcp"))
		}
		ports, err := containerd.ParsePorts(strings.Join(label, ","))
		if err != nil {
			return err
		}
		if len(ports) > 0 {
			o.Labels[containerd.LabelCNIPorts] = strings.Join(label, ",")
		}
		if o.NetNS, _, err = h.attachCNI(ctx, container, want, ports); err != nil {
			return fmt.Errorf("%s on %s: %w", container, h.Name, err)
		}
	}
	return d.Run(ctx, o)
}

// Attachments put a lab container on its runtime's default bridge with
// Ports published (PORT/PROTO, on the same host port), and give it a
// named volume (VolumeName) at VolumePath (Docker and Podman); a
// containerd one on the host's CNI network (Bridge); or an LXC container
// on the lab's segment (IP).
type Attachments struct {
	Bridge     bool
	Ports      []string
	VolumePath string
	// Shared bind-mounts this directory (of SharedStorage) at /data in
	// an LXC container (an lxc.mount.entry).
	Shared string
	// IP puts an LXC container on a veth to the lab's segment bridge
	// (SegmentBridge) with this address, or with Bridge to its host's own
	// (HostBridge); with Bridge, a containerd one asks for it on the CNI
	// network.
	IP string
}

// RunDocker starts a container in the host's dockerd from the workload
// image (ImportWorkloadImage), on the host's network unless a says.
func (l *Lab) RunDocker(ctx context.Context, hostName, container string, args []string, a ...Attachments) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	d := h.Docker()
	if err := d.Start(ctx); err != nil {
		return err
	}
	ro := docker.RunOptions{Name: container, Image: workloadRef, Args: args}
	if len(a) > 0 {
		ro.Bridge, ro.Ports = a[0].Bridge, a[0].Ports
		if a[0].VolumePath != "" {
			ro.Volumes = map[string]string{VolumeName(container): a[0].VolumePath}
		}
	}
	return d.Run(ctx, ro)
}

// RunLXC starts an LXC container under the host's lxcpath with the busybox
// root filesystem, sharing the host's network namespace, running args.
func (l *Lab) RunLXC(ctx context.Context, hostName, container string, args []string, a ...Attachments) error {
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
%s
lxc.tty.max = 0
lxc.pty.max = 1
lxc.autodev = 1
lxc.mount.auto = proc:mixed sys:ro
lxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio
lxc.init.cmd = %s
lxc.signal.halt = SIGTERM
lxc.log.file = %s/lxc.log
lxc.log.level = INFO
%s`, container, root, lxcNet(a...), strings.Join(args, " "), dir, lxcMounts(a...))
	if err := os.WriteFile(filepath.Join(dir, "config"), []byte(cfg), 0o640); err != nil {
		return err
	}
	if err := h.LXC().Start(ctx, container); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "lxc.log"))
		_ = os.RemoveAll(dir)
		return fmt.Errorf("on %s: %w\n%s", h.Name, err, b)
	}
	return nil
}

// lxcMounts are an LXC container's mount entries: a.Shared at /data.
func lxcMounts(a ...Attachments) string {
	if len(a) == 0 || a[0].Shared == "" {
		return ""
	}
	return "lxc.mount.entry = " + a[0].Shared + " data none bind,create=dir 0 0\n"
}

// lxcNet is an LXC container's network: none (its host's), or a veth on
// the segment bridge, or with a.Bridge its host's own bridge, with a.IP.
func lxcNet(a ...Attachments) string {
	if len(a) == 0 || a[0].IP == "" {
		return "lxc.net.0.type = none"
	}
	bridge, prefix, gw := SegmentBridge, segmentPrefixLen, ""
	if a[0].Bridge {
		bridge, prefix = HostBridge, hostBridgePrefixLen
		gw = "\nlxc.net.0.ipv4.gateway = " + HostBridgeSubnet + "1"
	}
	ip := net.ParseIP(a[0].IP).To4()
	return fmt.Sprintf("lxc.net.0.type = veth\nlxc.net.0.link = %s\nlxc.net.0.flags = up\nlxc.net.0.ipv4.address = %s/%d%s\nlxc.net.0.hwaddr = 02:fe:%02x:%02x:%02x:%02x",
		bridge, a[0].IP, prefix, gw, ip[0], ip[1], ip[2], ip[3])
}

// RunIn starts a workload container in a runtime of a lab host: runc (the
// lab's own bundles), podman, lxc, containerd or docker.
func (l *Lab) RunIn(ctx context.Context, kind, hostName, container string, args []string) error {
	switch kind {
	case "", "runc":
		return l.Run(ctx, hostName, container, args)
	case "podman":
		return l.RunPodman(ctx, hostName, container, args)
	case "lxc":
		return l.RunLXC(ctx, hostName, container, args)
	case "containerd":
		return l.RunContainerd(ctx, hostName, container, args)
	case "docker":
		return l.RunDocker(ctx, hostName, container, args)
	}
	return fmt.Errorf("unknown runtime %q (runc, podman, lxc, containerd, docker)", kind)
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
		err := h.Podman().Remove(ctx, container)
		_ = h.Podman().Command(ctx, "volume", "rm", "--force", VolumeName(container)).Run()
		return err
	case "lxc":
		return h.LXC().Remove(ctx, &runtime.Container{Name: container, ID: container})
	case "containerd":
		if h.Containerd().PID() == 0 {
			return nil
		}
		r := h.ContainerdRuntime()
		defer r.Close()
		// In the host's namespace: a CNI network's plugins undo what they
		// did there (its bridge, its port forwarding).
		return cnet.Do(h.NetNS, func() error { return r.Remove(ctx, &runtime.Container{Name: container, ID: container}) })
	case "docker":
		if h.Docker().PID() == 0 {
			return nil
		}
		r := h.DockerRuntime()
		defer r.Close()
		return r.Remove(ctx, &runtime.Container{Name: container, Volumes: []runtime.Volume{{Name: VolumeName(container)}}})
	}
	return fmt.Errorf("unknown runtime %q", kind)
}

// VolumeName is the named volume a lab container keeps its data in, if
// it has one (removed with it by RemoveFrom).
func VolumeName(container string) string { return container + "-data" }

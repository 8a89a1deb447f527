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
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/kubelab"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
	"github.com/ferry-migrate/ferry/internal/runtime/docker"
	"github.com/ferry-migrate/ferry/internal/runtime/lxc"
	"github.com/ferry-migrate/ferry/internal/runtime/podman"
)

// Lab containers under Podman, LXC and containerd: each lab host has a
// Podman instance, an lxcpath and a containerd daemon of its own
// (PodmanDir, LXCPath, Containerd), which its agent uses.

// Runc is runc under the host's own root, where the lab's own containers
// run.
func (h *Host) Runc() runc.Host { return runc.Host{Root: h.RuncRoot()} }

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

// A Runtime is the lab's part of one kind of runtime (a
// runtime.Registration's Kind): each lab host has an instance of its own,
// named to the host's agent by AgentArgs, workloads run in it and go, and
// the bench reads their state and counts what the instance keeps of a
// container once it is gone. Every registered kind has one
// (TestEveryRegisteredKindHasALabRuntime): the lab and the bench know a
// runtime from here alone.
type Runtime struct {
	Kind string
	// Tool is the program this machine needs for the kind's lab
	// containers (make setup installs it); "": ferry's own setup has it.
	Tool string
	// AgentArgs are the agent's flags naming host h's instance; nil:
	// none.
	AgentArgs func(h *Host) []string
	// ImportImage loads the workload image, the root filesystem at
	// rootfs, into h's instance; nil: the kind's lab containers run from
	// no image.
	ImportImage func(ctx context.Context, h *Host, rootfs string) error
	// Run starts a workload container on the host named, attached as a
	// says where the kind can be (runc's take none here: RunWith has the
	// lab's own options for them); nil: the lab runs none of its own
	// (kubernetes: the cluster's pods, which `ferry-lab bench migrate
	// --runtime kubernetes` makes).
	Run func(l *Lab, ctx context.Context, hostName, container string, args []string, a ...Attachments) error
	// Remove deletes a container from h's instance, if there.
	Remove func(ctx context.Context, h *Host, container string) error
	// Inspect reads a container's state in h's instance; a container that
	// is not there is runtime.ErrNotFound or runc.ErrNotFound.
	Inspect func(ctx context.Context, h *Host, container string) (*runtime.Container, error)
	// Stored lists what h's instance keeps of its containers outside the
	// host's cgroup parent and scratch: a directory each.
	Stored func(h *Host) []string
	// Cgroups lists the cgroups the kind gives its containers outside a
	// host's cgroup parent, below one hierarchy's top (every lab host
	// shares the machine's), relative to it.
	Cgroups func(top string) []string
}

// runtimes are the lab's parts of the registered runtimes.
var runtimes = []Runtime{
	{
		Kind: "runc",
		AgentArgs: func(h *Host) []string {
			return []string{"--runc-root", h.RuncRoot(), "--image-root", DebianImageRoot()}
		},
		Run: func(l *Lab, ctx context.Context, hostName, container string, args []string, _ ...Attachments) error {
			return l.Run(ctx, hostName, container, args)
		},
		Remove: func(ctx context.Context, h *Host, container string) error {
			err := h.Runc().Delete(ctx, container)
			return errors.Join(err, mounts.RemoveAll(h.BundleDir(container)))
		},
		Inspect: func(ctx context.Context, h *Host, container string) (*runtime.Container, error) {
			st, err := h.Runc().State(ctx, container)
			if err != nil {
				return nil, err
			}
			return &runtime.Container{Status: st.Status, PID: st.Pid}, nil
		},
	},
	{
		Kind:      "podman",
		Tool:      "podman",
		AgentArgs: func(h *Host) []string { return []string{"--podman-dir", h.PodmanDir()} },
		ImportImage: func(ctx context.Context, h *Host, rootfs string) error {
			return h.Podman().ImportRootfs(ctx, rootfs, workloadImage)
		},
		Run: (*Lab).RunPodman,
		Remove: func(ctx context.Context, h *Host, container string) error {
			err := h.Podman().Remove(ctx, container)
			_ = h.Podman().Command(ctx, "volume", "rm", "--force", VolumeName(container)).Run()
			return err
		},
		Inspect: func(ctx context.Context, h *Host, container string) (*runtime.Container, error) {
			return podman.New(h.Podman()).Inspect(ctx, container)
		},
		// Its containers and their layers (overlay/l holds the layers'
		// short links, not a layer).
		Stored: func(h *Host) []string {
			storage := filepath.Join(h.PodmanDir(), "storage")
			return append(subdirs(nil, filepath.Join(storage, "overlay-containers")),
				subdirs(func(name string) bool { return name != "l" }, filepath.Join(storage, "overlay"))...)
		},
		// Its cgroupfs manager's layout: libpod_parent/libpod-ID (conmon's
		// is libpod_parent/conmon, shared).
		Cgroups: func(top string) []string {
			return relative(top, subdirs(func(name string) bool { return strings.HasPrefix(name, "libpod-") }, filepath.Join(top, "libpod_parent")))
		},
	},
	{
		Kind:      "lxc",
		Tool:      "lxc-checkpoint",
		AgentArgs: func(h *Host) []string { return []string{"--lxc-path", h.LXCPath()} },
		Run:       (*Lab).RunLXC,
		Remove: func(ctx context.Context, h *Host, container string) error {
			return h.LXC().Remove(ctx, &runtime.Container{Name: container, ID: container})
		},
		Inspect: func(ctx context.Context, h *Host, container string) (*runtime.Container, error) {
			return h.LXC().Inspect(ctx, container)
		},
		Stored: func(h *Host) []string { return subdirs(nil, h.LXCPath()) },
		// lxc.payload.NAME and lxc.monitor.NAME at the hierarchy's top,
		// with a suffix when the name was taken.
		Cgroups: func(top string) []string {
			return relative(top, subdirs(func(name string) bool {
				return strings.HasPrefix(name, "lxc.payload.") || strings.HasPrefix(name, "lxc.monitor.")
			}, top))
		},
	},
	{
		Kind: "containerd",
		Tool: "containerd",
		AgentArgs: func(h *Host) []string {
			return []string{"--containerd", h.Containerd().Socket(), "--containerd-runc-root", h.Containerd().RuncRoot(),
				"--cni-conf-dir", h.CNI().ConfDir, "--cni-cache-dir", h.CNI().CacheDir}
		},
		ImportImage: func(ctx context.Context, h *Host, rootfs string) error {
			d := h.Containerd()
			if err := d.Start(ctx); err != nil {
				return err
			}
			return containerd.ImportRootfs(ctx, d.Socket(), namespaces.Default, rootfs, workloadRef)
		},
		Run: (*Lab).RunContainerd,
		Remove: func(ctx context.Context, h *Host, container string) error {
			if h.Containerd().PID() == 0 {
				return nil
			}
			r := h.ContainerdRuntime()
			defer r.Close()
			// In the host's namespace: a CNI network's plugins undo what they
			// did there (its bridge, its port forwarding).
			return cnet.Do(h.NetNS, func() error { return r.Remove(ctx, &runtime.Container{Name: container, ID: container}) })
		},
		Inspect: inspectThrough((*Host).ContainerdRuntime),
		// Its snapshots (the image's too, there before), its shims'
		// bundles and ferry's files of its containers.
		Stored: func(h *Host) []string {
			dir := h.Containerd().Dir
			return subdirs(nil, filepath.Join(dir, "root", "io.containerd.snapshotter.v1.overlayfs", "snapshots"),
				filepath.Join(dir, "state", "io.containerd.runtime.v2.task", "default"),
				filepath.Join(containerd.StateDir(h.StateDir), "default"))
		},
	},
	{
		Kind: "docker",
		Tool: "dockerd",
		AgentArgs: func(h *Host) []string {
			return []string{"--docker", h.Docker().Host(), "--docker-exec-root", h.Docker().ExecRoot()}
		},
		ImportImage: func(ctx context.Context, h *Host, rootfs string) error {
			d := h.Docker()
			if err := d.Start(ctx); err != nil {
				return err
			}
			return d.ImportRootfs(ctx, rootfs, workloadRef)
		},
		Run: (*Lab).RunDocker,
		Remove: func(ctx context.Context, h *Host, container string) error {
			if h.Docker().PID() == 0 {
				return nil
			}
			r := h.DockerRuntime()
			defer r.Close()
			return r.Remove(ctx, &runtime.Container{Name: container, Volumes: []runtime.Volume{{Name: VolumeName(container)}}})
		},
		Inspect: inspectThrough((*Host).DockerRuntime),
		// Its containers and the checkpoints its containerd unpacked for
		// a restore.
		Stored: func(h *Host) []string {
			dir := h.Docker().Dir
			return subdirs(nil, filepath.Join(dir, "data", "containers"), filepath.Join(dir, "xdg"))
		},
		// Its cgroupfs layout: docker/ID.
		Cgroups: func(top string) []string { return relative(top, subdirs(nil, filepath.Join(top, "docker"))) },
	},
	{
		Kind: "kubernetes",
		// The cluster's nodes, whether it is up or not: the agent
		// connects at first use.
		AgentArgs: func(h *Host) []string {
			if h.Index > kubeNodes {
				return nil
			}
			return []string{"--kubernetes", kubelab.NodeSocket(KubeDir, h.Name), "--shim-dir", kubelab.NodeShimDir(KubeDir, h.Name)}
		},
	},
}

// Runtimes are the lab's parts of the registered runtimes, in the
// registry's order.
func Runtimes() []Runtime {
	var out []Runtime
	for _, kind := range all.Registry.Kinds() {
		if i := slices.IndexFunc(runtimes, func(rt Runtime) bool { return rt.Kind == kind }); i >= 0 {
			out = append(out, runtimes[i])
		}
	}
	return out
}

// RuntimeOf is the lab's part of kind ("" is runc, the lab's own).
func RuntimeOf(kind string) (Runtime, error) {
	kind = cmp.Or(kind, "runc")
	for _, rt := range Runtimes() {
		if rt.Kind == kind {
			return rt, nil
		}
	}
	return Runtime{}, fmt.Errorf("unknown runtime %q (one of %s)", kind, strings.Join(RunnableKinds(), ", "))
}

// RunnableKinds are the kinds the lab runs workload containers in (Run),
// in the registry's order.
func RunnableKinds() []string {
	var out []string
	for _, rt := range Runtimes() {
		if rt.Run != nil {
			out = append(out, rt.Kind)
		}
	}
	return out
}

// daemonClient is a runtime adapter that holds a connection to its daemon.
type daemonClient interface {
	Inspect(ctx context.Context, name string) (*runtime.Container, error)
	Close() error
}

// inspectThrough is Inspect through the adapter open makes, closed after.
func inspectThrough[C daemonClient](open func(h *Host) C) func(ctx context.Context, h *Host, container string) (*runtime.Container, error) {
	return func(ctx context.Context, h *Host, container string) (*runtime.Container, error) {
		r := open(h)
		defer r.Close()
		return r.Inspect(ctx, container)
	}
}

// subdirs lists the subdirectories of dirs whose names keep accepts (nil:
// all), as paths; a missing dir has none.
func subdirs(keep func(name string) bool, dirs ...string) []string {
	var out []string
	for _, dir := range dirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() && (keep == nil || keep(e.Name())) {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// relative is paths below top, relative to it.
func relative(top string, paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i], _ = filepath.Rel(top, p)
	}
	return out
}

// workloadImage is the image lab Podman and containerd containers run: the
// busybox root filesystem with ferry's workloads.
const workloadImage = "ferry-workload"

// workloadRef is workloadImage as containerd names it.
const workloadRef = "localhost/" + workloadImage + ":latest"

// NeedsImage says whether a runtime's lab containers run from an image
// that ImportWorkloadImage must load on both hosts first.
func NeedsImage(kind string) bool {
	rt, err := RuntimeOf(kind)
	return err == nil && rt.ImportImage != nil
}

// ImportWorkloadImage builds the busybox root filesystem with ferry's
// workloads and imports it into the named hosts' instances of kind
// (Podman, containerd, Docker), with the same image ID on each (a
// restore needs the source's image).
func (l *Lab) ImportWorkloadImage(ctx context.Context, kind string, hostNames ...string) error {
	rt, err := RuntimeOf(kind)
	if err != nil {
		return err
	}
	if rt.ImportImage == nil {
		return fmt.Errorf("%s containers run from no image", rt.Kind)
	}
	bin, err := l.ferryBin()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ferry-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rootfs := filepath.Join(dir, "rootfs")
	if err := buildRootfs(rootfs, filepath.Dir(bin)); err != nil {
		return err
	}
	for _, n := range hostNames {
		h, err := l.Host(n)
		if err != nil {
			return err
		}
		if err := rt.ImportImage(ctx, h, rootfs); err != nil {
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

// RunIn starts a workload container in a runtime of a lab host (see
// RunnableKinds; "" is runc), attached as a says where its runtime can
// (Attachments).
func (l *Lab) RunIn(ctx context.Context, kind, hostName, container string, args []string, a ...Attachments) error {
	rt, err := RuntimeOf(kind)
	if err != nil {
		return err
	}
	if rt.Run == nil {
		return fmt.Errorf("the lab runs no %s containers of its own (one of %s)", rt.Kind, strings.Join(RunnableKinds(), ", "))
	}
	return rt.Run(l, ctx, hostName, container, args, a...)
}

// RemoveFrom deletes a container from a runtime of a lab host, if there.
func (l *Lab) RemoveFrom(ctx context.Context, kind, hostName, container string) error {
	rt, err := RuntimeOf(kind)
	if err != nil {
		return err
	}
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	if rt.Remove == nil {
		return fmt.Errorf("the lab removes no %s containers", rt.Kind)
	}
	return rt.Remove(ctx, h, container)
}

// VolumeName is the named volume a lab container keeps its data in, if
// it has one (removed with it by RemoveFrom).
func VolumeName(container string) string { return container + "-data" }

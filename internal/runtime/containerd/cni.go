package containerd

// A containerd container on a CNI network. containerd itself makes no
// network: whoever runs the container (CRI, nerdctl, a script) makes a
// network namespace, attaches it with a CNI network configuration and has
// the container join it by path. ferry learns which network from the
// container's label LabelCNINetwork, and moves the container as it moves
// a Docker container on a bridge: the destination makes a namespace of
// its own and attaches it to its network of that name (refused before
// anything is frozen when it has none), asking for the same address
// (host-local's IP argument) and taking another where that one is taken;
// a bridge ends at its host, so established connections are restored
// closed while listening sockets move. The source detaches its namespace
// once its copy is removed.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// LabelCNINetwork names, on a container, the CNI network (a network
// configuration list's name) its network namespace is attached to, as
// interface cniIfName; LabelCNIPorts the ports published for it through
// the network's portmap plugin ("HOSTPORT:PORT/PROTO", comma-separated,
// PROTO tcp by default), published again at the destination.
const (
	LabelCNINetwork = "ferry.cni.network"
	LabelCNIPorts   = "ferry.cni.ports"
)

// PortMapping is a port published through CNI's portmap plugin (its
// portMappings capability).
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

// ParsePorts reads LabelCNIPorts' value.
func ParsePorts(v string) ([]PortMapping, error) {
	var out []PortMapping
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		ports, proto, _ := strings.Cut(f, "/")
		if proto == "" {
			proto = "tcp"
		}
		host, ctr, ok := strings.Cut(ports, ":")
		h, herr := strconv.Atoi(host)
		c, cerr := strconv.Atoi(ctr)
		if !ok || herr != nil || cerr != nil || h < 1 || h > 65535 || c < 1 || c > 65535 || (proto != "tcp" && proto != "udp" && proto != "sctp") {
			return nil, fmt.Errorf("%s: %q is not HOSTPORT:PORT[/tcp|udp|sctp]", LabelCNIPorts, f)
		}
		out = append(out, PortMapping{HostPort: h, ContainerPort: c, Protocol: proto})
	}
	return out, nil
}

// runtimeConf is libcni's description of container id's attachment, with
// its ports.
func runtimeConf(id, netnsPath string, ports []PortMapping) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: netnsPath, IfName: cniIfName}
	if len(ports) > 0 {
		rt.CapabilityArgs = map[string]any{"portMappings": ports}
	}
	return rt
}

// cniIfName is the container's interface on its CNI network.
const cniIfName = "eth0"

// CNI is where a host keeps its CNI setup.
type CNI struct {
	// ConfDir holds the network configuration lists, found by name.
	ConfDir string
	// BinDirs hold the plugins.
	BinDirs []string
	// CacheDir keeps libcni's record of each attachment ("": libcni's
	// default, /var/lib/cni).
	CacheDir string
}

// DefaultCNI is where CNI's own tools look.
var DefaultCNI = CNI{ConfDir: "/etc/cni/net.d", BinDirs: []string{"/opt/cni/bin", "/usr/lib/cni"}}

func (c CNI) config() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(c.BinDirs, c.CacheDir, nil)
}

// list loads network name's configuration list.
func (c CNI) list(name string) (*libcni.NetworkConfigList, error) {
	l, err := libcni.LoadNetworkConf(c.ConfDir, name)
	if err != nil {
		return nil, fmt.Errorf("no CNI network %q in %s: %w", name, c.ConfDir, err)
	}
	return l, nil
}

// Attach attaches the namespace at netnsPath, container id's, to network
// name, asking for address want (none: the network's choice) and taking
// the network's choice where want is taken, with ports published. It
// returns the address the container got.
func (c CNI) Attach(ctx context.Context, name, id, netnsPath string, want netip.Addr, ports []PortMapping) (netip.Prefix, error) {
	l, err := c.list(name)
	if err != nil {
		return netip.Prefix{}, err
	}
	rt := runtimeConf(id, netnsPath, ports)
	if want.IsValid() {
		asked := *rt
		asked.Args = [][2]string{{"IgnoreUnknown", "1"}, {"IP", want.String()}}
		if res, err := c.config().AddNetworkList(ctx, l, &asked); err == nil {
			return attached(res, ports)
		}
		// Taken (or the network lets none be chosen): what the failed
		// attempt made goes, and the network chooses.
		_ = c.config().DelNetworkList(ctx, l, &asked)
	}
	res, err := c.config().AddNetworkList(ctx, l, rt)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("CNI network %q: %w", name, err)
	}
	return attached(res, ports)
}

// attached is the address of a new attachment, once the host forgets the
// UDP flows to its ports it tracked before they were published: those
// would bypass the new forwarding rules (a client that sent to the port
// before, the same flow, would never reach the container), and portmap
// 1.1 leaves them. Docker does the same when it publishes a UDP port.
func attached(res types.Result, ports []PortMapping) (netip.Prefix, error) {
	for _, p := range ports {
		if p.Protocol != "udp" {
			continue
		}
		f := &netlink.ConntrackFilter{}
		if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return netip.Prefix{}, err
		}
		if err := f.AddPort(netlink.ConntrackOrigDstPort, uint16(p.HostPort)); err != nil {
			return netip.Prefix{}, err
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
			return netip.Prefix{}, fmt.Errorf("forgetting the UDP flows to port %d: %w", p.HostPort, err)
		}
	}
	return addressOf(res)
}

// Detach undoes Attach: the network takes its address back, and its
// ports.
func (c CNI) Detach(ctx context.Context, name, id, netnsPath string, ports []PortMapping) error {
	l, err := c.list(name)
	if err != nil {
		return err
	}
	return c.config().DelNetworkList(ctx, l, runtimeConf(id, netnsPath, ports))
}

// addressOf is the first IPv4 address of a CNI result.
func addressOf(res types.Result) (netip.Prefix, error) {
	r, err := types100.GetResult(res)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, ip := range r.IPs {
		if p, ok := netip.AddrFromSlice(ip.Address.IP.To4()); ok {
			ones, _ := ip.Address.Mask.Size()
			return netip.PrefixFrom(p, ones), nil
		}
	}
	return netip.Prefix{}, errors.New("the CNI network gave no IPv4 address")
}

// NewNetNS makes a network namespace pinned at path (a bind mount of it),
// which lives until RemoveNetNS.
func NewNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread moves to the new namespace and stays locked: it ends
		// with this goroutine, never serving another.
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("network namespace at %s: %w", path, err)
	}
	return nil
}

// RemoveNetNS unpins a namespace NewNetNS made.
func RemoveNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// cniNetwork is what a container on a CNI network (labels) whose
// namespace is netnsPath has there: its address and subnet.
func cniNetwork(labels map[string]string, netnsPath string) (*runtime.Network, error) {
	name := labels[LabelCNINetwork]
	if name == "" {
		return nil, nil
	}
	ports, err := ParsePorts(labels[LabelCNIPorts])
	if err != nil {
		return nil, err
	}
	if netnsPath == "" {
		return nil, fmt.Errorf("the container is labelled %s=%s but joins no network namespace by path", LabelCNINetwork, name)
	}
	h, err := cnet.NetlinkIn(netnsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(cniIfName)
	if err != nil {
		return nil, fmt.Errorf("its %s on CNI network %q: %w", cniIfName, name, err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		return nil, fmt.Errorf("its %s on CNI network %q has no IPv4 address (%v)", cniIfName, name, err)
	}
	ones, _ := addrs[0].Mask.Size()
	subnet := &net.IPNet{IP: addrs[0].IP.Mask(addrs[0].Mask), Mask: addrs[0].Mask}
	n := &runtime.Network{Name: name, Driver: "cni", Address: addrs[0].IP.String(), Subnet: fmt.Sprintf("%s/%d", subnet.IP, ones), HostLocal: true}
	for _, p := range ports {
		n.Ports = append(n.Ports, runtime.PublishedPort("", strconv.Itoa(p.HostPort), fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol)))
	}
	return n, nil
}

// netnsPathOf is the network namespace a spec joins by path ("": its own,
// or none).
func netnsPathOf(s *specs.Spec) string {
	if s.Linux == nil {
		return ""
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// ownNetNS says whether path is a namespace this runtime pinned (under
// dir): the one it removes with its container.
func ownNetNS(dir, path string) bool {
	return dir != "" && strings.HasPrefix(filepath.Clean(path), filepath.Clean(dir)+"/")
}

// attachment is a container's namespace attached to a CNI network.
type attachment struct {
	network, id, netns string
	ports              []PortMapping
}

// cni is the host's CNI setup (Runtime.CNI, or DefaultCNI).
func (r *Runtime) cni() CNI {
	c := r.CNI
	if c.ConfDir == "" {
		c.ConfDir = DefaultCNI.ConfDir
	}
	if len(c.BinDirs) == 0 {
		c.BinDirs = DefaultCNI.BinDirs
	}
	return c
}

// NetNSDir is where the runtime pins the network namespaces it makes for
// containers on a CNI network (and removes them with the container).
func (r *Runtime) NetNSDir() string { return filepath.Join(r.StateDir, "netns") }

// attach makes container ns/id a network namespace on this host's CNI
// network n.Name, asking for n's address.
func (r *Runtime) attach(ctx context.Context, n runtime.Network, ports []PortMapping, ns, id string) (*attachment, netip.Prefix, error) {
	if r.StateDir == "" {
		return nil, netip.Prefix{}, errors.New("containerd: this agent has no state directory for network namespaces")
	}
	a := &attachment{network: n.Name, id: id, netns: filepath.Join(r.NetNSDir(), ns+"-"+id), ports: ports}
	if err := NewNetNS(a.netns); err != nil {
		return nil, netip.Prefix{}, err
	}
	want, _ := netip.ParseAddr(n.Address)
	got, err := r.cni().Attach(ctx, n.Name, id, a.netns, want, ports)
	if err != nil {
		_ = RemoveNetNS(a.netns)
		return nil, netip.Prefix{}, err
	}
	return a, got, nil
}

// detach undoes attach (or the attachment of a container made elsewhere,
// whose namespace stays where this runtime did not pin it).
func (r *Runtime) detach(ctx context.Context, a *attachment) error {
	if err := r.cni().Detach(ctx, a.network, a.id, a.netns, a.ports); err != nil {
		return fmt.Errorf("containerd: detach from CNI network %q: %w", a.network, err)
	}
	if ownNetNS(r.NetNSDir(), a.netns) {
		return RemoveNetNS(a.netns)
	}
	return nil
}

// cniNetworkOf is the container's CNI network among nets, if any.
func cniNetworkOf(nets []runtime.Network) *runtime.Network {
	for i := range nets {
		if nets[i].Driver == "cni" {
			return &nets[i]
		}
	}
	return nil
}

// portTaken names the container of this containerd (any namespace) that
// publishes one of ports through CNI already, and the port: the portmap
// plugin would add a second rule for it, and the first would win.
func portTaken(ctx context.Context, cl *client.Client, ports []PortMapping) (string, string, error) {
	if len(ports) == 0 {
		return "", "", nil
	}
	nss, err := cl.NamespaceService().List(ctx)
	if err != nil {
		return "", "", err
	}
	for _, ns := range nss {
		ctrs, err := cl.Containers(namespaces.WithNamespace(ctx, ns), `labels."`+LabelCNIPorts+`"`)
		if err != nil {
			return "", "", err
		}
		for _, c := range ctrs {
			labels, err := c.Labels(namespaces.WithNamespace(ctx, ns))
			if err != nil {
				continue // gone meanwhile
			}
			theirs, _ := ParsePorts(labels[LabelCNIPorts])
			for _, p := range ports {
				for _, q := range theirs {
					if p.HostPort == q.HostPort && p.Protocol == q.Protocol {
						return JoinName(ns, c.ID()), fmt.Sprintf("%d/%s", p.HostPort, p.Protocol), nil
					}
				}
			}
		}
	}
	return "", "", nil
}

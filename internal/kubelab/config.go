// Package kubelab brings a real Kubernetes cluster up and down on one
// machine, for ferry's tests and lab: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler in one network namespace,
// and for each node a containerd and a kubelet inside that node's network
// namespace. The binaries come from the cache scripts/kube-build.sh fills;
// every file, socket, log and state directory lives under Config.Dir, and
// what lives elsewhere (cgroups, routes, the CNI bridges in the nodes'
// namespaces) is recorded there as it is made, so that Down removes it all,
// even after the caller crashed.
//
// The caller provides the network: the control namespace and one namespace
// per node, all able to reach each other at their IPs (a bridge between
// them, typically). Up adds the routes that carry each node's pod CIDR to
// that node.
//
// Clients must run inside the lab's namespaces: an address tried from the
// host's own namespace leaves through the host's default route. Cluster's
// client does so.
package kubelab

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Versions of what the cache holds, as scripts/kube-build.sh builds it.
const (
	KubeVersion = "v1.37.2"
	// PauseImage is the kubelet's and containerd's default sandbox image,
	// so nothing is ever pulled for it.
	PauseImage = "registry.k8s.io/pause:3.10.2"
)

// DefaultCache is where scripts/kube-build.sh installs: bin/ (ferry-kube,
// etcd, containerd, containerd-shim-runc-v2, ctr), cni/ (CNI plugins) and
// images/pause.tar.
const DefaultCache = "/var/cache/ferry/kube"

// Binaries the cache's bin directory must hold.
var Binaries = []string{"ferry-kube", "etcd", "containerd", "containerd-shim-runc-v2", ShimBinary, "ctr"}

// ShimBinary is ferry's containerd shim (tools/kube/shim), the runtime
// handler ShimHandler of every node's containerd and of RuntimeClass
// ferry.
const (
	ShimBinary  = "containerd-shim-ferry-v2"
	ShimHandler = "ferry"
)

// RestoreWait is the kubelets' runtimeRequestTimeout: a replacement pod's
// container waits in ferry's shim for its migration (restoreshim.WaitEnv)
// a minute less, so the shim, not the kubelet, gives up first.
const RestoreWait = 10 * time.Minute

// CNIPlugins the cache's cni directory must hold.
var CNIPlugins = []string{"bridge", "host-local", "loopback"}

// Node is one kubelet and its containerd.
type Node struct {
	// Name is the Kubernetes node name: lower-case letters, digits and
	// '-', at most 20 characters.
	Name string
	// NetNS is the node's network namespace, a path such as /run/netns/x.
	NetNS string
	// IP is the node's address in NetNS, where the other namespaces reach it.
	IP string
	// PodCIDR is the node's pod subnet (IPv4), disjoint from every other
	// node's; its first address goes to the node's CNI bridge.
	PodCIDR string
	// Bridge names the CNI bridge Up's network config makes in NetNS
	// (default "kbr-" and the name, cut to 15 characters).
	Bridge string
}

// Config says what cluster Up brings up.
type Config struct {
	// Dir holds everything Up makes: certificates, configurations, data,
	// sockets, logs and state.json (what Down removes). It must be short
	// (at most 36 characters): containerd's shim sockets live under it,
	// and their directory may not exceed 42.
	Dir string
	// Name names the cluster's cgroups (/Name in every hierarchy) and CNI
	// networks (Name-NODE); it must not clash with anything else on the
	// machine. Default "kubelab".
	Name string
	// Bin is the directory of Binaries (default DefaultCache/bin), CNIBin
	// that of CNIPlugins (default DefaultCache/cni) and PauseImageTar the
	// sandbox image's archive (default DefaultCache/images/pause.tar).
	Bin, CNIBin, PauseImageTar string
	// ControlNetNS is the network namespace (a path) etcd and the control
	// plane run in; the apiserver serves at ControlIP there.
	ControlNetNS, ControlIP string
	Nodes                   []Node
	// ServiceCIDR is the Services' virtual range (default 10.96.0.0/24).
	ServiceCIDR string
	// ReadyTimeout bounds each component's wait to be ready (default 3 min).
	ReadyTimeout time.Duration
}

const (
	defaultName         = "kubelab"
	defaultServiceCIDR  = "10.96.0.0/24"
	defaultReadyTimeout = 3 * time.Minute
	// maxDirLen keeps DIR/NODE/s within containerd's 42-character limit
	// for the shim socket directory.
	maxDirLen      = 36
	maxNodeNameLen = 20
)

var (
	nodeNameRE    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	clusterNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$`)
	bridgeNameRE  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
)

// withDefaults fills in what c leaves empty and checks the rest; it
// touches nothing on the machine.
func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		c.Name = defaultName
	}
	if c.Bin == "" {
		c.Bin = filepath.Join(DefaultCache, "bin")
	}
	if c.CNIBin == "" {
		c.CNIBin = filepath.Join(DefaultCache, "cni")
	}
	if c.PauseImageTar == "" {
		c.PauseImageTar = filepath.Join(DefaultCache, "images", "pause.tar")
	}
	if c.ServiceCIDR == "" {
		c.ServiceCIDR = defaultServiceCIDR
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = defaultReadyTimeout
	}
	c.Nodes = append([]Node(nil), c.Nodes...)
	for i := range c.Nodes {
		if c.Nodes[i].Bridge == "" {
			b := "kbr-" + c.Nodes[i].Name
			c.Nodes[i].Bridge = b[:min(len(b), 15)]
		}
	}
	return c, c.validate()
}

func (c Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Dir == "" || !filepath.IsAbs(c.Dir) {
		bad("Dir %q: want an absolute path", c.Dir)
	} else if len(filepath.Clean(c.Dir)) > maxDirLen {
		bad("Dir %q is %d characters: at most %d, so that containerd's shim socket directory under it stays within 42", c.Dir, len(c.Dir), maxDirLen)
	}
	if !clusterNameRE.MatchString(c.Name) {
		bad("Name %q: use 1-40 letters, digits, '.', '_' or '-'", c.Name)
	}
	if c.ControlNetNS == "" {
		bad("ControlNetNS is empty: the control plane needs a network namespace of its own")
	}
	controlIP := net.ParseIP(c.ControlIP).To4()
	if controlIP == nil {
		bad("ControlIP %q: want an IPv4 address", c.ControlIP)
	}
	_, services, err := net.ParseCIDR(c.ServiceCIDR)
	if err != nil || services.IP.To4() == nil {
		bad("ServiceCIDR %q: want an IPv4 CIDR", c.ServiceCIDR)
	}
	if len(c.Nodes) == 0 {
		bad("no Nodes")
	}
	names, bridges, netnses := map[string]bool{}, map[string]bool{}, map[string]bool{c.ControlNetNS: true}
	var podNets []*net.IPNet
	for _, n := range c.Nodes {
		if len(n.Name) > maxNodeNameLen || !nodeNameRE.MatchString(n.Name) {
			bad("node name %q: use 1-%d lower-case letters, digits or '-'", n.Name, maxNodeNameLen)
		}
		if names[n.Name] {
			bad("node name %q twice", n.Name)
		}
		names[n.Name] = true
		if n.NetNS == "" || netnses[n.NetNS] {
			bad("node %s: NetNS %q must be a namespace of its own (not the control plane's or another node's)", n.Name, n.NetNS)
		}
		netnses[n.NetNS] = true
		if net.ParseIP(n.IP).To4() == nil {
			bad("node %s: IP %q: want an IPv4 address", n.Name, n.IP)
		}
		if !bridgeNameRE.MatchString(n.Bridge) || bridges[n.Bridge] {
			bad("node %s: bridge name %q: want 1-15 characters, distinct per node", n.Name, n.Bridge)
		}
		bridges[n.Bridge] = true
		_, pn, err := net.ParseCIDR(n.PodCIDR)
		if err != nil || pn.IP.To4() == nil {
			bad("node %s: PodCIDR %q: want an IPv4 CIDR", n.Name, n.PodCIDR)
			continue
		}
		if ones, _ := pn.Mask.Size(); ones > 29 {
			bad("node %s: PodCIDR %s is too small", n.Name, n.PodCIDR)
		}
		for _, other := range append(podNets, services) {
			if other != nil && (other.Contains(pn.IP) || pn.Contains(other.IP)) {
				bad("node %s: PodCIDR %s overlaps %s", n.Name, n.PodCIDR, other)
			}
		}
		podNets = append(podNets, pn)
	}
	return errors.Join(errs...)
}

// CheckCache reports what of the cache Up needs is missing (nil when
// nothing is): the binaries, CNI plugins and pause image c names, or the
// defaults.
func CheckCache(c Config) error {
	c, _ = c.withDefaults()
	var missing []string
	check := func(p string) {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	for _, b := range Binaries {
		check(filepath.Join(c.Bin, b))
	}
	for _, p := range CNIPlugins {
		check(filepath.Join(c.CNIBin, p))
	}
	check(c.PauseImageTar)
	if len(missing) > 0 {
		return fmt.Errorf("missing %v (scripts/kube-build.sh builds them)", missing)
	}
	return nil
}

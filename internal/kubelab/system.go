package kubelab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/cnet"
)

// Dialer returns a dial function whose sockets live in the network
// namespace at nsPath (a named namespace, or /proc/PID/ns/net for a pod's
// process): the lab's addresses are reachable from its namespaces only.
// The returned connection works from any goroutine.
func Dialer(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := cnet.Do(nsPath, func() error {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			conn = c
			return err
		})
		return conn, err
	}
}

// linkUp sets the named link up in the namespace at nsPath.
func linkUp(nsPath, name string) error {
	h, err := cnet.NetlinkIn(nsPath)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("%s up in %s: %w", name, nsPath, err)
	}
	return nil
}

// addRoute routes dst via gateway in the namespace at nsPath; an
// identical route already there is fine.
func addRoute(r route) error {
	return onRoute(r, func(h *netlink.Handle, nr *netlink.Route) error {
		if err := h.RouteReplace(nr); err != nil {
			return fmt.Errorf("route %s via %s in %s: %w", r.Dst, r.Via, r.NetNS, err)
		}
		return nil
	})
}

// delRoute removes a route addRoute added; one already gone (or a
// namespace already gone) is not an error.
func delRoute(r route) error {
	if _, err := os.Stat(r.NetNS); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return onRoute(r, func(h *netlink.Handle, nr *netlink.Route) error {
		if err := h.RouteDel(nr); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete route %s via %s in %s: %w", r.Dst, r.Via, r.NetNS, err)
		}
		return nil
	})
}

// onRoute runs do with a netlink handle in r's namespace and r as a
// netlink route.
func onRoute(r route, do func(*netlink.Handle, *netlink.Route) error) error {
	h, err := cnet.NetlinkIn(r.NetNS)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", r.NetNS, err)
	}
	defer h.Close()
	_, dst, err := net.ParseCIDR(r.Dst)
	if err != nil {
		return err
	}
	return do(h, &netlink.Route{Dst: dst, Gw: net.ParseIP(r.Via)})
}

// deleteBridge removes a CNI bridge and the pods' veths still attached to
// it (their peers go with them), so that none outlives the cluster even
// while the kernel is still tearing a pod's namespace down.
func deleteBridge(b bridge) error {
	if _, err := os.Stat(b.NetNS); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	h, err := cnet.NetlinkIn(b.NetNS)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", b.NetNS, err)
	}
	defer h.Close()
	br, err := h.LinkByName(b.Name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bridge %s in %s: %w", b.Name, b.NetNS, err)
	}
	if br.Type() != "bridge" {
		return fmt.Errorf("%s in %s is a %s, not the CNI bridge: left alone", b.Name, b.NetNS, br.Type())
	}
	links, err := h.LinkList()
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete %s in %s: %w", l.Attrs().Name, b.NetNS, err))
			}
		}
	}
	if err := h.LinkDel(br); err != nil && !errors.Is(err, unix.ENODEV) {
		errs = append(errs, fmt.Errorf("delete bridge %s in %s: %w", b.Name, b.NetNS, err))
	}
	return errors.Join(errs...)
}

// kubeletChains are the iptables chains a kubelet makes in its namespace
// (KUBE-IPTABLES-HINT, its canaries, KUBE-FIREWALL and the INPUT and
// OUTPUT jumps to it), by table.
var kubeletChains = map[string][]string{
	"mangle": {"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"},
	"nat":    {"KUBE-KUBELET-CANARY"},
	"filter": {"KUBE-KUBELET-CANARY", "KUBE-FIREWALL"},
}

// servicesChain stands in for kube-proxy in a node's namespace (nat
// table, from PREROUTING and OUTPUT), for Service default/kubernetes only:
// its ClusterIP's port 443 leads to the API server, so that clients in
// pods (ferry-controller's Deployment) find it as in any cluster. No other
// Service is served.
const servicesChain = "FERRY-KUBE-SERVICES"

// serveAPIService adds servicesChain to the namespace at nsPath, sending
// clusterIP:443 to apiserver (HOST:PORT).
func serveAPIService(ctx context.Context, nsPath string, clusterIP net.IP, apiserver string) error {
	ipt := func(args ...string) error {
		out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + nsPath, "--", "iptables", "-w", "5", "-t", "nat"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %s in %s: %w: %s", strings.Join(args, " "), nsPath, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	steps := [][]string{
		{"-N", servicesChain},
		{"-A", servicesChain, "-d", clusterIP.String() + "/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", apiserver},
		{"-A", "PREROUTING", "-j", servicesChain},
		{"-A", "OUTPUT", "-j", servicesChain},
	}
	for _, s := range steps {
		if err := ipt(s...); err != nil {
			return err
		}
	}
	return nil
}

// removeKubeletChains undoes what a kubelet left in the iptables of the
// namespace at nsPath (the caller's, not the cluster's). Best effort: a
// chain or a rule that is not there is what it should be.
func removeKubeletChains(ctx context.Context, nsPath string) {
	if _, err := os.Stat(nsPath); err != nil {
		return
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(ipt); err != nil {
			continue
		}
		run := func(args ...string) {
			_ = exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + nsPath, "--", ipt, "-w", "5"}, args...)...).Run()
		}
		for _, parent := range []string{"INPUT", "OUTPUT"} {
			run("-t", "filter", "-D", parent, "-j", "KUBE-FIREWALL")
		}
		for _, parent := range []string{"PREROUTING", "OUTPUT"} {
			run("-t", "nat", "-D", parent, "-j", servicesChain)
		}
		run("-t", "nat", "-F", servicesChain)
		run("-t", "nat", "-X", servicesChain)
		for table, chains := range kubeletChains {
			for _, c := range chains {
				run("-t", table, "-F", c)
				run("-t", table, "-X", c)
			}
		}
	}
}

// cgroup2Dir is rel's directory in the machine's cgroup v2 hierarchy
// (unified below /sys/fs/cgroup on a hybrid host, /sys/fs/cgroup itself
// on a pure v2 one), "" when there is none.
func cgroup2Dir(rel string) string {
	for _, h := range cgroups.Hierarchies(cgroups.Root) {
		var st unix.Statfs_t
		if unix.Statfs(h, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return filepath.Join(h, rel)
		}
	}
	return ""
}

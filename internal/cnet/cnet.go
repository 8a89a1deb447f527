// Package cnet moves a container's network identity between hosts: the
// interfaces of its network namespace (name, MAC, MTU, addresses) and its
// default route are described at the source and recreated at the
// destination on a veth plugged into the host's bridge to the shared L2
// segment, so the container keeps its IP address and its TCP connections
// (restored by CRIU) find their address again. After the restore, a
// gratuitous ARP tells the segment where the address lives now.
//
// It builds namespaces with iproute2 (a setup dependency, whose behaviour
// operators know). What runs while the address moves (the veths' carrier,
// the gratuitous ARP) goes through netlink and a packet socket instead: an
// exec took 2-18 ms here, time in which the address answered nowhere.
package cnet

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// Iface is one interface of a container's network namespace.
type Iface struct {
	Name  string   `json:"name"`
	MAC   string   `json:"mac"`
	MTU   int      `json:"mtu"`
	Addrs []string `json:"addrs"` // CIDR, IPv4 and IPv6 (link-local skipped)
	// Bridge, for a veth of a runtime's (LXC's), is the bridge its peer
	// is on in the host's namespace (SetLinks).
	Bridge string `json:"bridge,omitempty"`
}

// Spec is what a container's network needs to be rebuilt elsewhere.
type Spec struct {
	Ifaces  []Iface `json:"ifaces"`
	Gateway string  `json:"gateway,omitempty"` // default route's next hop
}

// NetnsDir is where named network namespaces live.
const NetnsDir = "/var/run/netns"

// Prefix marks the namespaces ferry made for containers; only those are
// deleted when a container leaves.
const Prefix = "ferry-c-"

// Name is the namespace ferry makes for a container on a host.
func Name(host, container string) string { return Prefix + host + "-" + container }

// Path is a named namespace's path.
func Path(name string) string { return filepath.Join(NetnsDir, name) }

func run(args ...string) ([]byte, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// inNS runs a command inside the namespace at nsPath.
func inNS(nsPath string, args ...string) ([]byte, error) {
	return run(append([]string{"nsenter", "--net=" + nsPath, "--"}, args...)...)
}

// inHost runs a command in hostNS, or here when hostNS is "".
func inHost(hostNS string, args ...string) ([]byte, error) {
	if hostNS == "" {
		return run(args...)
	}
	return inNS(hostNS, args...)
}

// Describe reads the interfaces (all but loopback) and the default route
// of the namespace at nsPath.
func Describe(nsPath string) (Spec, error) {
	var spec Spec
	out, err := inNS(nsPath, "ip", "-j", "addr", "show")
	if err != nil {
		return spec, err
	}
	var links []struct {
		Name     string `json:"ifname"`
		MAC      string `json:"address"`
		MTU      int    `json:"mtu"`
		LinkType string `json:"link_type"`
		Addrs    []struct {
			Local  string `json:"local"`
			Prefix int    `json:"prefixlen"`
			Scope  string `json:"scope"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return spec, fmt.Errorf("ip -j addr: %w", err)
	}
	for _, l := range links {
		if l.LinkType == "loopback" {
			continue
		}
		ifc := Iface{Name: l.Name, MAC: l.MAC, MTU: l.MTU}
		for _, a := range l.Addrs {
			if a.Scope == "link" {
				continue
			}
			ifc.Addrs = append(ifc.Addrs, fmt.Sprintf("%s/%d", a.Local, a.Prefix))
		}
		spec.Ifaces = append(spec.Ifaces, ifc)
	}
	out, err = inNS(nsPath, "ip", "-j", "route", "show", "default")
	if err == nil {
		var routes []struct {
			Gateway string `json:"gateway"`
		}
		if json.Unmarshal(out, &routes) == nil && len(routes) > 0 {
			spec.Gateway = routes[0].Gateway
		}
	}
	return spec, nil
}

// hostSide names the host end of a container interface's veth (at most 15
// characters, stable for a namespace and interface).
func hostSide(name, ifname string) string {
	h := sha256.Sum256([]byte(name + "/" + ifname))
	return "fc" + hex.EncodeToString(h[:])[:10]
}

// Create makes the namespace name with the interfaces of spec, each a veth
// whose other end is in hostNS (a namespace path; "" for the caller's),
// plugged into bridge there. The container's side is fully configured (addresses, default
// route: CRIU needs a route to put TCP connections back) but the host's
// side stays down until SetCarrier, so the copy being prepared neither
// receives nor answers anything for an address its source still holds.
func Create(name, hostNS, bridge string, spec Spec) (string, error) {
	if _, err := run("ip", "netns", "add", name); err != nil {
		return "", err
	}
	nsPath := Path(name)
	fail := func(err error) (string, error) {
		_ = Delete(name)
		return "", err
	}
	if _, err := inNS(nsPath, "ip", "link", "set", "lo", "up"); err != nil {
		return fail(err)
	}
	for _, ifc := range spec.Ifaces {
		hs := hostSide(name, ifc.Name)
		if _, err := inHost(hostNS, "ip", "link", "add", hs, "type", "veth", "peer", "name", ifc.Name, "netns", nsPath); err != nil {
			return fail(err)
		}
		if _, err := inHost(hostNS, "ip", "link", "set", hs, "master", bridge); err != nil {
			return fail(err)
		}
		args := []string{"ip", "link", "set", ifc.Name}
		if ifc.MAC != "" {
			args = append(args, "address", ifc.MAC)
		}
		if ifc.MTU > 0 {
			args = append(args, "mtu", fmt.Sprint(ifc.MTU))
		}
		if _, err := inNS(nsPath, append(args, "up")...); err != nil {
			return fail(err)
		}
		for _, a := range ifc.Addrs {
			if _, err := inNS(nsPath, "ip", "addr", "add", a, "dev", ifc.Name); err != nil {
				return fail(err)
			}
		}
	}
	if spec.Gateway != "" {
		if _, err := inNS(nsPath, "ip", "route", "replace", "default", "via", spec.Gateway); err != nil {
			return fail(err)
		}
	}
	return nsPath, nil
}

// SetCarrier brings the host's ends (in hostNS, "" for the caller's) of the
// container's veths up or down: down, the container's interfaces keep their
// addresses and routes but no packet reaches or leaves them.
func SetCarrier(name, hostNS string, spec Spec, up bool) error {
	h, err := NetlinkIn(hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, ifc := range spec.Ifaces {
		l, err := h.LinkByName(hostSide(name, ifc.Name))
		if err == nil && up {
			err = h.LinkSetUp(l)
		} else if err == nil {
			err = h.LinkSetDown(l)
		}
		if err != nil {
			return fmt.Errorf("carrier of %s's %s: %w", name, ifc.Name, err)
		}
	}
	return nil
}

// netlinkIn is a netlink handle in the namespace at nsPath ("" for the
// caller's).
func NetlinkIn(nsPath string) (*netlink.Handle, error) {
	if nsPath == "" {
		return netlink.NewHandle()
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// Delete removes a namespace ferry made, with its veths; only names with
// Prefix are touched.
func Delete(name string) error {
	if !strings.HasPrefix(name, Prefix) {
		return fmt.Errorf("refusing to delete network namespace %q: ferry did not make it", name)
	}
	if _, err := os.Stat(Path(name)); os.IsNotExist(err) {
		return nil
	}
	// A namespace is torn down asynchronously, and its veths' host ends
	// with it: delete the veths first, so their names are free at once (a
	// container that comes back to this host needs them).
	if out, err := inNS(Path(name), "ip", "-j", "link", "show"); err == nil {
		var links []struct {
			Name     string `json:"ifname"`
			LinkType string `json:"link_type"`
		}
		if json.Unmarshal(out, &links) == nil {
			for _, l := range links {
				if l.LinkType != "loopback" {
					_, _ = inNS(Path(name), "ip", "link", "del", l.Name)
				}
			}
		}
	}
	_, err := run("ip", "netns", "del", name)
	return err
}

// Users returns the processes whose network namespace is the named one: a
// namespace some process lives in is a container's, not a leftover, and
// must not be deleted. None when the namespace does not exist.
func Users(name string) ([]int, error) {
	pids, err := procs.InNamespace(Path(name), "net")
	if os.IsNotExist(err) {
		return nil, nil
	}
	return pids, err
}

// DeleteUnused deletes a namespace ferry made only when no process lives
// in it (a leftover of an earlier attempt); one in use is refused.
func DeleteUnused(name string) error {
	pids, err := Users(name)
	if err != nil {
		return err
	}
	if len(pids) > 0 {
		return fmt.Errorf("network namespace %s is in use (pids %v): a container of that name has its network here", name, pids)
	}
	return Delete(name)
}

// Do runs f on a thread in the network namespace at path: the sockets it
// opens and the processes it starts are there. The thread is locked to f
// and switched back before it serves another goroutine; one that cannot
// be switched back stays locked, and ends with its goroutine. Switching
// back matters: Go cannot end the process's main thread, and a main
// thread left in the namespace would keep it alive after it is deleted.
func Do(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("network namespace %s: %w", path, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave network namespace %s: %w", path, err))
			return
		}
		goruntime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

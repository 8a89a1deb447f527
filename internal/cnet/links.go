package cnet

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// SetLinks takes the interfaces of spec down or up inside the namespace
// at nsPath: a runtime's own (a Docker macvlan). A veth (LXC's) is left
// up, since CRIU dumps its state and the routes a link without carrier
// holds do not restore; its peer in the caller's namespace leaves its
// bridge instead (ifc.Bridge, which BridgesOf fills), and joins it again. Down, the frozen copy neither answers for its address nor
// acknowledges what its sockets would no longer read; up again, the
// default route spec names goes back (the kernel drops the routes through
// a link that goes down) and the addresses are announced.
func SetLinks(nsPath string, spec Spec, up bool) error {
	h, err := NetlinkIn(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	var gwLink netlink.Link
	gw := net.ParseIP(spec.Gateway)
	for _, ifc := range spec.Ifaces {
		l, err := h.LinkByName(ifc.Name)
		if err != nil {
			return fmt.Errorf("link %s in %s: %w", ifc.Name, nsPath, err)
		}
		if _, ok := l.(*netlink.Veth); ok && ifc.Bridge != "" {
			if err := bridgePeer(l, ifc.Bridge, up); err != nil {
				return fmt.Errorf("the host's end of %s in %s: %w", ifc.Name, nsPath, err)
			}
			continue
		}
		if up {
			err = h.LinkSetUp(l)
		} else {
			err = h.LinkSetDown(l)
		}
		if err != nil {
			return fmt.Errorf("link %s in %s: %w", ifc.Name, nsPath, err)
		}
		if gw != nil && gwLink == nil && onLink(ifc.Addrs, gw) {
			gwLink = l
		}
	}
	if !up {
		return nil
	}
	if gwLink != nil {
		_, all, _ := net.ParseCIDR("0.0.0.0/0")
		if err := h.RouteReplace(&netlink.Route{LinkIndex: gwLink.Attrs().Index, Dst: all, Gw: gw}); err != nil {
			return fmt.Errorf("default route via %s in %s: %w", gw, nsPath, err)
		}
	}
	return Announce(nsPath, spec)
}

// bridgePeer puts a veth's peer, in the caller's namespace, on bridge, or
// takes it off.
func bridgePeer(l netlink.Link, bridge string, on bool) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	peer, err := h.LinkByIndex(l.Attrs().ParentIndex)
	if err != nil {
		return err
	}
	if !on {
		return h.LinkSetNoMaster(peer)
	}
	br, err := h.LinkByName(bridge)
	if err != nil {
		return err
	}
	return h.LinkSetMaster(peer, br)
}

// BridgesOf fills in, for each veth of spec in the namespace at nsPath,
// the bridge its peer in the caller's namespace is on.
func BridgesOf(nsPath string, spec *Spec) error {
	h, err := NetlinkIn(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	host, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer host.Close()
	for i, ifc := range spec.Ifaces {
		l, err := h.LinkByName(ifc.Name)
		if err != nil {
			return err
		}
		if _, ok := l.(*netlink.Veth); !ok {
			continue
		}
		peer, err := host.LinkByIndex(l.Attrs().ParentIndex)
		if err != nil || peer.Attrs().MasterIndex == 0 {
			continue // not here, or on no bridge
		}
		if br, err := host.LinkByIndex(peer.Attrs().MasterIndex); err == nil {
			spec.Ifaces[i].Bridge = br.Attrs().Name
		}
	}
	return nil
}

// onLink says whether ip lies in one of the CIDRs.
func onLink(cidrs []string, ip net.IP) bool {
	for _, c := range cidrs {
		if _, n, err := net.ParseCIDR(c); err == nil && n.Contains(ip) {
			return true
		}
	}
	return false
}

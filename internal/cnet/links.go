package cnet

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// SetLinks takes the interfaces of spec down or up inside the namespace
// at nsPath: a runtime's own (a Docker macvlan), where ferry has no host
// side to cut. Down, the frozen copy neither answers for its address nor
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
		if err == nil && up {
			err = h.LinkSetUp(l)
		} else if err == nil {
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

// onLink says whether ip lies in one of the CIDRs.
func onLink(cidrs []string, ip net.IP) bool {
	for _, c := range cidrs {
		if _, n, err := net.ParseCIDR(c); err == nil && n.Contains(ip) {
			return true
		}
	}
	return false
}

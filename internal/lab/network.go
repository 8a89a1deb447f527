package lab

import (
	"fmt"
	"math"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The network is built with vishvananda/netlink rather than by running
// `ip`: a handle opened inside a namespace configures it directly, errors
// come back typed instead of as text, and a veth can be created with each
// end already in its namespace, so nothing ever appears in the root one.

// buildSwitch creates the switch namespace and its bridge.
func buildSwitch() error {
	if err := addNetNS(SwitchNetNS); err != nil {
		return err
	}
	sw, err := handleAt(SwitchNetNS)
	if err != nil {
		return err
	}
	defer sw.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName}}
	if err := sw.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s: %w", BridgeName, err)
	}
	if err := sw.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge %s up: %w", BridgeName, err)
	}
	return nil
}

// plugHost creates host h's namespace and wires it to the switch: eth0 in
// the host with its address, the peer h{i} on the bridge.
func plugHost(h *Host, bps int64) error {
	if err := addNetNS(h.NetNSName); err != nil {
		return err
	}
	sw, err := handleAt(SwitchNetNS)
	if err != nil {
		return err
	}
	defer sw.Close()
	hn, err := handleAt(h.NetNSName)
	if err != nil {
		return err
	}
	defer hn.Close()

	hostNS, err := netns.GetFromPath(netnsPath(h.NetNSName))
	if err != nil {
		return fmt.Errorf("open netns %s: %w", h.NetNSName, err)
	}
	portName := h.Name
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: portName},
		PeerName:      hostIfName,
		PeerNamespace: netlink.NsFd(hostNS),
	}
	err = sw.LinkAdd(veth) // created in the switch netns, peer straight into the host's
	hostNS.Close()
	if err != nil {
		return fmt.Errorf("add veth %s/%s: %w", portName, hostIfName, err)
	}

	br, err := sw.LinkByName(BridgeName)
	if err != nil {
		return fmt.Errorf("switch: %w", err)
	}
	port, err := sw.LinkByName(portName)
	if err != nil {
		return fmt.Errorf("switch port %s: %w", portName, err)
	}
	if err := sw.LinkSetMaster(port, br); err != nil {
		return fmt.Errorf("enslave %s to %s: %w", portName, BridgeName, err)
	}
	if err := sw.LinkSetUp(port); err != nil {
		return fmt.Errorf("switch port %s up: %w", portName, err)
	}

	eth, err := hn.LinkByName(hostIfName)
	if err != nil {
		return fmt.Errorf("%s: %w", h.Name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(h.Addr).To4(), Mask: net.CIDRMask(prefixLen, 32)}}
	if err := hn.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("%s: add address %s: %w", h.Name, addr, err)
	}
	if err := hn.LinkSetUp(eth); err != nil {
		return fmt.Errorf("%s: %s up: %w", h.Name, hostIfName, err)
	}

	if bps > 0 {
		// Shape both ends: eth0's egress carries the host's sends, the
		// switch port's egress what the host receives.
		if err := shape(hn, eth, bps); err != nil {
			return fmt.Errorf("%s: shape %s: %w", h.Name, hostIfName, err)
		}
		if err := shape(sw, port, bps); err != nil {
			return fmt.Errorf("switch: shape %s: %w", portName, err)
		}
	}
	return nil
}

// tbfParams picks the token bucket for a rate in bits per second: a
// bucket of 4 ms of traffic (at least 32 KiB so that segmentation offload
// chunks pass) and a queue of about 50 ms on top of it.
func tbfParams(bps int64) (rate uint64, burst, limit uint32) {
	rate = uint64(bps) / 8 // tbf counts bytes
	b := max(rate/250, 32*1024)
	l := rate/20 + b
	return rate, uint32(min(b, math.MaxUint32)), uint32(min(l, math.MaxUint32))
}

func shape(h *netlink.Handle, link netlink.Link, bps int64) error {
	rate, burst, limit := tbfParams(bps)
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: link.Attrs().Index,
			Handle:    netlink.MakeHandle(1, 0),
			Parent:    netlink.HANDLE_ROOT,
		},
		Rate:   rate,
		Limit:  limit,
		Buffer: netlink.Xmittime(rate, burst), // tbf takes the bucket as time
	}
	return h.QdiscReplace(q)
}

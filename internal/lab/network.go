package lab

import (
	"fmt"
	"math"
	"net"
	"os/exec"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The network is built with vishvananda/netlink rather than by running
// `ip`: a handle opened inside a namespace configures it directly, errors
// come back typed instead of as text, and a veth can be created with each
// end already in its namespace, so nothing ever appears in the root one.

// buildSwitch creates the switch namespace and one bridge per path.
func buildSwitch(paths int) error {
	if err := addNetNS(SwitchNetNS); err != nil {
		return err
	}
	sw, err := handleAt(SwitchNetNS)
	if err != nil {
		return err
	}
	defer sw.Close()
	for p := 0; p < paths; p++ {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName(p)}}
		if err := sw.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge %s: %w", bridgeName(p), err)
		}
		if err := sw.LinkSetUp(br); err != nil {
			return fmt.Errorf("bridge %s up: %w", bridgeName(p), err)
		}
	}
	return nil
}

// Path p of the lab is a bridge brP in the switch, an interface ethP in
// each host with address 10.(77+P).0.i, and the switch port hI (path 0) or
// hIpP.
func bridgeName(p int) string { return fmt.Sprintf("br%d", p) }
func hostIf(p int) string     { return fmt.Sprintf("eth%d", p) }
func switchPort(h *Host, p int) string {
	if p == 0 {
		return h.Name
	}
	return fmt.Sprintf("%sp%d", h.Name, p)
}

// plugHost creates host h's namespace and wires it to the switch once per
// path; with several paths it sets up MPTCP so one connection uses all.
// With delayLines each path's switch port is left off the bridge for a
// delay line to join it (delayline.go).
func plugHost(h *Host, bps int64, paths int, delayLines bool) error {
	if err := addNetNS(h.NetNSName); err != nil {
		return err
	}
	if err := tuneTCP(h); err != nil {
		return err
	}
	for p := 0; p < paths; p++ {
		if err := plugPath(h, p, bps, delayLines); err != nil {
			return err
		}
	}
	if paths > 1 {
		return setupMPTCP(h, paths)
	}
	return nil
}

// farLinkTCP are the host's TCP buffer limits, as packaging/sysctl.d sets
// them on a real host: autotuning may grow a connection's send buffer to
// 32 MiB (the kernel's default stops at 4 MiB, about 2-3 MB in flight:
// 450 Mbit/s at a 50 ms round trip). A new namespace starts with the
// machine's values.
var farLinkTCP = map[string]string{
	"net.ipv4.tcp_wmem": "4096 16384 33554432",
	"net.ipv4.tcp_rmem": "4096 131072 33554432",
}

// tuneTCP sets farLinkTCP in the host's namespace.
func tuneTCP(h *Host) error {
	for k, v := range farLinkTCP {
		out, err := exec.Command("ip", "netns", "exec", h.NetNSName, "sysctl", "-q", "-w", k+"="+v).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: sysctl %s: %v: %s", h.Name, k, err, out)
		}
	}
	return nil
}

// setupMPTCP lets each host open and accept extra subflows over its other
// paths' addresses (environment.md: subflow endpoints on the client, signal
// endpoints on the server; a lab host is both).
func setupMPTCP(h *Host, paths int) error {
	run := func(args ...string) error {
		out, err := exec.Command("ip", append([]string{"-n", h.NetNSName, "mptcp"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: ip mptcp %v: %v: %s", h.Name, args, err, out)
		}
		return nil
	}
	if err := run("limits", "set", "subflow", "4", "add_addr_accepted", "4"); err != nil {
		return err
	}
	for p := 1; p < paths; p++ {
		if err := run("endpoint", "add", h.PathAddr(p), "dev", hostIf(p), "signal", "subflow"); err != nil {
			return err
		}
	}
	return nil
}

// plugPath wires path p of host h: ethP in the host with its address, the
// peer on the path's bridge, both ends shaped when bps is set. With
// delayLine the peer stays off the bridge, and a second veth pair in the
// switch has one end there and the other free for the delay line, which
// joins it to the peer.
func plugPath(h *Host, p int, bps int64, delayLine bool) error {
	hostIfName := hostIf(p)
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

	portName := switchPort(h, p)
	bridge := bridgeName(p)
	if delayLine {
		if err := addDelayLinePorts(sw, portName, bridge); err != nil {
			return err
		}
		bridge = ""
	}
	if err := plugSwitchPort(sw, h, portName, hostIfName, bridge); err != nil {
		return err
	}

	eth, err := hn.LinkByName(hostIfName)
	if err != nil {
		return fmt.Errorf("%s: %w", h.Name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(h.PathAddr(p)).To4(), Mask: net.CIDRMask(prefixLen, 32)}}
	if err := hn.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("%s: add address %s: %w", h.Name, addr, err)
	}
	if err := hn.LinkSetUp(eth); err != nil {
		return fmt.Errorf("%s: %s up: %w", h.Name, hostIfName, err)
	}

	if bps > 0 {
		// Shape both ends: ethP's egress carries the host's sends, the
		// switch port's egress what the host receives.
		if err := shape(hn, eth, bps); err != nil {
			return fmt.Errorf("%s: shape %s: %w", h.Name, hostIfName, err)
		}
		port, err := sw.LinkByName(portName)
		if err != nil {
			return fmt.Errorf("switch port %s: %w", portName, err)
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

// SetPath takes path p of a host down or brings it back up, at both ends,
// the way a cable or a radio link fails.
func (l *Lab) SetPath(hostName string, p int, up bool) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	if p < 0 || p >= max(l.Paths, 1) {
		return fmt.Errorf("the lab has %d path(s), no path %d", max(l.Paths, 1), p)
	}
	for _, side := range []struct{ ns, link string }{{h.NetNSName, hostIf(p)}, {SwitchNetNS, switchPort(h, p)}} {
		hd, err := handleAt(side.ns)
		if err != nil {
			return err
		}
		link, err := hd.LinkByName(side.link)
		if err == nil {
			if up {
				err = hd.LinkSetUp(link)
			} else {
				err = hd.LinkSetDown(link)
			}
		}
		hd.Close()
		if err != nil {
			return fmt.Errorf("%s: %s: %w", side.ns, side.link, err)
		}
	}
	return nil
}

// The service segment is one L2 network all hosts reach: a bridge in the
// switch namespace, and on each host a bridge (SegmentBridge) with an
// uplink to it. Containers started with an address of their own sit on it
// (a veth into their own network namespace), keep that address when they
// migrate, and clients on any host reach them there.
const (
	// SegmentBridge is each host's bridge to the service segment; agents
	// plug migrated containers into it.
	SegmentBridge = "svc0"
	// SegmentSubnet is the segment's addresses: containers choose theirs,
	// host h{i} has .(200+i) for its clients.
	SegmentSubnet    = "10.79.0."
	segmentSwitchBr  = "brsvc"
	segmentUplink    = "svcup"
	segmentPrefixLen = 24
)

// SegmentAddr is host h's own address on the service segment.
func (h *Host) SegmentAddr() string { return fmt.Sprintf("%s%d", SegmentSubnet, 200+h.Index) }

func buildSegment() error {
	sw, err := handleAt(SwitchNetNS)
	if err != nil {
		return err
	}
	defer sw.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: segmentSwitchBr}}
	if err := sw.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s: %w", segmentSwitchBr, err)
	}
	return sw.LinkSetUp(br)
}

// plugSwitchPort adds a veth pair: port on the switch's bridge (none if
// bridge is empty), up; peer in host h's namespace, for the caller to
// configure.
func plugSwitchPort(sw *netlink.Handle, h *Host, port, peer, bridge string) error {
	hostNS, err := netns.GetFromPath(netnsPath(h.NetNSName))
	if err != nil {
		return fmt.Errorf("open netns %s: %w", h.NetNSName, err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port}, PeerName: peer, PeerNamespace: netlink.NsFd(hostNS)}
	err = sw.LinkAdd(veth) // created in the switch netns, peer straight into the host's
	hostNS.Close()
	if err != nil {
		return fmt.Errorf("add veth %s/%s: %w", port, peer, err)
	}
	link, err := sw.LinkByName(port)
	if err != nil {
		return fmt.Errorf("switch port %s: %w", port, err)
	}
	if bridge != "" {
		br, err := sw.LinkByName(bridge)
		if err != nil {
			return fmt.Errorf("switch: %w", err)
		}
		if err := sw.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("enslave %s to %s: %w", port, bridge, err)
		}
	}
	if err := sw.LinkSetUp(link); err != nil {
		return fmt.Errorf("switch port %s up: %w", port, err)
	}
	return nil
}

// plugSegment gives host h its segment bridge, uplinked to the switch;
// with delayLine through the host's delay line.
func plugSegment(h *Host, delayLine bool) error {
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
	hbr := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: SegmentBridge}}
	if err := hn.LinkAdd(hbr); err != nil {
		return fmt.Errorf("%s: add bridge %s: %w", h.Name, SegmentBridge, err)
	}
	bridge := segmentSwitchBr
	if delayLine {
		if err := addDelayLinePorts(sw, segmentPort(h), bridge); err != nil {
			return err
		}
		bridge = ""
	}
	if err := plugSwitchPort(sw, h, segmentPort(h), segmentUplink, bridge); err != nil {
		return err
	}
	hb, err := hn.LinkByName(SegmentBridge)
	if err != nil {
		return err
	}
	up, err := hn.LinkByName(segmentUplink)
	if err != nil {
		return err
	}
	if err := hn.LinkSetMaster(up, hb); err != nil {
		return err
	}
	for _, l := range []netlink.Link{up, hb} {
		if err := hn.LinkSetUp(l); err != nil {
			return err
		}
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(h.SegmentAddr()).To4(), Mask: net.CIDRMask(segmentPrefixLen, 32)}}
	return hn.AddrAdd(hb, addr)
}

const (
	// HostBridge is each host's own bridge, as LXC's lxc-net makes
	// (lxcbr0, 10.0.3.1/24 on every host): the same subnet everywhere, on
	// segments of their own, so an address can be kept but connections
	// cannot.
	HostBridge = "lxcbr0"
	// HostBridgeSubnet is its addresses; each host has .1.
	HostBridgeSubnet    = "10.0.3."
	hostBridgePrefixLen = 24
)

// addHostBridge gives host h its HostBridge.
func addHostBridge(h *Host) error {
	hn, err := handleAt(h.NetNSName)
	if err != nil {
		return err
	}
	defer hn.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: HostBridge}}
	if err := hn.LinkAdd(br); err != nil {
		return fmt.Errorf("%s: add bridge %s: %w", h.Name, HostBridge, err)
	}
	if err := hn.LinkSetUp(br); err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(HostBridgeSubnet + "1").To4(), Mask: net.CIDRMask(hostBridgePrefixLen, 32)}}
	return hn.AddrAdd(br, addr)
}

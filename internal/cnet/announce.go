package cnet

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netns"

	"github.com/ferry-migrate/ferry/internal/privnet"
)

// announceAgain is when the announcement is repeated, in case the first
// was lost.
const announceAgain = 300 * time.Millisecond

// Announce sends a gratuitous ARP for every IPv4 address of spec from the
// namespace at nsPath, so switches learn the MAC's new port and neighbours
// the address's new place at once (thesis 000 measured a 10 s stall
// without it), and again shortly after, in the background.
func Announce(nsPath string, spec Spec) error {
	if err := announce(nsPath, spec); err != nil {
		return err
	}
	go func() {
		time.Sleep(announceAgain)
		_ = announce(nsPath, spec)
	}()
	return nil
}

// announce sends, for each address, an unsolicited ARP request and an
// unsolicited ARP reply (what arping -U and -A send): neighbours take one
// or the other, depending on their state and settings.
func announce(nsPath string, spec Spec) error {
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	ns := privnet.FromHandle(h)
	defer ns.Close()
	return ns.Do(func() error {
		for _, ifc := range spec.Ifaces {
			if ips := ipv4s(ifc.Addrs); len(ips) > 0 {
				if err := gratuitousARP(ifc.Name, ips); err != nil {
					return fmt.Errorf("announce %s on %s: %w", ips, ifc.Name, err)
				}
			}
		}
		return nil
	})
}

// ipv4s are the IPv4 addresses of CIDRs.
func ipv4s(cidrs []string) []netip.Addr {
	var ips []netip.Addr
	for _, a := range cidrs {
		if p, err := netip.ParsePrefix(a); err == nil && p.Addr().Is4() {
			ips = append(ips, p.Addr())
		}
	}
	return ips
}

// gratuitousARP broadcasts on interface ifname (of the caller's namespace)
// that ips are at its MAC.
func gratuitousARP(ifname string, ips []netip.Addr) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return err
	}
	c, err := arp.Dial(ifi)
	if err != nil {
		return err
	}
	// Closing a packet socket waits for the kernel's RCU grace period
	// (8-16 ms here); the frames are out by then, so nobody waits for it.
	defer func() { go c.Close() }()
	for _, ip := range ips {
		for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
			p, err := arp.NewPacket(op, ifi.HardwareAddr, ip, ethernet.Broadcast, ip)
			if err == nil {
				err = c.WriteTo(p, ethernet.Broadcast)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

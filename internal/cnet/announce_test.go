package cnet

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netns"

	"github.com/ferry-migrate/ferry/internal/privnet"
)

// TestAnnounceReachesTheSegment checks what a neighbour on the segment
// receives: an unsolicited request and an unsolicited reply, each saying
// the address is at the container's MAC, and a neighbour entry that
// pointed elsewhere now points there.
func TestAnnounceReachesTheSegment(t *testing.T) {
	const hostName, ctr = "ferry-cnet-garp-host", "ferry-c-cnet-garp"
	segment(t, hostName, ctr)
	const mac, addr = "02:fe:0a:62:00:08", "10.98.0.8"
	spec := Spec{Ifaces: []Iface{{Name: "eth0", MAC: mac, Addrs: []string{addr + "/24", "fd00:98::8/64"}}}}
	path, err := Create(ctr, Path(hostName), "tbr0", spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := SetCarrier(ctr, Path(hostName), spec, true); err != nil {
		t.Fatal(err)
	}
	// The neighbour had the address somewhere else.
	ip(t, "-n", hostName, "neigh", "replace", addr, "lladdr", "02:00:00:00:00:99", "dev", "tbr0", "nud", "stale")

	h, err := netns.GetFromPath(Path(hostName))
	if err != nil {
		t.Fatal(err)
	}
	host := privnet.FromHandle(h)
	defer host.Close()
	var c *arp.Client
	if err := host.Do(func() error {
		ifi, err := net.InterfaceByName("tbr0")
		if err == nil {
			c, err = arp.Dial(ifi)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if err := Announce(path, spec); err != nil {
		t.Fatal(err)
	}
	seen := map[arp.Operation]bool{}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	for !seen[arp.OperationRequest] || !seen[arp.OperationReply] {
		p, _, err := c.Read()
		if err != nil {
			t.Fatalf("saw %v of a request and a reply: %v", seen, err)
		}
		if p.SenderIP != netip.MustParseAddr(addr) {
			continue
		}
		if p.SenderHardwareAddr.String() != mac || p.TargetIP != p.SenderIP {
			t.Fatalf("not a gratuitous ARP for %s at %s: %+v", addr, mac, p)
		}
		seen[p.Operation] = true
	}
	neigh := func() string {
		out, _ := exec.Command("ip", "-n", hostName, "neigh", "show", addr, "dev", "tbr0").Output()
		return string(out)
	}
	for end := time.Now().Add(time.Second); !strings.Contains(neigh(), mac); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the neighbour entry still says %q", neigh())
		}
	}
}

func TestIPv4s(t *testing.T) {
	got := ipv4s([]string{"10.0.0.1/24", "fd00::1/64", "bad", "192.168.1.2/32"})
	if len(got) != 2 || got[0].String() != "10.0.0.1" || got[1].String() != "192.168.1.2" {
		t.Fatalf("ipv4s: %v", got)
	}
}

package lxc

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// networksOf lists a container's veth networks (lxc.net.N.type = veth on
// lxc.net.N.link): on one of shared, bridges that span the hosts (the
// agent's segment bridge), the container keeps its address and
// connections; on any other bridge (lxcbr0, behind its host's NAT) its
// connections are closed at the destination.
func networksOf(lines []configLine, shared []string) []runtime.Network {
	byIndex := map[string]map[string]string{}
	for _, l := range lines {
		rest, ok := strings.CutPrefix(l.Key, "lxc.net.")
		if !ok {
			continue
		}
		i, key, ok := strings.Cut(rest, ".")
		if !ok {
			continue
		}
		if byIndex[i] == nil {
			byIndex[i] = map[string]string{}
		}
		byIndex[i][key] = l.Value
	}
	var out []runtime.Network
	for _, i := range slices.Sorted(maps.Keys(byIndex)) {
		n := byIndex[i]
		if n["type"] != "veth" || n["link"] == "" {
			continue
		}
		rn := runtime.Network{Name: n["link"], Driver: "veth", HostLocal: !slices.Contains(shared, n["link"])}
		if p, err := netip.ParsePrefix(n["ipv4.address"]); err == nil {
			rn.Address, rn.Subnet = p.Addr().String(), p.Masked().String()
		}
		out = append(out, rn)
	}
	return out
}

// tcpOptions are the CRIU configuration lines for what a migration asks
// of the container's connections.
func tcpOptions(established, closed, quiet bool) []string {
	var out []string
	if established {
		out = append(out, "tcp-established")
	}
	if closed {
		out = append(out, "tcp-close")
	}
	if quiet {
		out = append(out, "network-lock skip")
	}
	return out
}

package lxc

import (
	"slices"
	"testing"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

func TestNetworksOf(t *testing.T) {
	cfg := parseConfig([]byte(`lxc.net.0.type = veth
lxc.net.0.link = svc0
lxc.net.0.ipv4.address = 10.79.0.80/24
lxc.net.1.type = veth
lxc.net.1.link = lxcbr0
lxc.net.1.ipv4.address = 10.0.3.5/24
lxc.net.2.type = none
lxc.net.3.type = macvlan
lxc.net.3.link = eth0
`))
	got := networksOf(cfg, []string{"svc0"})
	want := []runtime.Network{
		{Name: "svc0", Driver: "veth", Address: "10.79.0.80", Subnet: "10.79.0.0/24"},
		{Name: "lxcbr0", Driver: "veth", Address: "10.0.3.5", Subnet: "10.0.3.0/24", HostLocal: true},
	}
	if !slices.EqualFunc(got, want, func(a, b runtime.Network) bool {
		return a.Name == b.Name && a.Driver == b.Driver && a.Address == b.Address && a.Subnet == b.Subnet && a.HostLocal == b.HostLocal
	}) {
		t.Errorf("networksOf: %+v, want %+v", got, want)
	}
	if got := networksOf(parseConfig([]byte("lxc.net.0.type = none\n")), nil); len(got) != 0 {
		t.Errorf("a container on its host's network: %+v", got)
	}
}

func TestTCPOptions(t *testing.T) {
	if got := tcpOptions(true, false, true); !slices.Equal(got, []string{"tcp-established", "network-lock skip"}) {
		t.Errorf("established, quiet: %v", got)
	}
	if got := tcpOptions(false, true, false); !slices.Equal(got, []string{"tcp-close"}) {
		t.Errorf("closed: %v", got)
	}
}

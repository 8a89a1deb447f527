package clientrtt

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

const us = time.Microsecond

func TestAggregate(t *testing.T) {
	c := func(remote string, rtt, rttvar, minRTT, lastRecv time.Duration, acked, received uint64) conn {
		return conn{
			local:  netip.MustParseAddrPort("10.0.0.1:80"),
			remote: netip.MustParseAddrPort(remote),
			rtt:    rtt, rttvar: rttvar, minRTT: minRTT, lastRecv: lastRecv,
			acked: acked, received: received,
		}
	}
	got := aggregate([]conn{
		// Three connections of one client, one of them a bulk transfer
		// whose own queue inflated its srtt: the median ignores it.
		c("192.0.2.7:40001", 900*us, 50*us, 800*us, 5*time.Second, 10, 20),
		c("192.0.2.7:40002", 950*us, 70*us, 810*us, time.Second, 1, 2),
		c("192.0.2.7:40003", 30000*us, 9000*us, 790*us, 3*time.Second, 100, 200),
		// Two of another: the mean of the middle two.
		c("[2001:db8::5]:5000", 100*us, 10*us, 0, time.Minute, 0, 0),
		c("[2001:db8::5]:5001", 300*us, 30*us, 90*us, 2*time.Minute, 0, 0),
		// One of a third, sorted after the second by address.
		c("198.51.100.1:1", 20*us, 2*us, 15*us, 0, 7, 8),
		c("198.51.100.2:1", 40*us, 4*us, 35*us, 0, 0, 0),
	})
	want := []Client{
		{Addr: netip.MustParseAddr("192.0.2.7"), Conns: 3, RTT: 950 * us, MinRTT: 790 * us, RTTVar: 70 * us, Idle: time.Second, BytesAcked: 111, BytesReceived: 222},
		{Addr: netip.MustParseAddr("2001:db8::5"), Conns: 2, RTT: 200 * us, MinRTT: 90 * us, RTTVar: 20 * us, Idle: time.Minute},
		{Addr: netip.MustParseAddr("198.51.100.1"), Conns: 1, RTT: 20 * us, MinRTT: 15 * us, RTTVar: 2 * us, BytesAcked: 7, BytesReceived: 8},
		{Addr: netip.MustParseAddr("198.51.100.2"), Conns: 1, RTT: 40 * us, MinRTT: 35 * us, RTTVar: 4 * us},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d clients, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("client %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	if got := aggregate(nil); len(got) != 0 {
		t.Errorf("no connections: %+v", got)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{5}, 5},
		{[]time.Duration{9, 1}, 5},
		{[]time.Duration{9, 1, 4}, 4},
		{[]time.Duration{9, 1, 4, 2}, 3},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// pick keeps the established connections the options ask for, as the
// kernel reported them.
func TestPick(t *testing.T) {
	cookie := uint32(0)
	sock := func(state uint8, src string, sport uint16, dst string, dport uint16, rtt uint32) *netlink.InetDiagTCPInfoResp {
		cookie++
		return &netlink.InetDiagTCPInfoResp{
			InetDiagMsg: &netlink.Socket{State: state, ID: netlink.SocketID{
				Source: net.ParseIP(src), SourcePort: sport,
				Destination: net.ParseIP(dst), DestinationPort: dport,
				Cookie: [2]uint32{cookie, 0},
			}},
			TCPInfo: &netlink.TCPInfo{Rtt: rtt, Min_rtt: ^uint32(0)},
		}
	}
	listener := sock(tcpListen, "::", 8080, "::", 0, 0)
	inbound4 := sock(tcpEstablished, "::ffff:10.0.0.1", 8080, "::ffff:10.0.0.9", 41000, 100)
	inbound6 := sock(tcpEstablished, "fd00::1", 8080, "fd00::9", 41001, 200)
	outgoing := sock(tcpEstablished, "10.0.0.1", 50000, "10.0.0.50", 5432, 300)
	loopback := sock(tcpEstablished, "127.0.0.1", 8080, "127.0.0.1", 41002, 1)
	self := sock(tcpEstablished, "10.0.0.1", 8080, "10.0.0.1", 41003, 1)
	closing := sock(8 /* CLOSE_WAIT */, "10.0.0.1", 8080, "10.0.0.8", 41004, 1)
	noInfo := sock(tcpEstablished, "10.0.0.1", 8080, "10.0.0.7", 41005, 1)
	noInfo.TCPInfo = nil
	all := []*netlink.InetDiagTCPInfoResp{listener, inbound4, inbound6, outgoing, loopback, self, closing, noInfo, inbound4 /* an interrupted dump's twin */}

	remotes := func(cs []conn) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.remote.String())
		}
		return out
	}
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{"all", Options{}, []string{"10.0.0.9:41000", "[fd00::9]:41001", "10.0.0.50:5432"}},
		{"inbound", Options{Inbound: true}, []string{"10.0.0.9:41000", "[fd00::9]:41001"}},
		{"ports", Options{LocalPorts: []uint16{8080}}, []string{"10.0.0.9:41000", "[fd00::9]:41001"}},
		{"other port", Options{LocalPorts: []uint16{50000}}, []string{"10.0.0.50:5432"}},
		{"other port, inbound", Options{LocalPorts: []uint16{50000}, Inbound: true}, nil},
	} {
		got := remotes(pick(all, tc.o))
		if len(got) != len(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
	cs := pick([]*netlink.InetDiagTCPInfoResp{inbound4}, Options{})
	if cs[0].rtt != 100*us || cs[0].minRTT != 0 || cs[0].local != netip.MustParseAddrPort("10.0.0.1:8080") {
		t.Errorf("connection read as %+v", cs[0])
	}
}

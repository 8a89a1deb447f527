// Package clientrtt measures the round-trip time a container's own clients
// see, from the kernel, and probes round trips to an address from here.
//
// Clients lists a network namespace's ESTABLISHED TCP connections through
// sock_diag (NETLINK_SOCK_DIAG, inet_diag with INET_DIAG_INFO, IPv4 and
// IPv6) and groups them by the remote IP: the kernel's own RTT estimates
// (struct tcp_info's tcpi_rtt, tcpi_rttvar, tcpi_min_rtt), read without
// touching the application. Only the netlink socket is made in the
// namespace (netlink.NewHandleAt: one setns there and back on a locked
// thread); the calling thread never stays in it.
//
//	cs, err := clientrtt.ClientsAt("/proc/1234/ns/net", clientrtt.Options{Inbound: true})
//
// A service's clients are the connections to its listening ports: with
// Options.Inbound only connections whose local port has a listening socket
// in the namespace count, and Options.LocalPorts names the ports instead
// (or as well); an outgoing connection to a database is no client.
// Connections to a loopback address, or from the namespace to one of its
// own addresses, are never clients: a move changes nothing of their
// latency.
//
// What the numbers mean, per client (a remote IP, any port):
//   - RTT is the median over its connections of the kernel's smoothed RTT
//     (srtt): what the client sees now, queueing included. The median, not
//     the minimum, so that one connection holding a bulk transfer (its srtt
//     inflated by its own queue) or one gone quiet (its srtt stale) moves
//     it no more than any other; with one or two connections it is their
//     mean.
//   - MinRTT is the lowest tcpi_min_rtt of its connections: the path's
//     floor, what placement should compare between hosts, as no queue
//     counts in it.
//   - RTTVar is the median of the connections' tcpi_rttvar: jitter.
//   - Idle is how long since any of its connections last received data: an
//     RTT is only refreshed by traffic, so a long idle client's RTT is old.
//
// An RTT comes from a TCP connection's traffic; a connection that carried
// only its handshake has the handshake's sample. The kernel keeps srtt in
// microseconds, so a veth's few tens of microseconds are measured.
//
// Probe measures round trips from the calling thread's network namespace
// to an address: TCP connects to a port (a refused connection, a RST, is a
// round trip too) or ICMP echoes. A candidate host uses it for its own
// distance to a container's clients, and it serves a service with no
// long-lived connections to read. See probe.go.
package clientrtt

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Options choose which of a namespace's connections are clients.
type Options struct {
	// LocalPorts keeps only connections whose local port is one of these
	// (a service's listening ports). Empty: any local port.
	LocalPorts []uint16
	// Inbound keeps only connections whose local port has a listening
	// socket in the namespace: those a listener accepted.
	Inbound bool
}

// Client is one remote address's connections to the namespace.
type Client struct {
	Addr          netip.Addr    // the remote IP (an IPv4-mapped IPv6 address as IPv4)
	Conns         int           // its established connections
	RTT           time.Duration // median of the connections' smoothed RTT
	MinRTT        time.Duration // lowest of their minimum RTTs; 0 if none has one
	RTTVar        time.Duration // median of their RTT variation
	Idle          time.Duration // since the last data any of them received
	BytesAcked    uint64        // what the client acknowledged, all connections
	BytesReceived uint64        // what the namespace received from it, all connections
}

// Clients lists the clients of the network namespace ns, most
// connections first, then by address.
func Clients(ns netns.NsHandle, o Options) ([]Client, error) {
	conns, err := established(ns, o)
	if err != nil {
		return nil, err
	}
	return aggregate(conns), nil
}

// ClientsAt is Clients for the namespace at path (/proc/PID/ns/net, a
// named namespace's /run/netns/NAME).
func ClientsAt(path string, o Options) ([]Client, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer ns.Close()
	return Clients(ns, o)
}

// conn is what aggregation needs of one established connection.
type conn struct {
	local, remote   netip.AddrPort
	rtt, rttvar     time.Duration
	minRTT          time.Duration // 0: no sample
	lastRecv        time.Duration
	acked, received uint64
}

// The kernel's TCP states (include/net/tcp_states.h).
const (
	tcpEstablished = 1
	tcpListen      = 10
)

// dumpRetries bounds the dumps redone when the kernel says one was
// interrupted (sockets came and went under it); the last one is used as
// it is, duplicates dropped by socket cookie.
const dumpRetries = 3

// established reads the namespace's established TCP connections that o
// keeps as clients' connections.
func established(ns netns.NsHandle, o Options) ([]conn, error) {
	// The family must be named: a Handle without a socket of
	// NETLINK_INET_DIAG would quietly use one made in the caller's own
	// namespace.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_INET_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag socket in the namespace: %w", err)
	}
	defer h.Close()
	if err := h.SetSocketTimeout(5 * time.Second); err != nil {
		return nil, fmt.Errorf("sock_diag socket timeout: %w", err)
	}

	var socks []*netlink.InetDiagTCPInfoResp
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		var got []*netlink.InetDiagTCPInfoResp
		for try := 0; ; try++ {
			got, err = h.SocketDiagTCPInfo(family)
			if !errors.Is(err, netlink.ErrDumpInterrupted) || try == dumpRetries {
				break
			}
		}
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("sock_diag TCP dump: %w", err)
		}
		socks = append(socks, got...)
	}
	return pick(socks, o), nil
}

// pick turns a dump's sockets into the clients' connections o asks for.
func pick(socks []*netlink.InetDiagTCPInfoResp, o Options) []conn {
	listening := map[uint16]bool{}
	for _, s := range socks {
		if s.InetDiagMsg != nil && s.InetDiagMsg.State == tcpListen {
			listening[s.InetDiagMsg.ID.SourcePort] = true
		}
	}
	seen := map[[2]uint32]bool{}
	var out []conn
	for _, s := range socks {
		m := s.InetDiagMsg
		if m == nil || m.State != tcpEstablished || s.TCPInfo == nil || seen[m.ID.Cookie] {
			continue
		}
		seen[m.ID.Cookie] = true
		port := m.ID.SourcePort
		if len(o.LocalPorts) > 0 && !slices.Contains(o.LocalPorts, port) || o.Inbound && !listening[port] {
			continue
		}
		local, remote := addrPort(m.ID.Source, port), addrPort(m.ID.Destination, m.ID.DestinationPort)
		if !remote.IsValid() || remote.Addr().IsLoopback() || remote.Addr() == local.Addr() {
			continue
		}
		out = append(out, fromInfo(local, remote, s.TCPInfo))
	}
	return out
}

// fromInfo reads a connection's tcp_info: times in microseconds, but the
// last receive's in milliseconds.
func fromInfo(local, remote netip.AddrPort, ti *netlink.TCPInfo) conn {
	c := conn{
		local:    local,
		remote:   remote,
		rtt:      time.Duration(ti.Rtt) * time.Microsecond,
		rttvar:   time.Duration(ti.Rttvar) * time.Microsecond,
		lastRecv: time.Duration(ti.Last_data_recv) * time.Millisecond,
		acked:    ti.Bytes_acked,
		received: ti.Bytes_received,
	}
	// ~0U until the connection has a sample; 0 from kernels older than
	// tcpi_min_rtt.
	if ti.Min_rtt != ^uint32(0) {
		c.minRTT = time.Duration(ti.Min_rtt) * time.Microsecond
	}
	return c
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a.Unmap(), port)
}

// aggregate groups connections by remote IP.
func aggregate(conns []conn) []Client {
	by := map[netip.Addr][]conn{}
	for _, c := range conns {
		by[c.remote.Addr()] = append(by[c.remote.Addr()], c)
	}
	out := make([]Client, 0, len(by))
	for addr, cs := range by {
		cl := Client{Addr: addr, Conns: len(cs), Idle: cs[0].lastRecv}
		rtts := make([]time.Duration, 0, len(cs))
		vars := make([]time.Duration, 0, len(cs))
		for _, c := range cs {
			rtts = append(rtts, c.rtt)
			vars = append(vars, c.rttvar)
			if c.minRTT > 0 && (cl.MinRTT == 0 || c.minRTT < cl.MinRTT) {
				cl.MinRTT = c.minRTT
			}
			cl.Idle = min(cl.Idle, c.lastRecv)
			cl.BytesAcked += c.acked
			cl.BytesReceived += c.received
		}
		cl.RTT, cl.RTTVar = median(rtts), median(vars)
		out = append(out, cl)
	}
	slices.SortFunc(out, func(a, b Client) int {
		if c := cmp.Compare(b.Conns, a.Conns); c != 0 {
			return c
		}
		return a.Addr.Compare(b.Addr)
	})
	return out
}

// median of ds (sorted in place); an even count's is the mean of the
// middle two. 0 for none.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	n := len(ds)
	if n%2 == 1 {
		return ds[n/2]
	}
	return (ds[n/2-1] + ds[n/2]) / 2
}

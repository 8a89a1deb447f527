package clientrtt

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// ProbeOptions say how Probe measures.
type ProbeOptions struct {
	// Port, if set, measures TCP connects to it; 0 measures ICMP echoes.
	Port uint16
	// Count is the samples taken; 0 means 5.
	Count int
	// Interval is the time between samples' starts; 0 means 100 ms.
	Interval time.Duration
	// Timeout is how long a sample waits for its answer; 0 means 1 s.
	Timeout time.Duration
}

// ProbeResult is what Probe measured.
type ProbeResult struct {
	Sent, Received int           // samples tried, and answered
	Refused        int           // TCP samples answered with a RST (among Received)
	Median, Min    time.Duration // over the answered samples
	Samples        []time.Duration
}

// ErrNoAnswer is Probe's error when no sample was answered.
var ErrNoAnswer = errors.New("no answer")

// Probe measures the round trip from the calling thread's network
// namespace to addr, Count times, and reports the median and minimum.
//
// A TCP sample is a connect to addr's port: connected, its round trip is
// the kernel's measurement of the handshake (SYN to SYN-ACK, tcpi_rtt,
// free of this process's scheduling), and the connection is then reset
// (SO_LINGER 0: no TIME_WAIT left here, the server sees a reset after
// accepting); refused (ECONNREFUSED: a RST came back) it is the time
// connect took, a round trip just the same, timed here (with this
// process's wake-up in it: about 0.1 ms on the tests' veth, where the
// kernel's handshake sample is 20-40 µs). A host that drops the SYN
// gives no sample. An ICMP sample is an echo request and its reply, timed
// here (tens of microseconds of scheduling in it); it uses an unprivileged
// ping socket where the kernel allows one (replies sorted out by the
// kernel), a raw socket otherwise (root).
//
// It fails only if no sample was answered (ErrNoAnswer, wrapping the last
// sample's error) or ctx ended first; the result says how many were.
func Probe(ctx context.Context, addr netip.Addr, o ProbeOptions) (ProbeResult, error) {
	if o.Count <= 0 {
		o.Count = 5
	}
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	addr = addr.Unmap()
	var sample func(context.Context, int) (rtt time.Duration, refused bool, err error)
	if o.Port != 0 {
		sample = func(ctx context.Context, _ int) (time.Duration, bool, error) {
			return tcpSample(ctx, netip.AddrPortFrom(addr, o.Port), o.Timeout)
		}
	} else {
		e, err := newEchoer(addr)
		if err != nil {
			return ProbeResult{}, err
		}
		defer e.close()
		sample = func(ctx context.Context, seq int) (time.Duration, bool, error) {
			rtt, err := e.echo(ctx, seq, o.Timeout)
			return rtt, false, err
		}
	}

	var r ProbeResult
	var last error
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for i := range o.Count {
		if i > 0 {
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-tick.C:
			}
		}
		r.Sent++
		rtt, refused, err := sample(ctx, i)
		if err != nil {
			if ctx.Err() != nil {
				return r, ctx.Err()
			}
			last = err
			continue
		}
		r.Received++
		if refused {
			r.Refused++
		}
		r.Samples = append(r.Samples, rtt)
	}
	if r.Received == 0 {
		return r, fmt.Errorf("probe %s: %w: %w", addr, ErrNoAnswer, last)
	}
	sorted := slices.Clone(r.Samples)
	r.Min = slices.Min(sorted)
	r.Median = median(sorted)
	return r, nil
}

// tcpSample is one connect to ap.
func tcpSample(ctx context.Context, ap netip.AddrPort, timeout time.Duration) (time.Duration, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var start time.Time
	// The clock starts after the socket is made, just before its connect.
	d := net.Dialer{Control: func(string, string, syscall.RawConn) error { start = time.Now(); return nil }}
	c, err := d.DialContext(ctx, "tcp", ap.String())
	took := time.Since(start)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return took, true, nil
	}
	if err != nil {
		return 0, false, err
	}
	tc := c.(*net.TCPConn)
	defer tc.Close()
	_ = tc.SetLinger(0)
	rtt, err := handshakeRTT(tc)
	if err != nil || rtt == 0 {
		// No sample of the kernel's (a SYN sent again: Karn's rule).
		return took, false, nil
	}
	return rtt, false, nil
}

// handshakeRTT is the kernel's RTT of a connection that has carried only
// its handshake: its one sample, the SYN's.
func handshakeRTT(c *net.TCPConn) (time.Duration, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var ti *unix.TCPInfo
	var serr error
	if err := raw.Control(func(fd uintptr) {
		ti, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return time.Duration(ti.Rtt) * time.Microsecond, nil
}

// echoer sends ICMP echo requests to one address and waits for their
// replies.
type echoer struct {
	c     *icmp.PacketConn
	dst   net.Addr
	v6    bool
	id    int
	token []byte // in every request's data: a raw socket sees every reply to this host
}

func newEchoer(addr netip.Addr) (*echoer, error) {
	e := &echoer{v6: addr.Is6(), id: os.Getpid() & 0xffff, token: make([]byte, 16)}
	_, _ = rand.Read(e.token)
	dgram, raw, wildcard := "udp4", "ip4:icmp", "0.0.0.0"
	if e.v6 {
		dgram, raw, wildcard = "udp6", "ip6:ipv6-icmp", "::"
	}
	c, err := icmp.ListenPacket(dgram, wildcard)
	if err == nil {
		e.dst = &net.UDPAddr{IP: addr.AsSlice(), Zone: addr.Zone()}
	} else if c, err = icmp.ListenPacket(raw, wildcard); err == nil {
		e.dst = &net.IPAddr{IP: addr.AsSlice(), Zone: addr.Zone()}
	} else {
		return nil, fmt.Errorf("ICMP socket (neither a ping socket nor a raw one): %w", err)
	}
	e.c = c
	return e, nil
}

func (e *echoer) close() { e.c.Close() }

func (e *echoer) echo(ctx context.Context, seq int, timeout time.Duration) (time.Duration, error) {
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	proto := 1 // ICMP
	if e.v6 {
		typ, reply, proto = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply, 58
	}
	data := append(slices.Clone(e.token), strconv.Itoa(seq)...)
	msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: e.id, Seq: seq & 0xffff, Data: data}}).Marshal(nil)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := e.c.SetReadDeadline(deadline); err != nil {
		return 0, err
	}
	// A cancelled ctx ends the wait at once, not at the deadline.
	stop := context.AfterFunc(ctx, func() { _ = e.c.SetReadDeadline(time.Now()) })
	defer stop()
	start := time.Now()
	if _, err := e.c.WriteTo(msg, e.dst); err != nil {
		return 0, fmt.Errorf("ICMP echo to %s: %w", e.dst, err)
	}
	buf := make([]byte, 1500)
	for {
		n, _, err := e.c.ReadFrom(buf)
		if err != nil {
			return 0, fmt.Errorf("ICMP echo reply from %s: %w", e.dst, err)
		}
		took := time.Since(start)
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != reply {
			continue
		}
		// A ping socket's ID is the kernel's, and its replies are ours
		// alone; the data tells ours from others' on a raw socket.
		if b, ok := m.Body.(*icmp.Echo); ok && b.Seq == seq&0xffff && string(b.Data) == string(data) {
			return took, nil
		}
	}
}

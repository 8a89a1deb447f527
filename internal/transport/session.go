package transport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/time/rate"
)

// Hello is exchanged once per connection, before multiplexing starts.
type Hello struct {
	Version int    `json:"version"`
	Name    string `json:"name"` // host name of the agent, or "cli"
	Role    string `json:"role"` // "agent" or "cli"
	// Addrs are the other addresses an accepting agent listens on: a
	// striped session spreads its connections over them.
	Addrs []string `json:"addrs,omitempty"`
	// Stripe asks for, or joins, a session striped over several TCP
	// connections (streams.go).
	Stripe *StripeHello `json:"stripe,omitempty"`
}

// Session is one connection between two ferry endpoints, multiplexed into
// channels. It counts the bytes that cross it, for migration reports.
type Session struct {
	Peer Hello
	mux  *yamux.Session
	conn *countingConn
	// certName is the host the peer's certificate proves ("" without TLS);
	// multipath says the connection is MPTCP.
	certName  string
	multipath bool
	// operator says the peer's certificate is an operator's.
	operator bool
	outage   time.Duration
}

type countingConn struct {
	net.Conn
	sent, received atomic.Int64
	// limit, when set, caps the rate of writes (bytes per second).
	limit atomic.Pointer[rate.Limiter]
	// batch, when set, is under Conn's TLS: each write's records leave
	// together.
	batch *batchedConn
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.received.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	lim := c.limit.Load()
	if lim == nil {
		return c.write(p)
	}
	// Paced in bursts of at most the limiter's burst size.
	done := 0
	for done < len(p) {
		n := min(len(p)-done, lim.Burst())
		if err := lim.WaitN(context.Background(), n); err != nil {
			return done, err
		}
		w, err := c.write(p[done : done+n])
		done += w
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// write passes p to Conn, its TLS records gathered into one write.
func (c *countingConn) write(p []byte) (int, error) {
	if c.batch != nil {
		c.batch.hold()
	}
	n, err := c.Conn.Write(p)
	if c.batch != nil {
		if rerr := c.batch.release(); err == nil {
			err = rerr
		}
	}
	c.sent.Add(int64(n))
	return n, err
}

// Lost reports whether the session has ended (peer gone, or the network
// carried nothing for the outage timeout).
func (s *Session) Lost() bool {
	select {
	case <-s.mux.CloseChan():
		return true
	default:
		return false
	}
}

// OutageTimeout is how long the session waits out a network that carries
// nothing before it ends (Config.OutageTimeout).
func (s *Session) OutageTimeout() time.Duration { return s.outage }

func muxConfig(outage time.Duration) *yamux.Config {
	cfg := yamux.DefaultConfig()
	// A migration stream is bulk data: a large window keeps a fast link full.
	cfg.MaxStreamWindowSize = 16 << 20
	// A keepalive ping unanswered for the outage timeout ends the session,
	// as does a write stuck that long.
	timeout := outage
	cfg.ConnectionWriteTimeout = timeout
	cfg.KeepAliveInterval = min(5*time.Second, max(timeout/4, 100*time.Millisecond))
	cfg.LogOutput = io.Discard
	return cfg
}

// handshake exchanges Hello messages on the raw connection.
func handshake(conn net.Conn, local Hello) (Hello, error) {
	local.Version = ProtocolVersion
	ch := newChannel(conn)
	ch.maxControl = MaxPayload // a Hello is small; the peer is not verified yet
	ch.Kind = "hello"
	errc := make(chan error, 1)
	go func() { errc <- ch.Send(local) }()
	peer, err := recvHello(conn, ch)
	if err != nil {
		return peer, named(err, local.Name, cmp.Or(peer.Name, conn.RemoteAddr().String()))
	}
	if err := <-errc; err != nil {
		return peer, fmt.Errorf("handshake with %s: %w", conn.RemoteAddr(), err)
	}
	if peer.Version != ProtocolVersion {
		return peer, fmt.Errorf("handshake with %s: %w", conn.RemoteAddr(), &VersionError{Peer: peer.Version, PeerName: peer.Name, LocalName: local.Name})
	}
	return peer, nil
}

// named fills the hosts' names into a VersionError inside err.
func named(err error, local, peer string) error {
	var v *VersionError
	if errors.As(err, &v) {
		v.LocalName, v.PeerName = cmp.Or(v.LocalName, local), cmp.Or(v.PeerName, peer)
	}
	return err
}

// recvHello reads the peer's Hello, waiting at most 10 s.
func recvHello(conn net.Conn, ch *Channel) (Hello, error) {
	var peer Hello
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	err := ch.Recv(&peer)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		return peer, fmt.Errorf("handshake with %s: %w", conn.RemoteAddr(), err)
	}
	return peer, nil
}

// acceptHandshake is the accepting side's handshake: it reads the peer's
// Hello, lets admit act on it, then answers. A striped session registers
// itself in admit, so no connection can try to join it before it exists.
func acceptHandshake(conn net.Conn, local Hello, admit func(Hello) error) (Hello, error) {
	local.Version = ProtocolVersion
	ch := newChannel(conn)
	ch.maxControl = MaxPayload // a Hello is small; the peer is not verified yet
	ch.Kind = "hello"
	peer, err := recvHello(conn, ch)
	if err != nil {
		if _, ok := errors.AsType[*VersionError](err); ok {
			// An older peer cannot read this Hello either, and says so
			// with both versions: it hears why instead of a closed
			// connection.
			_ = ch.Send(local)
		}
		return peer, named(err, local.Name, cmp.Or(peer.Name, conn.RemoteAddr().String()))
	}
	if peer.Version != ProtocolVersion {
		_ = ch.Send(local) // so that the peer can say what is wrong too
		return peer, fmt.Errorf("handshake with %s: %w", conn.RemoteAddr(), &VersionError{Peer: peer.Version, PeerName: peer.Name, LocalName: local.Name})
	}
	if err := admit(peer); err != nil {
		return peer, err
	}
	if err := ch.Send(local); err != nil {
		return peer, fmt.Errorf("handshake with %s: %w", conn.RemoteAddr(), err)
	}
	return peer, nil
}

// startMux multiplexes channels over conn once the Hellos are exchanged.
func startMux(conn net.Conn, peer Hello, client bool, c *Config, certName string) (*Session, error) {
	cc := &countingConn{Conn: conn, batch: batchUnder(conn)}
	var mux *yamux.Session
	var err error
	if client {
		mux, err = yamux.Client(cc, muxConfig(c.OutageTimeout))
	} else {
		mux, err = yamux.Server(cc, muxConfig(c.OutageTimeout))
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &Session{Peer: peer, mux: mux, conn: cc, certName: certName, multipath: IsMultipath(conn), outage: c.OutageTimeout}, nil
}

// SplitAddr tells a unix socket path ("/run/x.sock", "unix:///run/x.sock")
// from a TCP address ("10.0.0.1:7070").
func SplitAddr(addr string) (network, address string) {
	if strings.HasPrefix(addr, "unix://") {
		return "unix", strings.TrimPrefix(addr, "unix://")
	}
	if strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "./") {
		return "unix", addr
	}
	return "tcp", addr
}

// dialAgent connects to an agent's address, over MPTCP when asked (and the
// kernel has it).
func dialAgent(ctx context.Context, addr string, multipath bool) (net.Conn, error) {
	network, address := SplitAddr(addr)
	d := net.Dialer{Timeout: 5 * time.Second}
	if multipath && network == "tcp" {
		d.SetMultipathTCP(true)
		d.Control = fixedReceiveBuffer
	}
	conn, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("cannot reach ferry agent at %s: %w", addr, err)
	}
	return conn, nil
}

// stripes says whether a session on conn, just dialed, runs striped.
func stripes(conn net.Conn, po PathOptions) bool {
	if po.Streams < 2 || IsMultipath(conn) {
		return false
	}
	_, isTCP := underTLS(conn).(*net.TCPConn)
	return isTCP
}

// Open starts a new channel of the given kind.
func (s *Session) Open(kind string) (*Channel, error) {
	st, err := s.mux.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open %s channel: %w", kind, err)
	}
	ch := newChannel(st)
	ch.Kind = kind
	if err := ch.Send(kind); err != nil {
		st.Close()
		return nil, err
	}
	return ch, nil
}

// Accept waits for the peer to open a channel.
func (s *Session) Accept() (*Channel, error) {
	st, err := s.mux.AcceptStream()
	if err != nil {
		return nil, err
	}
	ch := newChannel(st)
	if err := ch.Recv(&ch.Kind); err != nil {
		st.Close()
		return nil, err
	}
	return ch, nil
}

// SetMaxBandwidth caps what this side sends, in bits per second (0: no
// cap), like QEMU's max-bandwidth: a migration then leaves room for other
// traffic on the link.
func (s *Session) SetMaxBandwidth(bps int64) {
	if bps <= 0 {
		s.conn.limit.Store(nil)
		return
	}
	bytesPerSec := float64(bps) / 8
	// A burst of ~10 ms keeps the pacing smooth without a syscall per KiB.
	burst := max(int(bytesPerSec/100), 64<<10)
	s.conn.limit.Store(rate.NewLimiter(rate.Limit(bytesPerSec), burst))
}

// BytesSent is every byte written to the connection, framing included.
func (s *Session) BytesSent() int64 { return s.conn.sent.Load() }

// BytesReceived is every byte read from the connection.
func (s *Session) BytesReceived() int64 { return s.conn.received.Load() }

// RTT measures the session's round trip now (a yamux ping).
func (s *Session) RTT() (time.Duration, error) { return s.mux.Ping() }

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.mux.CloseChan() }

// Close ends the session and its connection.
func (s *Session) Close() error { return s.mux.Close() }

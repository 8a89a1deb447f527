package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// DefaultOutageTimeout is how long a session outlives a network outage.
const DefaultOutageTimeout = 30 * time.Second

// Config is how one endpoint makes and accepts sessions, in the manner of
// yamux's: made once (DefaultConfig, then changed), checked by
// VerifyConfig, handed to Dial or NewServer. Nothing of it lives in the
// package, so two endpoints in one process (tests, the lab) differ freely.
type Config struct {
	// Hello introduces this end: its host name and role, and for an
	// accepting agent the other addresses it listens on (a striped
	// session spreads over them). With Security, an empty Name is the
	// certificate's.
	Hello Hello
	// Security, when set, runs every TCP connection over mutual TLS 1.3,
	// and a peer is the host (or operator) its certificate proves. Unix
	// sockets never use it: their file mode guards them. nil is plaintext
	// (tests, and agents started with --insecure).
	Security *Security
	// Paths says how a dialed session reaches its peer (MPTCP, or TCP
	// striped over several connections); an accepting end takes MPTCP
	// when Paths.Multipath is set.
	Paths PathOptions
	// OutageTimeout is how long a session waits out a network that
	// carries nothing (every path down) before it ends. Within it TCP (or
	// MPTCP) retransmits and the transfer carries on where it stopped;
	// past it the migration aborts (the source resumes the container
	// unless the destination had committed).
	OutageTimeout time.Duration
}

// DefaultConfig is a plaintext endpoint with the default outage timeout.
func DefaultConfig() *Config {
	return &Config{OutageTimeout: DefaultOutageTimeout}
}

// VerifyConfig says what is wrong with c, if anything.
func VerifyConfig(c *Config) error {
	if c == nil {
		return errors.New("transport: no config")
	}
	if c.OutageTimeout <= 0 {
		return fmt.Errorf("transport: outage timeout must be positive, got %v", c.OutageTimeout)
	}
	if c.Paths.Streams < 0 {
		return fmt.Errorf("transport: streams must not be negative, got %d", c.Paths.Streams)
	}
	if s := c.Security; s != nil && c.Hello.Name != "" && c.Hello.Name != s.Name {
		return fmt.Errorf("transport: this end calls itself %q but its certificate is for %q", c.Hello.Name, s.Name)
	}
	return nil
}

// hello is what this end says of itself.
func (c *Config) hello() Hello {
	h := c.Hello
	if h.Name == "" && c.Security != nil {
		h.Name = c.Security.Name
	}
	return h
}

// Dial connects to the endpoint at to and starts a session. to is a unix
// socket ("/run/ferry/agent.sock", "unix://..."), or a TCP address as ADDR
// or NAME@ADDR: then the peer must prove it is host NAME (by its
// certificate with Security; without, only its word, which proves
// nothing). TCP sessions run as c.Paths asks.
func Dial(ctx context.Context, to string, c *Config) (*Session, error) {
	if err := VerifyConfig(c); err != nil {
		return nil, err
	}
	addr, name := to, ""
	if network, _ := SplitAddr(to); network == "tcp" {
		if n, a, ok := strings.Cut(to, "@"); ok {
			name, addr = n, a
		}
	}
	po := c.Paths
	secure := c.Security != nil
	if network, _ := SplitAddr(addr); network == "unix" {
		po, secure = PathOptions{}, false
	}
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		raw, err := dialAgent(ctx, addr, po.Multipath)
		if err != nil || !secure {
			return raw, err
		}
		conn := tls.Client(newBatchedConn(raw), c.Security.ClientConfig(name))
		hctx, cancel := context.WithTimeout(ctx, tlsHandshakeTimeout)
		err = conn.HandshakeContext(hctx)
		cancel()
		if err != nil {
			raw.Close()
			return nil, explainRefusal(addr, c.Security.Name, err)
		}
		return conn, nil
	}
	conn, err := dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	// In TLS 1.3 the server judges the client's certificate after the
	// client's handshake is done: a refusal arrives on the first read, in
	// the Hello exchange.
	var sess *Session
	if stripes(conn, po) {
		sess, err = dialStriped(ctx, conn, addr, c, po.Streams, dial)
	} else {
		sess, err = Client(conn, c)
	}
	if err != nil {
		if secure {
			return nil, explainRefusal(addr, c.Security.Name, err)
		}
		return nil, err
	}
	if secure {
		err = checkHelloName(sess)
	} else if name != "" && sess.Peer.Name != name {
		err = fmt.Errorf("it says it is %q, not %q (plaintext: nothing proves either)", sess.Peer.Name, name)
	}
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("agent at %s: %w", addr, err)
	}
	return sess, nil
}

// Client starts the dialing side of a session on a connection already
// open (a pipe in tests; Dial for addresses).
func Client(conn net.Conn, c *Config) (*Session, error) {
	if err := VerifyConfig(c); err != nil {
		conn.Close()
		return nil, err
	}
	peer, err := handshake(conn, c.hello())
	if err != nil {
		conn.Close()
		return nil, err
	}
	return startMux(conn, peer, true, c, PeerName(conn))
}

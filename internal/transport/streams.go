package transport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ferry-migrate/ferry/internal/transport/stripe"
)

// Where MPTCP is missing (or turned off), a session can run over several
// TCP connections at once, striped by package stripe: the dialer opens the
// first connection with a StripeHello naming a new striped session, then
// the others with Join set; the accepting side attaches each joining
// connection to the session it names, after checking that it comes from the
// same peer. A lost connection is re-dialed by the dialer for as long as the
// outage timeout allows, over the next of the addresses the peer listens on.

// StripeHello, in a Hello, asks for a striped session or joins one.
type StripeHello struct {
	ID   string `json:"id"`             // chosen by the dialer, random
	Join bool   `json:"join,omitempty"` // another connection of session ID
}

// PathOptions say how a session reaches its peer.
type PathOptions struct {
	// Multipath asks for MPTCP; where either end lacks it the connection
	// is plain TCP (or striped, with Streams).
	Multipath bool
	// Streams, when 2 or more, stripes the session over that many TCP
	// connections whenever it does not run over MPTCP.
	Streams int
}

// ErrJoined is what Server returns for a connection that joined a striped
// session already running: there is no new session to serve.
var ErrJoined = errors.New("transport: connection joined a striped session")

// stripedSessions are a Server's accepted striped sessions, by ID.
type stripedSessions struct {
	sync.Mutex
	m map[string]*stripedSession
}

type stripedSession struct {
	conn *stripe.Conn
	peer string // the certificate name of its first connection
}

func stripeOptions(c *Config) stripe.Options {
	return stripe.Options{OutageTimeout: c.OutageTimeout}
}

// admit finds the striped session a joining connection names, or
// registers the new one a first connection asks for.
func (ss *stripedSessions) admit(conn net.Conn, sh *StripeHello, c *Config) (*stripedSession, error) {
	ss.Lock()
	defer ss.Unlock()
	s := ss.m[sh.ID]
	if sh.Join {
		if s == nil {
			return nil, fmt.Errorf("connection from %s joins an unknown striped session", conn.RemoteAddr())
		}
		if got := PeerName(conn); got != s.peer {
			return nil, fmt.Errorf("connection from %s (certificate %q) joins a striped session of %q", conn.RemoteAddr(), got, s.peer)
		}
		return s, nil
	}
	if peerOperator(conn) {
		return nil, fmt.Errorf("connection from %s: an operator's session is not striped", conn.RemoteAddr())
	}
	if sh.ID == "" || s != nil {
		return nil, fmt.Errorf("connection from %s asks for a striped session with a bad or used id %q", conn.RemoteAddr(), sh.ID)
	}
	sc := stripe.New(stripeOptions(c))
	s = &stripedSession{conn: sc, peer: PeerName(conn)}
	ss.m[sh.ID] = s
	go func() {
		<-sc.Done()
		ss.Lock()
		delete(ss.m, sh.ID)
		ss.Unlock()
	}()
	return s, nil
}

// attach adds an accepted connection to the striped session: a joining one
// is served there (ErrJoined), the first one starts the session.
func (s *stripedSession) attach(conn net.Conn, peer Hello, c *Config) (*Session, error) {
	if err := s.conn.Add(conn); err != nil {
		if !peer.Stripe.Join {
			s.conn.Close()
		}
		return nil, err
	}
	if peer.Stripe.Join {
		return nil, ErrJoined
	}
	return startMux(s.conn, peer, false, c, s.peer)
}

// dialStriped runs the dialing side of a striped session whose first
// connection, first, is open (and authenticated). dial opens (and
// authenticates) another connection to an address.
func dialStriped(ctx context.Context, first net.Conn, addr string, c *Config, streams int, dial func(ctx context.Context, addr string) (net.Conn, error)) (*Session, error) {
	local := c.hello()
	var id [16]byte
	_, _ = rand.Read(id[:])
	sh := StripeHello{ID: hex.EncodeToString(id[:])}
	hello := local
	hello.Stripe = &sh
	peer, err := handshake(first, hello)
	if err != nil {
		first.Close()
		return nil, err
	}
	addrs := pathAddrs(addr, peer.Addrs)
	certName := PeerName(first)
	var next atomic.Uint32
	join := func(ctx context.Context) (net.Conn, error) {
		a := addrs[int(next.Add(1))%len(addrs)]
		c, err := dial(ctx, a)
		if err != nil {
			return nil, err
		}
		if got := PeerName(c); got != certName {
			c.Close()
			return nil, fmt.Errorf("%s is %q, not %q", a, got, certName)
		}
		h := local
		h.Stripe = &StripeHello{ID: sh.ID, Join: true}
		if _, err := handshake(c, h); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	opts := stripeOptions(c)
	opts.Redial = join
	sc := stripe.New(opts)
	if err := sc.Add(first); err != nil {
		sc.Close()
		return nil, err
	}
	// The others join now; one that cannot is left to the re-dialing.
	for i := 1; i < streams; i++ {
		c, err := join(ctx)
		if err != nil {
			break
		}
		if err := sc.Add(c); err != nil {
			break
		}
	}
	return startMux(sc, peer, true, c, certName)
}

// pathAddrs lists where a striped session's connections go: the address
// dialed first, then the other addresses the peer listens on.
func pathAddrs(dialed string, advertised []string) []string {
	out := []string{dialed}
	for _, a := range advertised {
		if a != dialed {
			out = append(out, a)
		}
	}
	return out
}

// Streams is the number of connections a striped session runs over now
// (alive), 1 for any other session.
func (s *Session) Streams() int {
	sc, ok := s.conn.Conn.(*stripe.Conn)
	if !ok {
		return 1
	}
	n := 0
	for _, p := range sc.Paths() {
		if p.Alive {
			n++
		}
	}
	return n
}

// Transport names what the session runs over: "mptcp", "tcp", "striped
// tcp xN" (its connections when it started) or the network of another
// kind of connection ("unix").
func (s *Session) Transport() string {
	if sc, ok := s.conn.Conn.(*stripe.Conn); ok {
		return fmt.Sprintf("striped tcp x%d", len(sc.Paths()))
	}
	if s.multipath {
		return "mptcp"
	}
	return s.conn.LocalAddr().Network()
}

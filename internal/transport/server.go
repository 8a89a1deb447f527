package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
)

// Server accepts sessions for one endpoint on any number of listeners: a
// session striped over several connections may arrive on several of them
// (an agent listens on one address per path).
type Server struct {
	cfg     Config
	striped stripedSessions
}

// NewServer makes a Server with a copy of c.
func NewServer(c *Config) (*Server, error) {
	if err := VerifyConfig(c); err != nil {
		return nil, err
	}
	return &Server{cfg: *c, striped: stripedSessions{m: map[string]*stripedSession{}}}, nil
}

// Listen opens a listener for Dial's address forms: a unix socket as it
// is, a TCP address over TLS when the config has Security, over MPTCP
// when it asks for multipath (TCP clients are accepted either way).
// Accept runs each connection's handshakes: the listener's own Accept
// never blocks on a slow client.
func (s *Server) Listen(addr string) (net.Listener, error) {
	network, address := SplitAddr(addr)
	lc := net.ListenConfig{}
	if network == "tcp" && s.cfg.Paths.Multipath {
		lc = multipathListenConfig()
	}
	l, err := lc.Listen(context.Background(), network, address)
	if err != nil || network != "tcp" || s.cfg.Security == nil {
		return l, err
	}
	return tls.NewListener(batchedListener{l}, s.cfg.Security.ServerConfig()), nil
}

// Accept starts the accepting side of a session on a connection from one
// of the Server's listeners (or any connection: a pipe in tests). With
// Security it runs the TLS handshake first and refuses a TCP connection
// without TLS; a refused peer (no certificate, another CA, not allowed,
// not TLS 1.3, a Hello that names another host) gets an error that says
// why, for the log, and the connection is closed. A connection that
// joined a striped session returns ErrJoined: it is served there.
func (s *Server) Accept(conn net.Conn) (*Session, error) {
	tc, isTLS := conn.(*tls.Conn)
	if isTLS {
		ctx, cancel := context.WithTimeout(context.Background(), tlsHandshakeTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			tc.Close()
			return nil, fmt.Errorf("refused TLS connection from %s: %w", conn.RemoteAddr(), err)
		}
	} else if _, isTCP := conn.(*net.TCPConn); isTCP && s.cfg.Security != nil {
		conn.Close()
		return nil, fmt.Errorf("connection from %s is not TLS", conn.RemoteAddr())
	}
	var st *stripedSession
	peer, err := acceptHandshake(conn, s.cfg.hello(), func(peer Hello) (err error) {
		if peer.Stripe != nil {
			st, err = s.striped.admit(conn, peer.Stripe, &s.cfg)
		}
		return err
	})
	if err != nil {
		if st != nil && !peer.Stripe.Join {
			st.conn.Close() // registered, never used
		}
		conn.Close()
		return nil, err
	}
	var sess *Session
	if st != nil {
		sess, err = st.attach(conn, peer, &s.cfg)
	} else {
		sess, err = startMux(conn, peer, false, &s.cfg, PeerName(conn))
		if err == nil {
			sess.operator = peerOperator(conn)
		}
	}
	if err != nil {
		return nil, err
	}
	if isTLS {
		if err := checkHelloName(sess); err != nil {
			sess.Close()
			return nil, fmt.Errorf("refused connection from %s: %w", conn.RemoteAddr(), err)
		}
	}
	return sess, nil
}

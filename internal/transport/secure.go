package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/pki"
)

// tlsHandshakeTimeout bounds a TLS handshake, so a peer that connects and
// stays silent cannot hold a connection open.
const tlsHandshakeTimeout = 10 * time.Second

// Security is one host's identity for mutual TLS between agents: its
// certificate, the CA that signs every ferry host, and the hosts it lets in.
// A host is known by its certificate's CommonName.
type Security struct {
	CA   *x509.CertPool
	Cert tls.Certificate
	// Allowed names the hosts that may connect to this agent (as migration
	// sources). Empty lets in any host with a certificate from CA.
	Allowed []string
	// Name is this host, the CommonName of Cert.
	Name string
}

// LoadSecurity loads host's certificate and CA from dir (see pki.LoadTLS).
func LoadSecurity(dir, host string, allowed []string) (*Security, error) {
	b, err := pki.LoadTLS(dir, host)
	if err != nil {
		return nil, err
	}
	for _, a := range allowed {
		if err := pki.ValidHost(a); err != nil {
			return nil, fmt.Errorf("allowed source: %w", err)
		}
	}
	return &Security{CA: b.CA, Cert: b.Cert, Allowed: slices.Clone(allowed), Name: b.Name}, nil
}

// LoadOperator loads an operator's certificate and CA from dir (see
// pki.LoadOperator), for the CLI to dial an agent.
func LoadOperator(dir, name string) (*Security, error) {
	b, err := pki.LoadOperator(dir, name)
	if err != nil {
		return nil, err
	}
	return &Security{CA: b.CA, Cert: b.Cert, Name: b.Name}, nil
}

// ServerConfig is the TLS configuration of an agent's listener: TLS 1.3
// only, a client certificate from the CA required, and its host in Allowed.
func (s *Security) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{s.Cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    s.CA,
		// Clients keep no session cache; tickets would only cost bytes.
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			// The chain and client usage were verified before this runs.
			if len(cs.PeerCertificates) == 0 {
				return errors.New("transport: client sent no certificate")
			}
			name := cs.PeerCertificates[0].Subject.CommonName
			// Allowed names sources; an operator asks, never sends.
			if len(s.Allowed) > 0 && !slices.Contains(s.Allowed, name) && !pki.IsOperator(cs.PeerCertificates[0]) {
				return fmt.Errorf("host %q is not an allowed source for %s (allowed: %s)", name, s.Name, strings.Join(s.Allowed, ", "))
			}
			return nil
		},
	}
}

// ClientConfig is the TLS configuration for dialing an agent: TLS 1.3 only,
// this host's certificate offered, and the server's certificate verified
// against the CA. When serverName is not empty, the server's certificate
// must be for that host.
func (s *Security) ClientConfig(serverName string) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		RootCAs:    s.CA,
		ServerName: serverName,
		// Always present the certificate, even when the server names other
		// CAs, so a refusal is logged with its real reason.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &s.Cert, nil
		},
		// Hosts are identified by CommonName and reached by whatever address
		// the operator gives, so the standard DNS-name check does not fit.
		// VerifyConnection does the whole verification instead.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return s.verifyServer(cs, serverName)
		},
	}
	return cfg
}

func (s *Security) verifyServer(cs tls.ConnectionState, want string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("transport: server sent no certificate")
	}
	leaf := cs.PeerCertificates[0]
	opts := x509.VerifyOptions{
		Roots:         s.CA,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("server certificate for %q: %w", leaf.Subject.CommonName, err)
	}
	if want != "" && leaf.Subject.CommonName != want {
		return fmt.Errorf("server is host %q, expected %q", leaf.Subject.CommonName, want)
	}
	return nil
}

// checkHelloName makes the name a peer gives in its Hello match the host its
// certificate proves, so nothing downstream trusts a claimed name.
func checkHelloName(sess *Session) error {
	cert := sess.certName
	if sess.Peer.Name != cert {
		return fmt.Errorf("peer introduced itself as %q but its certificate is for host %q", sess.Peer.Name, cert)
	}
	return nil
}

// PeerName is the host named by the peer's certificate on a TLS connection
// whose handshake is complete, or "" otherwise. It is only an identity when
// the connection was set up with a Security configuration, which verifies
// the certificate.
func PeerName(conn net.Conn) string {
	c, ok := conn.(interface{ ConnectionState() tls.ConnectionState })
	if !ok {
		return ""
	}
	cs := c.ConnectionState()
	if !cs.HandshakeComplete || len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}

// peerOperator reports whether the peer of a TLS connection whose
// handshake is complete proved itself with an operator's certificate.
func peerOperator(conn net.Conn) bool {
	c, ok := conn.(interface{ ConnectionState() tls.ConnectionState })
	if !ok {
		return false
	}
	cs := c.ConnectionState()
	return cs.HandshakeComplete && len(cs.PeerCertificates) > 0 && pki.IsOperator(cs.PeerCertificates[0])
}

// PeerCertName is the host proved by the peer's TLS certificate, or "" when
// the session does not run over TLS.
func (s *Session) PeerCertName() string { return s.certName }

// PeerOperator reports whether the peer proved itself with an operator's
// certificate (pki.IssueOperator): a person's CLI, not another agent. Never
// true without TLS.
func (s *Session) PeerOperator() bool { return s.operator }

// Multipath reports whether the session's connection is MPTCP (false when
// either end or the kernel fell back to plain TCP).
func (s *Session) Multipath() bool { return s.multipath }

// IsMultipath reports whether conn, or the connection under its TLS layer,
// is an MPTCP connection.
func IsMultipath(conn net.Conn) bool {
	tcp, ok := underTLS(conn).(*net.TCPConn)
	if !ok {
		return false
	}
	mp, err := tcp.MultipathTCP()
	return err == nil && mp
}

// underTLS is the connection under conn's TLS layer, or conn itself.
func underTLS(conn net.Conn) net.Conn {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	if b, ok := conn.(*batchedConn); ok {
		return b.Conn
	}
	return conn
}

// explainRefusal turns the TLS alert a server sends when it refuses this
// host into an error that says what to check. The server's log has the
// precise reason.
func explainRefusal(addr, self string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		why := ""
		switch op.Err.Error() {
		case "tls: bad certificate":
			why = fmt.Sprintf("host %q is not an allowed source there (or its certificate is unusable)", self)
		case "tls: unknown certificate authority":
			why = fmt.Sprintf("the certificate of %q is not signed by the CA that agent trusts", self)
		case "tls: certificate required":
			why = "no client certificate was sent"
		case "tls: certificate expired":
			why = fmt.Sprintf("the certificate of %q has expired: issue a new one", self)
		case "tls: protocol version not supported":
			why = "it does not speak TLS 1.3"
		}
		if why != "" {
			return fmt.Errorf("agent at %s refused this host: %s: %w", addr, why, err)
		}
	}
	return fmt.Errorf("TLS with agent at %s: %w", addr, err)
}

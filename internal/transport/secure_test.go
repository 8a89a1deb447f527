package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/pki"
)

// testPKI is a CA with hosts h1, h2, h3, and a second, unrelated CA (with
// the same default name) that also issued an "h1".
type testPKI struct{ dir, otherDir string }

func newTestPKI(tb testing.TB) testPKI {
	tb.Helper()
	p := testPKI{dir: filepath.Join(tb.TempDir(), "ca"), otherDir: filepath.Join(tb.TempDir(), "other")}
	for _, d := range []string{p.dir, p.otherDir} {
		if err := pki.NewCA(d, ""); err != nil {
			tb.Fatal(err)
		}
	}
	loop := []net.IP{net.ParseIP("127.0.0.1")}
	for _, h := range []string{"h1", "h2", "h3"} {
		if err := pki.Issue(p.dir, filepath.Join(p.dir, h), h, loop, nil, time.Hour); err != nil {
			tb.Fatal(err)
		}
	}
	if err := pki.Issue(p.otherDir, filepath.Join(p.otherDir, "h1"), "h1", loop, nil, time.Hour); err != nil {
		tb.Fatal(err)
	}
	return p
}

func (p testPKI) sec(tb testing.TB, host string, allowed ...string) *Security {
	tb.Helper()
	s, err := LoadSecurity(p.dir, host, allowed)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

type accepted struct {
	sess *Session
	err  error
}

// secureServer runs an agent-like accept loop for sec on loopback and
// reports each connection's outcome.
func secureServer(tb testing.TB, sec *Security, multipath bool) (string, <-chan accepted) {
	tb.Helper()
	srv, l := listen(tb, cfg(Hello{Name: sec.Name, Role: "agent"}, sec, PathOptions{Multipath: multipath}), "127.0.0.1:0")
	return l.Addr().String(), serveSecure(tb, srv, []net.Listener{l})
}

// cfg is a test endpoint's Config.
func cfg(hello Hello, sec *Security, po PathOptions) *Config {
	c := DefaultConfig()
	c.Hello, c.Security, c.Paths = hello, sec, po
	return c
}

// at is a Dial address that asks the peer to prove it is name.
func at(name, addr string) string {
	if name == "" {
		return addr
	}
	return name + "@" + addr
}

// listen starts a Server for c listening on addr, closed by cleanup.
func listen(tb testing.TB, c *Config, addr string) (*Server, net.Listener) {
	tb.Helper()
	srv, err := NewServer(c)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := srv.Listen(addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return srv, l
}

// acceptPlain serves conn as a plaintext endpoint that says hello.
func acceptPlain(conn net.Conn, hello Hello) (*Session, error) {
	srv, err := NewServer(cfg(hello, nil, PathOptions{}))
	if err != nil {
		return nil, err
	}
	return srv.Accept(conn)
}

// serveSecure accepts on every listener through srv and reports each
// connection's outcome (a session, a join, a refusal); cleanup closes the
// listeners and every session.
func serveSecure(tb testing.TB, srv *Server, ls []net.Listener) <-chan accepted {
	out := make(chan accepted, 16)
	stop := make(chan struct{})
	var (
		mu       sync.Mutex
		sessions []*Session
		stopped  bool
	)
	for _, l := range ls {
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					s, err := srv.Accept(conn)
					if s != nil {
						mu.Lock()
						if stopped {
							s.Close()
						}
						sessions = append(sessions, s)
						mu.Unlock()
					}
					select {
					case out <- accepted{s, err}:
					case <-stop:
					}
				}()
			}
		}()
	}
	tb.Cleanup(func() {
		close(stop)
		for _, l := range ls {
			l.Close()
		}
		mu.Lock()
		stopped = true
		for _, s := range sessions {
			s.Close()
		}
		mu.Unlock()
	})
	return out
}

func next(t *testing.T, c <-chan accepted) accepted {
	t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("the server never finished with the connection")
		return accepted{}
	}
}

func dialSecure(tb testing.TB, addr string, sec *Security, peer string, multipath bool) (*Session, error) {
	tb.Helper()
	s, err := Dial(context.Background(), at(peer, addr), cfg(Hello{Name: sec.Name, Role: "agent"}, sec, PathOptions{Multipath: multipath}))
	if s != nil {
		tb.Cleanup(func() { s.Close() })
	}
	return s, err
}

func TestSecureSessionEndToEnd(t *testing.T) {
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2", "h1"), false)
	cli, err := dialSecure(t, addr, p.sec(t, "h1"), "h2", false)
	if err != nil {
		t.Fatal(err)
	}
	a := next(t, srv)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if cli.Peer.Name != "h2" || cli.PeerCertName() != "h2" || a.sess.Peer.Name != "h1" || a.sess.PeerCertName() != "h1" {
		t.Fatalf("identities: client sees %q/%q, server sees %q/%q", cli.Peer.Name, cli.PeerCertName(), a.sess.Peer.Name, a.sess.PeerCertName())
	}
	if v := cli.conn.Conn.(*tls.Conn).ConnectionState().Version; v != tls.VersionTLS13 {
		t.Fatalf("TLS version %#x", v)
	}
	if cli.conn.batch == nil || a.sess.conn.batch == nil {
		t.Errorf("TLS records not batched: dialed %v, accepted %v", cli.conn.batch != nil, a.sess.conn.batch != nil)
	}

	data := make([]byte, 2<<20+5)
	rand.Read(data)
	go func() {
		ch, err := cli.Open("pages")
		if err != nil {
			return
		}
		ch.Send("hdr")
		ch.Write(data)
		ch.CloseWrite()
	}()
	ch, err := a.sess.Accept()
	if err != nil {
		t.Fatal(err)
	}
	var hdr string
	if err := ch.Recv(&hdr); err != nil || hdr != "hdr" || ch.Kind != "pages" {
		t.Fatalf("control %q on %q: %v", hdr, ch.Kind, err)
	}
	got, err := io.ReadAll(ch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("stream corrupted")
	}
}

// refused dials srv and checks both sides' errors.
func refused(t *testing.T, srv <-chan accepted, dialErr error, clientWants, serverWants string) {
	t.Helper()
	if dialErr == nil {
		t.Fatal("the client was let in")
	}
	a := next(t, srv)
	if a.err == nil {
		t.Fatal("the server accepted the connection")
	}
	t.Logf("client: %v", dialErr)
	t.Logf("server: %v", a.err)
	if !strings.Contains(dialErr.Error(), clientWants) {
		t.Errorf("client error %q does not say %q", dialErr, clientWants)
	}
	if !strings.Contains(a.err.Error(), serverWants) {
		t.Errorf("server error %q does not say %q", a.err, serverWants)
	}
}

func TestSecureRefusesClientWithoutCertificate(t *testing.T) {
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2"), false)
	sec := p.sec(t, "h1")
	sec.Cert = tls.Certificate{}
	_, err := dialSecure(t, addr, sec, "h2", false)
	refused(t, srv, err, "no client certificate", "didn't provide a certificate")
}

func TestSecureRefusesCertificateFromAnotherCA(t *testing.T) {
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2"), false)
	// h1 trusts the right CA (so it accepts h2) but holds a certificate
	// from another CA.
	sec := p.sec(t, "h1")
	foreign, err := pki.LoadTLS(p.otherDir, "h1")
	if err != nil {
		t.Fatal(err)
	}
	sec.Cert = foreign.Cert
	_, err = dialSecure(t, addr, sec, "h2", false)
	refused(t, srv, err, "not signed by the CA", "unknown authority")
}

func TestSecureRefusesHostNotAllowed(t *testing.T) {
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2", "h1"), false)
	_, err := dialSecure(t, addr, p.sec(t, "h3"), "h2", false)
	refused(t, srv, err, `"h3" is not an allowed source`, `host "h3" is not an allowed source for h2 (allowed: h1)`)
}

func TestSecureRefusesTLS12(t *testing.T) {
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2"), false)
	sec := p.sec(t, "h1")
	tcfg := sec.ClientConfig("h2")
	tcfg.MinVersion, tcfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	conn, err := tls.Dial("tcp", addr, tcfg)
	if err == nil {
		_, err = Client(conn, cfg(Hello{Name: "h1"}, nil, PathOptions{}))
	}
	refused(t, srv, explainRefusal(addr, "h1", err), "does not speak TLS 1.3", "unsupported versions")

	// And a TLS 1.2 server is refused by Dial.
	srvCfg := p.sec(t, "h2").ServerConfig()
	srvCfg.MinVersion, srvCfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	l, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	if _, err := dialSecure(t, l.Addr().String(), sec, "h2", false); err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("TLS 1.2 server: %v", err)
	}
}

func TestSecureChecksServerIdentity(t *testing.T) {
	p := newTestPKI(t)
	addr, _ := secureServer(t, p.sec(t, "h2"), false)
	_, err := dialSecure(t, addr, p.sec(t, "h1"), "h3", false)
	if err == nil || !strings.Contains(err.Error(), `server is host "h2", expected "h3"`) {
		t.Fatalf("wrong server accepted: %v", err)
	}
	// "" accepts any host of the CA.
	s, err := dialSecure(t, addr, p.sec(t, "h1"), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if s.PeerCertName() != "h2" {
		t.Fatalf("peer %q", s.PeerCertName())
	}

	// A server with a certificate from another CA is refused.
	other, err := LoadSecurity(p.otherDir, "h1", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr2, _ := secureServer(t, other, false)
	if _, err := dialSecure(t, addr2, p.sec(t, "h3"), "", false); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("server from another CA: %v", err)
	}
}

func TestSecureRefusesSpoofedHello(t *testing.T) {
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2", "h1"), false)
	// Dial never sends a Hello its certificate contradicts...
	if _, err := Dial(context.Background(), at("h2", addr), cfg(Hello{Name: "h1", Role: "agent"}, p.sec(t, "h3"), PathOptions{})); err == nil ||
		!strings.Contains(err.Error(), `calls itself "h1" but its certificate is for "h3"`) {
		t.Fatalf("a config that contradicts its certificate: %v", err)
	}
	// ...so a spoofer sends it by hand, over TLS with its certificate.
	spoof := func(sec *Security, name string) (*Session, error) {
		conn, err := tls.Dial("tcp", addr, sec.ClientConfig("h2"))
		if err != nil {
			return nil, err
		}
		return Client(conn, cfg(Hello{Name: name, Role: "agent"}, nil, PathOptions{}))
	}
	// h3's certificate, claiming to be h1 in its Hello.
	if sess, err := spoof(p.sec(t, "h3"), "h1"); err == nil {
		sess.Close()
		t.Fatal("spoofed name let in")
	}
	if a := next(t, srv); a.err == nil {
		t.Fatal("server accepted")
	}
	// h1's certificate (allowed), claiming to be h3. The server sends its
	// Hello before it can check the client's, so the client learns of the
	// refusal when the session ends.
	cli, err := spoof(p.sec(t, "h1"), "h3")
	if err == nil {
		t.Cleanup(func() { cli.Close() })
	}
	a := next(t, srv)
	if a.err == nil || !strings.Contains(a.err.Error(), `introduced itself as "h3" but its certificate is for host "h1"`) {
		t.Fatalf("server: %v", a.err)
	}
	if err == nil {
		select {
		case <-cli.Done():
		case <-time.After(20 * time.Second):
			t.Fatal("the refused client's session stayed up")
		}
	}
}

func TestSecureRefusesPlainPeers(t *testing.T) {
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2"), false)
	// A plain ferry client at a TLS listener.
	if _, err := Dial(context.Background(), addr, cfg(Hello{Name: "h1"}, nil, PathOptions{})); err == nil {
		t.Fatal("plain client let in")
	}
	if a := next(t, srv); a.err == nil {
		t.Fatal("server accepted a plain client")
	}
	// A TLS dial to a plain listener.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err == nil {
			acceptPlain(c, Hello{Name: "h2"})
		}
	}()
	if _, err := dialSecure(t, l.Addr().String(), p.sec(t, "h1"), "h2", false); err == nil {
		t.Fatal("plain server accepted")
	}
}

func mptcpEnabled() (bool, string) {
	b, err := os.ReadFile("/proc/sys/net/mptcp/enabled")
	if err != nil {
		return false, "this kernel has no MPTCP (no /proc/sys/net/mptcp/enabled)"
	}
	if strings.TrimSpace(string(b)) != "1" {
		return false, "MPTCP is off (sysctl net.mptcp.enabled = " + strings.TrimSpace(string(b)) + ")"
	}
	return true, ""
}

func TestSecureMultipath(t *testing.T) {
	if ok, why := mptcpEnabled(); !ok {
		t.Skip(why)
	}
	p := newTestPKI(t)
	addr, srv := secureServer(t, p.sec(t, "h2"), true)
	cli, err := dialSecure(t, addr, p.sec(t, "h1"), "h2", true)
	if err != nil {
		t.Fatal(err)
	}
	a := next(t, srv)
	if a.err != nil {
		t.Fatal(a.err)
	}
	raw := underTLS(cli.conn.Conn).(*net.TCPConn)
	mp, err := raw.MultipathTCP()
	if err != nil || !mp {
		t.Fatalf("client connection is not MPTCP: %v %v", mp, err)
	}
	if !cli.Multipath() || !a.sess.Multipath() {
		t.Fatalf("Multipath(): client %v server %v", cli.Multipath(), a.sess.Multipath())
	}

	// multipath=false gives plain TCP, even to an MPTCP listener.
	plain, err := dialSecure(t, addr, p.sec(t, "h1"), "h2", false)
	if err != nil {
		t.Fatal(err)
	}
	if a := next(t, srv); a.err != nil {
		t.Fatal(a.err)
	}
	if plain.Multipath() {
		t.Fatal("multipath=false gave MPTCP")
	}
}

func TestLoadSecurityRejectsBadAllowed(t *testing.T) {
	p := newTestPKI(t)
	if _, err := LoadSecurity(p.dir, "h1", []string{"h2", "../x"}); err == nil {
		t.Fatal("bad allowed name accepted")
	}
	if _, err := LoadSecurity(p.dir, "nosuch", nil); err == nil {
		t.Fatal("missing host accepted")
	}
}

// Benchmarks: handshake cost and channel throughput, plain TCP vs TLS, on
// loopback.

func plainServer(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				s, err := acceptPlain(c, Hello{Name: "h2", Role: "agent"})
				if err == nil {
					serveBench(s)
				}
			}()
		}
	}()
	return l.Addr().String()
}

func tlsServer(b *testing.B, sec *Security, multipath bool) string {
	srv, l := listen(b, cfg(Hello{Name: sec.Name, Role: "agent"}, sec, PathOptions{Multipath: multipath}), "127.0.0.1:0")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				s, err := srv.Accept(c)
				if err == nil {
					serveBench(s)
				}
			}()
		}
	}()
	return l.Addr().String()
}

// serveBench drains every channel until the session ends.
func serveBench(s *Session) {
	defer s.Close()
	for {
		ch, err := s.Accept()
		if err != nil {
			return
		}
		go func() {
			io.Copy(io.Discard, ch)
			ch.Send("done")
		}()
	}
}

func benchHandshake(b *testing.B, dial func() (*Session, error)) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}

func BenchmarkHandshakePlainTCP(b *testing.B) {
	addr := plainServer(b)
	benchHandshake(b, func() (*Session, error) {
		return Dial(context.Background(), addr, cfg(Hello{Name: "h1", Role: "agent"}, nil, PathOptions{}))
	})
}

func BenchmarkHandshakeTLS(b *testing.B) {
	p := newTestPKI(b)
	addr := tlsServer(b, p.sec(b, "h2", "h1"), false)
	sec := p.sec(b, "h1")
	benchHandshake(b, func() (*Session, error) {
		return Dial(context.Background(), at("h2", addr), cfg(Hello{Role: "agent"}, sec, PathOptions{}))
	})
}

func benchThroughput(b *testing.B, s *Session) {
	defer s.Close()
	ch, err := s.Open("bench")
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := ch.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	ch.CloseWrite()
	var done string
	if err := ch.Recv(&done); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkThroughputPlainTCP(b *testing.B) {
	s, err := Dial(context.Background(), plainServer(b), cfg(Hello{Name: "h1", Role: "agent"}, nil, PathOptions{}))
	if err != nil {
		b.Fatal(err)
	}
	benchThroughput(b, s)
}

func BenchmarkThroughputTLS(b *testing.B) {
	p := newTestPKI(b)
	addr := tlsServer(b, p.sec(b, "h2"), false)
	s, err := Dial(context.Background(), at("h2", addr), cfg(Hello{}, p.sec(b, "h1"), PathOptions{}))
	if err != nil {
		b.Fatal(err)
	}
	benchThroughput(b, s)
}

func BenchmarkThroughputTLSMPTCP(b *testing.B) {
	if ok, why := mptcpEnabled(); !ok {
		b.Skip(why)
	}
	p := newTestPKI(b)
	addr := tlsServer(b, p.sec(b, "h2"), true)
	s, err := Dial(context.Background(), at("h2", addr), cfg(Hello{}, p.sec(b, "h1"), PathOptions{Multipath: true}))
	if err != nil {
		b.Fatal(err)
	}
	if !s.Multipath() {
		b.Fatal("not MPTCP")
	}
	benchThroughput(b, s)
}

func BenchmarkThroughputPlainMPTCP(b *testing.B) {
	if ok, why := mptcpEnabled(); !ok {
		b.Skip(why)
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if s, err := acceptPlain(c, Hello{Name: "h2"}); err == nil {
			serveBench(s)
		}
	}()
	var d net.Dialer
	d.SetMultipathTCP(true)
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s, err := Client(c, cfg(Hello{Name: "h1"}, nil, PathOptions{}))
	if err != nil {
		b.Fatal(err)
	}
	if !s.Multipath() {
		b.Fatal("not MPTCP")
	}
	benchThroughput(b, s)
}

func TestSecureOperator(t *testing.T) {
	p := newTestPKI(t)
	if err := pki.IssueOperator(p.dir, filepath.Join(p.dir, "alice"), "alice", time.Hour); err != nil {
		t.Fatal(err)
	}
	op, err := LoadOperator(p.dir, "alice")
	if err != nil {
		t.Fatal(err)
	}
	// An agent that lets in only h1 as a source still lets an operator ask.
	addr, srv := secureServer(t, p.sec(t, "h2", "h1"), false)
	sess, err := Dial(context.Background(), at("h2", addr), cfg(Hello{Role: "cli"}, op, PathOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	a := next(t, srv)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if !a.sess.PeerOperator() || a.sess.Peer.Name != "alice" || a.sess.PeerCertName() != "alice" {
		t.Errorf("the agent sees operator=%v, name %q, certificate %q", a.sess.PeerOperator(), a.sess.Peer.Name, a.sess.PeerCertName())
	}
	if sess.PeerOperator() {
		t.Error("the operator's side calls the agent an operator")
	}

	// A host is not an operator.
	if _, err := dialSecure(t, addr, p.sec(t, "h1"), "h2", false); err != nil {
		t.Fatal(err)
	}
	if a := next(t, srv); a.err != nil || a.sess.PeerOperator() {
		t.Errorf("a host's session: operator=%v, err %v", a.sess != nil && a.sess.PeerOperator(), a.err)
	}

	// An operator's session is never striped.
	_, err = Dial(context.Background(), at("h2", addr), cfg(Hello{Role: "cli"}, op, PathOptions{Streams: 2}))
	if a := next(t, srv); a.err == nil || !strings.Contains(a.err.Error(), "not striped") {
		t.Errorf("a striped operator session: server %v, client %v", a.err, err)
	}

	// An operator's certificate cannot stand in for an agent.
	isrv, l := listen(t, cfg(Hello{Name: "alice", Role: "agent"}, op, PathOptions{}), "127.0.0.1:0")
	impostor := serveSecure(t, isrv, []net.Listener{l})
	if _, err := dialSecure(t, l.Addr().String(), p.sec(t, "h1"), "", false); err == nil {
		t.Error("a host accepted an operator's certificate as an agent's")
	}
	next(t, impostor)
}

package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

// stripedServer is an agent-like host h2 listening on two loopback
// addresses, advertising both. Every connection's outcome (a session, a
// join, a refusal) is reported.
func stripedServer(t *testing.T, p testPKI) ([]string, <-chan accepted, *Server) {
	t.Helper()
	// The Hello advertises the addresses, known once both listen.
	c := cfg(Hello{Name: "h2", Role: "agent"}, p.sec(t, "h2"), PathOptions{})
	var ls []net.Listener
	var addrs []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, tls.NewListener(l, c.Security.ServerConfig()))
		addrs = append(addrs, l.Addr().String())
	}
	c.Hello.Addrs = addrs
	srv, err := NewServer(c)
	if err != nil {
		t.Fatal(err)
	}
	return addrs, serveSecure(t, srv, ls), srv
}

// nextSession returns the session accepted next, once streams-1
// connections have joined it.
func nextSession(t *testing.T, c <-chan accepted, streams int) *Session {
	t.Helper()
	var sess *Session
	for joins := 0; sess == nil || joins < streams-1; {
		a := next(t, c)
		switch {
		case errors.Is(a.err, ErrJoined):
			joins++
		case a.err != nil:
			t.Fatal(a.err)
		default:
			sess = a.sess
			t.Cleanup(func() { sess.Close() })
		}
	}
	return sess
}

func TestStripedSecureSession(t *testing.T) {
	p := newTestPKI(t)
	addrs, acc, _ := stripedServer(t, p)
	cli, err := Dial(context.Background(), at("h2", addrs[0]), cfg(Hello{Role: "agent"}, p.sec(t, "h1"), PathOptions{Multipath: false, Streams: 3}))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv := nextSession(t, acc, 3)
	if cli.Streams() != 3 || cli.PeerCertName() != "h2" || srv.PeerCertName() != "h1" || cli.Multipath() {
		t.Fatalf("client: %d streams to %q (multipath %v); server sees %q", cli.Streams(), cli.PeerCertName(), cli.Multipath(), srv.PeerCertName())
	}
	if srv.Streams() != 3 || cli.Transport() != "striped tcp x3" {
		t.Fatalf("server has %d streams, want 3; client runs over %q", srv.Streams(), cli.Transport())
	}
	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	got := make(chan []byte, 1)
	go func() {
		ch, err := srv.Accept()
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(ch)
		got <- b
	}()
	ch, err := cli.Open("bulk")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := ch.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, data) {
		t.Fatalf("received %d bytes, not the %d sent", len(b), len(data))
	}
}

// TestStripedJoinRefused: a connection may join a striped session only from
// the host that opened it, and only a session that exists.
func TestStripedJoinRefused(t *testing.T) {
	p := newTestPKI(t)
	addrs, acc, srv := stripedServer(t, p)
	cli, err := Dial(context.Background(), at("h2", addrs[0]), cfg(Hello{Role: "agent"}, p.sec(t, "h1"), PathOptions{Streams: 2}))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	nextSession(t, acc, 2)
	var id string
	srv.striped.Lock()
	for k := range srv.striped.m {
		id = k
	}
	srv.striped.Unlock()
	for _, c := range []struct {
		host, id, want string
	}{
		{"h3", id, `joins a striped session of "h1"`},
		{"h1", "no-such-session", "unknown striped session"},
	} {
		raw, err := net.Dial("tcp", addrs[1])
		if err != nil {
			t.Fatal(err)
		}
		conn := tls.Client(raw, p.sec(t, c.host).ClientConfig("h2"))
		if err := conn.Handshake(); err != nil {
			t.Fatal(err)
		}
		// The refusal closes the connection: the handshake may or may not
		// see the server's Hello first.
		_, _ = handshake(conn, Hello{Name: c.host, Role: "agent", Stripe: &StripeHello{ID: c.id, Join: true}})
		conn.Close()
		for {
			a := next(t, acc)
			if errors.Is(a.err, ErrJoined) {
				t.Fatalf("%s joined session %q", c.host, c.id)
			}
			if a.err != nil {
				if !strings.Contains(a.err.Error(), c.want) {
					t.Errorf("%s: refused with %v, want %q", c.host, a.err, c.want)
				}
				break
			}
		}
	}
	if cli.Streams() != 2 {
		t.Errorf("the session has %d streams after the refusals, want 2", cli.Streams())
	}
}

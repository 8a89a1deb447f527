// Package transporttest gives other packages' tests sessions without a
// network: two ends of a net.Pipe, as an agent dials and accepts them.
package transporttest

import (
	"net"
	"testing"

	"github.com/ferry-migrate/ferry/internal/transport"
)

// Pipe starts a session over net.Pipe between a dialing end named from and
// an accepting end named to (both agents, plaintext, default settings),
// and closes both when the test ends.
func Pipe(tb testing.TB, from, to string) (dialer, acceptor *transport.Session) {
	tb.Helper()
	a, b := Conn(tb, from, to)
	tb.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// Conn is Pipe without the cleanup, for tests that close the sessions
// themselves (and fuzz targets that count what is left).
func Conn(tb testing.TB, from, to string) (dialer, acceptor *transport.Session) {
	tb.Helper()
	a, b := net.Pipe()
	return connOver(tb, a, b, from, to)
}

// connOver starts the two ends of a session over a and b.
func connOver(tb testing.TB, a, b net.Conn, from, to string) (dialer, acceptor *transport.Session) {
	tb.Helper()
	srv, err := transport.NewServer(config(to))
	if err != nil {
		tb.Fatal(err)
	}
	accepted := make(chan *transport.Session, 1)
	go func() {
		s, err := srv.Accept(b)
		if err != nil {
			tb.Error(err)
		}
		accepted <- s
	}()
	cli, err := transport.Client(a, config(from))
	if err != nil {
		tb.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		cli.Close()
		tb.FailNow()
	}
	return cli, s
}

func config(name string) *transport.Config {
	c := transport.DefaultConfig()
	c.Hello = transport.Hello{Name: name, Role: "agent"}
	return c
}

// Accept serves conn as an agent named name does (plaintext), for tests
// that drive the other end by hand.
func Accept(conn net.Conn, name string) (*transport.Session, error) {
	srv, err := transport.NewServer(config(name))
	if err != nil {
		conn.Close()
		return nil, err
	}
	return srv.Accept(conn)
}

package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/transport"
)

// servePeers runs an agent's peer listener on loopback (plaintext) with
// limits, handing every channel to handle.
func servePeers(t *testing.T, lim Limits, handle func(*transport.Session, *transport.Router, *transport.Channel)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	a := &Agent{Limits: lim, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.server, err = transport.NewServer(a.transportConfig())
	if err != nil {
		t.Fatal(err)
	}
	go a.accept(context.Background(), l, true, handle)
	return l.Addr().String()
}

func dialPeer(t *testing.T, addr string) *transport.Session {
	t.Helper()
	c := transport.DefaultConfig()
	c.Hello = transport.Hello{Name: "peer", Role: "agent"}
	s, err := transport.Dial(context.Background(), addr, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func closedWithin(s *transport.Session, d time.Duration) bool {
	select {
	case <-s.Done():
		return true
	case <-time.After(d):
		return false
	}
}

// A session that opens nothing is closed after the idle timeout; one with
// a channel open is not, however long the channel lasts, and its idle
// time starts when the channel ends.
func TestIdleSessionsClose(t *testing.T) {
	release := make(chan struct{})
	addr := servePeers(t, Limits{IdleTimeout: 300 * time.Millisecond}, func(_ *transport.Session, _ *transport.Router, ch *transport.Channel) {
		<-release
		ch.Close()
	})
	idle := dialPeer(t, addr)
	if !closedWithin(idle, 3*time.Second) {
		t.Fatal("an idle session stayed open")
	}
	busy := dialPeer(t, addr)
	ch, err := busy.Open("query")
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Send(struct{}{}); err != nil { // a channel exists once it carries something
		t.Fatal(err)
	}
	if closedWithin(busy, time.Second) {
		t.Fatal("a session with a channel open was closed as idle")
	}
	close(release)
	if !closedWithin(busy, 3*time.Second) {
		t.Fatal("the session stayed open after its channel ended")
	}
}

// Past MaxPeerSessions a new session is closed at once; the others stay.
func TestPeerSessionLimit(t *testing.T) {
	addr := servePeers(t, Limits{MaxPeerSessions: 2, IdleTimeout: time.Minute}, func(_ *transport.Session, _ *transport.Router, ch *transport.Channel) {
		ch.Close()
	})
	a, b := dialPeer(t, addr), dialPeer(t, addr)
	time.Sleep(100 * time.Millisecond) // both counted
	c := dialPeer(t, addr)
	if !closedWithin(c, 3*time.Second) {
		t.Fatal("a third session was kept with a limit of two")
	}
	if closedWithin(a, 200*time.Millisecond) || closedWithin(b, 10*time.Millisecond) {
		t.Fatal("a session within the limit was closed")
	}
	a.Close()
	time.Sleep(200 * time.Millisecond)
	if d := dialPeer(t, addr); closedWithin(d, 500*time.Millisecond) {
		t.Fatal("a session was refused after another ended")
	}
}

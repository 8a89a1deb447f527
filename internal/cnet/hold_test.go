package cnet

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/privnet"
	"github.com/vishvananda/netns"
)

// holdNetns makes a named namespace with loopback up, removed at the end.
func holdNetns(t *testing.T) (string, *privnet.NS) {
	t.Helper()
	testroot.Require(t, "needs root: makes network namespaces")
	for _, tool := range []string{"ip", "iptables", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	name := fmt.Sprintf("ferry-holdtest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	path := Path(name)
	if out, err := inNS(path, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, privnet.FromHandle(h)
}

// connected returns both ends of a TCP connection inside ns.
func connected(t *testing.T, ns *privnet.NS) (client, server net.Conn) {
	t.Helper()
	err := ns.Do(func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		if client, err = net.Dial("tcp", l.Addr().String()); err != nil {
			return err
		}
		server, err = l.Accept()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// readWithin reads n bytes from c, or fails after d.
func readWithin(c net.Conn, n int, d time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return string(b), err
}

// pingHeld connects a client and a server in a new namespace, holds what
// reaches it, and has the client send "ping", which must not arrive.
func pingHeld(t *testing.T) (path string, client, server net.Conn, h *Hold) {
	t.Helper()
	path, ns := holdNetns(t)
	t.Cleanup(func() { ns.Close() })
	client, server = connected(t, ns)
	h, err := HoldIncoming(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if got, err := readWithin(server, 4, 500*time.Millisecond); err == nil {
		t.Fatalf("%q arrived while held", got)
	}
	return path, client, server, h
}

// Held packets reach nobody until the release, then arrive: the queue had
// them (the sender did not have to retransmit).
func TestHoldReleaseDelivers(t *testing.T) {
	path, client, server, h := pingHeld(t)
	n, err := h.Release()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("the release says nothing was held")
	}
	if got, err := readWithin(server, 4, 5*time.Second); err != nil || got != "ping" {
		t.Fatalf("after the release: %q, %v", got, err)
	}
	// Released but not closed: what arrives passes at once, the rule
	// still in place.
	if _, err := client.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if got, err := readWithin(server, 4, 5*time.Second); err != nil || got != "more" {
		t.Fatalf("between the release and the close: %q, %v", got, err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	// Unheld now: the rule is gone.
	if out, err := inNS(path, "iptables", "-t", "raw", "-S", "PREROUTING"); err != nil || strings.Contains(string(out), "NFQUEUE") {
		t.Errorf("the hold's rule stayed: %v: %s", err, out)
	}
	if _, err := server.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if got, err := readWithin(client, 4, 5*time.Second); err != nil || got != "pong" {
		t.Fatalf("reply: %q, %v", got, err)
	}
}

// Dropped packets are lost to the queue; TCP sends them again, and the
// connection carries on.
func TestHoldDropLetsTCPRetransmit(t *testing.T) {
	_, _, server, h := pingHeld(t)
	h.Drop()
	if got, err := readWithin(server, 4, 10*time.Second); err != nil || got != "ping" {
		t.Fatalf("after the drop: %q, %v", got, err)
	}
}

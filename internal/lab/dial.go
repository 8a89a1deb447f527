package lab

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// DialFrom opens a session to an agent at to from inside host h's
// network namespace (where the lab's addresses are reachable), as c says:
// a peer of the lab's own making (bench hostile), with a host's
// certificate.
func (h *Host) DialFrom(ctx context.Context, to string, c *transport.Config) (*transport.Session, error) {
	var sess *transport.Session
	err := h.inNetNS(func() error {
		// One TCP connection, dialed on this thread: its socket is made
		// in the namespace, and is used from anywhere afterwards.
		c.Paths = transport.PathOptions{}
		var err error
		sess, err = transport.Dial(ctx, to, c)
		return err
	})
	return sess, err
}

// Dial connects from inside h's network namespace, as a client on that
// host would (a test's client of a published port).
func (h *Host) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := h.inNetNS(func() error {
		var d net.Dialer
		d.SetMultipathTCP(false)
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// inNetNS runs f on a thread of its own in h's network namespace: the
// sockets it makes are the namespace's.
func (h *Host) inNetNS(f func() error) error { return cnet.Do(h.NetNS, f) }

// WaitListening waits until something accepts connections at addr, as
// seen from h (ferry-lab's lab-tool, beside ferry, sending nothing
// there), for up to limit.
func (h *Host) WaitListening(ctx context.Context, ferry, addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if h.Command(ctx, ToolBin(ferry), "lab-tool", "send", "--to", addr, "--in", "/dev/null").Run() == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens at %s (seen from %s)", addr, h.Name)
}

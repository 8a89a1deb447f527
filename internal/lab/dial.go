package lab

import (
	"context"

	"github.com/vishvananda/netns"

	"github.com/ferry-migrate/ferry/internal/transport"
)

// DialFrom opens a session to an agent at to from inside host h's
// network namespace (where the lab's addresses are reachable), as c says:
// a peer of the lab's own making (bench hostile), with a host's
// certificate.
func (h *Host) DialFrom(ctx context.Context, to string, c *transport.Config) (*transport.Session, error) {
	var sess *transport.Session
	err := onFreshThread(func() error {
		ns, err := netns.GetFromName(h.NetNSName)
		if err != nil {
			return err
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			return err
		}
		// One TCP connection, dialed on this thread: its socket is made
		// in the namespace, and is used from anywhere afterwards.
		c.Paths = transport.PathOptions{}
		sess, err = transport.Dial(ctx, to, c)
		return err
	})
	return sess, err
}

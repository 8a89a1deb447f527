package criu

import (
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// FromOwnCRIU says whether the far end of a loopback TCP connection that
// this process accepted belongs to a CRIU process it started (directly or
// through a runtime): CRIU's page client connects to a port of ours that
// any local process could reach first, and feed it pages of its own.
func FromOwnCRIU(conn *net.TCPConn) (bool, error) {
	// The kernel names the socket at the far end: its local address is
	// our remote one.
	s, err := netlink.SocketGet(conn.RemoteAddr(), conn.LocalAddr())
	if err != nil {
		return false, fmt.Errorf("look up the connecting socket: %w", err)
	}
	for _, pid := range procs.Descendants(os.Getpid(), "criu") {
		if procs.HoldsSocket(pid, s.INode) {
			return true, nil
		}
	}
	return false, nil
}

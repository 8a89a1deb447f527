package transport

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// mptcpReceiveBuffer is the receive buffer of an MPTCP connection between
// agents (the kernel doubles it). It bounds the window: a far link carries
// at most about this much per round trip (16 MiB: 1 Gbit/s up to about
// 130 ms). Memory is taken only for data not yet read.
const mptcpReceiveBuffer = 16 << 20

// multipathListenConfig listens over MPTCP with the receive buffer fixed
// (fixedReceiveBuffer).
func multipathListenConfig() net.ListenConfig {
	lc := net.ListenConfig{Control: fixedReceiveBuffer}
	lc.SetMultipathTCP(true)
	return lc
}

// fixedReceiveBuffer sets an MPTCP socket's receive buffer instead of
// leaving it to autotuning. Measured here (Linux 6.18): with autotuning,
// the first bulk transfer of a session (the root filesystem, a few MiB)
// stalled for a retransmission timeout, ~200 ms, in 2 of 3 sessions; with
// the buffer fixed, never (plain TCP never did). Accepted connections
// inherit it from the listener.
func fixedReceiveBuffer(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		// FORCE passes net.core.rmem_max (4 MiB on many hosts), as root.
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, mptcpReceiveBuffer); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, mptcpReceiveBuffer)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

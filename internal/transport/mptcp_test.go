package transport

import (
	"context"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMultipathReceiveBufferFixed: both ends of an agents' MPTCP connection
// have the fixed receive buffer, the accepted one inheriting it from the
// listener.
func TestMultipathReceiveBufferFixed(t *testing.T) {
	lc := multipathListenConfig()
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := dialAgent(context.Background(), l.Addr().String(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer a.Close()
	if !IsMultipath(c) {
		t.Log("this kernel fell back to TCP; the buffer is checked on the TCP sockets")
	}
	for name, conn := range map[string]net.Conn{"dialed": c, "accepted": a} {
		if got := receiveBuffer(t, conn); got < mptcpReceiveBuffer {
			t.Errorf("%s connection: SO_RCVBUF %d, want at least %d", name, got, mptcpReceiveBuffer)
		}
	}
}

func receiveBuffer(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var gerr error
	if err := rc.Control(func(fd uintptr) { n, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return n
}

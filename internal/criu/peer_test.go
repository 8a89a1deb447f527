package criu

import (
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu/criutest"
)

// A connection from this process is refused; one from a child process
// named criu is accepted.
func TestFromOwnCRIU(t *testing.T) {
	fake := criutest.FakeCRIU(t) // its /dev/tcp plays CRIU's page client
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	accept := func() *net.TCPConn {
		t.Helper()
		_ = l.SetDeadline(time.Now().Add(10 * time.Second))
		c, err := l.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	mine, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	c := accept()
	if ok, err := FromOwnCRIU(c); ok || err != nil {
		t.Fatalf("a connection from the test itself: ok=%v err=%v, want refused", ok, err)
	}
	c.Close()

	cmd := exec.Command(fake, "-c", "exec 3<>/dev/tcp/127.0.0.1/"+port+"; read -t 10 <&3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	c = accept()
	defer c.Close()
	if ok, err := FromOwnCRIU(c); !ok || err != nil {
		t.Fatalf("a connection from a child named criu: ok=%v err=%v, want accepted", ok, err)
	}
}

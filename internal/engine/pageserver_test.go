package engine

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/criu/criutest"
)

// The page tunnel takes CRIU's page client only: a local process that
// connects first is shut out, and the tunnel waits on for CRIU.
func TestLoopbackTunnelTakesOnlyCRIU(t *testing.T) {
	fake := criutest.FakeCRIU(t) // its /dev/tcp plays CRIU's page client
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan string, 1)
	addr, wait, err := loopbackTunnel(ctx, func(conn halfCloser) error {
		b, err := io.ReadAll(conn)
		got <- string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	intruder, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Close()
	_, _ = intruder.Write([]byte("forged pages"))
	_ = intruder.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := intruder.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !strings.Contains(errString(err), "reset") {
		t.Fatalf("the intruder's connection: %v, want it closed", err)
	}

	host, port, _ := net.SplitHostPort(addr)
	// Like CRIU, it holds the connection while it streams (and ends on a
	// builtin: bash would exec an external last command, renaming itself).
	cmd := exec.Command(fake, "-c", "exec 3<>/dev/tcp/"+host+"/"+port+"; printf pages >&3; sleep 1; exec 3>&-")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fake CRIU: %v: %s", err, out)
	}
	select {
	case s := <-got:
		if s != "pages" {
			t.Fatalf("the tunnel served %q, want CRIU's %q", s, "pages")
		}
	case <-ctx.Done():
		t.Fatal("the tunnel never served CRIU's connection")
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

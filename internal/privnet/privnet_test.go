package privnet

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"
)

func needRoot(t *testing.T) {
	t.Helper()
	testroot.Require(t, "needs root: makes network namespaces")
}

// A listener made inside the namespace is reachable from inside and not
// from the host's own loopback.
func TestListenerUnreachableFromOutside(t *testing.T) {
	needRoot(t)
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("inside"))
			c.Close()
		}
	}()

	if c, err := net.Dial("tcp", addr); err == nil {
		// The same port may be open on the host by chance; it must not
		// be this listener.
		b := make([]byte, 6)
		n, _ := c.Read(b)
		c.Close()
		if string(b[:n]) == "inside" {
			t.Fatalf("the private listener %s answered on the host's loopback", addr)
		}
	}
	var got string
	err = ns.Do(func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, 6)
		n, err := c.Read(b)
		got = string(b[:n])
		return err
	})
	if err != nil || got != "inside" {
		t.Fatalf("dial from inside: %q, %v", got, err)
	}
}

// A process started by Do is born in the namespace; the caller's thread
// and the others stay where they were.
func TestProcessBornInside(t *testing.T) {
	needRoot(t)
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("readlink", "/proc/self/ns/net")
	var out strings.Builder
	cmd.Stdout = &out
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	child := strings.TrimSpace(out.String())
	if child == "" || child == self {
		t.Fatalf("child's namespace %q, ours %q: want a different one", child, self)
	}
	cmd = exec.Command("ip", "-o", "link", "show")
	out.Reset()
	cmd.Stdout = &out
	if err := ns.Do(cmd.Run); err != nil {
		t.Fatal(err)
	}
	if links := strings.Count(strings.TrimSpace(out.String()), "\n") + 1; links != 1 || !strings.Contains(out.String(), "lo: <LOOPBACK,UP") {
		t.Fatalf("want loopback alone and up, got:\n%s", out.String())
	}
	for i := 0; i < 20; i++ { // every thread of ours is still at home
		if now, _ := os.Readlink("/proc/thread-self/ns/net"); now != self {
			t.Fatalf("a thread was left in %s", now)
		}
	}
}

func TestSharesOurs(t *testing.T) {
	needRoot(t)
	if shared, err := SharesOurs(os.Getpid()); err != nil || !shared {
		t.Fatalf("SharesOurs(self) = %v, %v", shared, err)
	}
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var cmd *exec.Cmd
	if err := ns.Do(func() error {
		cmd = exec.Command("sleep", "60")
		return cmd.Start()
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if shared, err := SharesOurs(cmd.Process.Pid); err != nil || shared {
		t.Fatalf("SharesOurs(a process in a private namespace) = %v, %v", shared, err)
	}
	if _, err := SharesOurs(1 << 30); err == nil {
		t.Error("no error for a pid that does not exist")
	}
}

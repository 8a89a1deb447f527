package lazyrelay

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/criu"
	"golang.org/x/sys/unix"
)

// The test binary plays the relay process when asked (Start runs it as
// exe).
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == Command {
		if err := Main(os.Args[3]); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) == 4 && os.Args[1] == KeeperCommand {
		if err := KeeperMain(os.Args[3], 30*time.Second); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// get is a lazy-pages daemon's request for one page at vaddr.
func get(vaddr uint64) []byte {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint32(b, 7) // PS_IOV_GET
	binary.LittleEndian.PutUint64(b[8:], 1)
	binary.LittleEndian.PutUint64(b[16:], vaddr)
	return b
}

// reply is a page server's answer to get(vaddr).
func reply(vaddr uint64) []byte {
	b := make([]byte, 32, 32+4096)
	binary.LittleEndian.PutUint32(b, 4<<16|6) // PE_PRESENT, PS_IOV_ADD_F
	binary.LittleEndian.PutUint64(b[8:], 1)
	binary.LittleEndian.PutUint64(b[16:], vaddr)
	return append(b, bytes.Repeat([]byte{byte(vaddr >> 12)}, 4096)...)
}

// The relay process outlives an agent's connection: a request whose
// reply was cut short goes to the next agent, the daemon gets only the
// whole reply, and the relay exits cleanly when the daemon does.
func TestRelayProcessOutlivesTheAgent(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	daemonF := os.NewFile(uintptr(fds[0]), "daemon")
	daemon, err := net.FileConn(daemonF)
	daemonF.Close() // FileConn holds its own copy
	if err != nil {
		t.Fatal(err)
	}
	defer daemon.Close()
	theirsF := os.NewFile(uintptr(fds[1]), "relay-end")
	theirs, err := net.FileConn(theirsF)
	theirsF.Close()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, agent, err := Start(os.Args[0], theirs.(*net.UnixConn), dir)
	theirs.Close() // the relay holds its own copy
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Kill(p.Pid, unix.SIGKILL) }()

	if _, err := daemon.Write(get(0x5000)); err != nil {
		t.Fatal(err)
	}
	req := make([]byte, 32)
	if _, err := io.ReadFull(agent, req); err != nil || !bytes.Equal(req, get(0x5000)) {
		t.Fatalf("the first agent did not get the request: %v", err)
	}
	if _, err := agent.Write(reply(0x5000)[:100]); err != nil {
		t.Fatal(err)
	}
	agent.Close()

	again, err := Dial(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := io.ReadFull(again, req); err != nil || !bytes.Equal(req, get(0x5000)) {
		t.Fatalf("the next agent was not asked again: %v", err)
	}
	if _, err := again.Write(reply(0x5000)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(reply(0x5000)))
	_ = daemon.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(daemon, got); err != nil || !bytes.Equal(got, reply(0x5000)) {
		t.Fatalf("the daemon did not get the whole reply alone: %v", err)
	}
	if Completed(dir) {
		t.Error("the pull is said complete before the daemon closed")
	}
	// The daemon's closing command (PS_IOV_CLOSE), answered, then its end.
	closeReq := make([]byte, 32)
	binary.LittleEndian.PutUint32(closeReq, 0x1023)
	if _, err := daemon.Write(closeReq); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(again, req); err != nil || !bytes.Equal(req, closeReq) {
		t.Fatalf("the agent did not get the daemon's close: %v", err)
	}
	if _, err := again.Write([]byte{0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(daemon, got[:4]); err != nil {
		t.Fatalf("the daemon's close was not answered: %v", err)
	}
	daemon.Close()
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			b, _ := os.ReadFile(filepath.Join(dir, logName))
			t.Fatalf("relay exited with %v: %s", err, b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the relay did not exit with its daemon")
	}
	if _, err := os.Stat(Socket(dir)); !os.IsNotExist(err) {
		t.Errorf("the relay's socket outlived it: %v", err)
	}
	if !Completed(dir) {
		t.Error("the relay did not record the pull's end after the daemon's close was answered")
	}
}

// A relay started before its daemon (the destination starts it while the
// images are on their way) ends when the migration drops the link before
// any daemon was started on it: no relay outlives a migration that failed
// early.
func TestRelayEndsWithALinkNoDaemonTook(t *testing.T) {
	link, err := criu.NewLazyPagesLink()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, agent, err := Start(os.Args[0], link.Conn.UnixConn, dir)
	link.Conn.UnixConn.Close() // the relay holds its own copy
	if err != nil {
		link.Close()
		t.Fatal(err)
	}
	defer func() { _ = unix.Kill(p.Pid, unix.SIGKILL) }()
	agent.Close()
	link.Close()
	exited := make(chan error, 1)
	go func() { exited <- p.Wait() }()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay still runs 5 s after its link was dropped")
	}
	if Completed(dir) {
		t.Error("a relay no daemon took says its pull completed")
	}
}

// The agent's connection to the relay and the relay's to the daemon hold
// whole replies: each side writes a reply while the next reads the one
// before.
func TestRepliesQueueWhole(t *testing.T) {
	testroot.Require(t, "SO_SNDBUFFORCE needs root (CAP_NET_ADMIN); without it the default buffer stays")
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	theirsF := os.NewFile(uintptr(fds[1]), "relay-end")
	theirs, err := net.FileConn(theirsF)
	theirsF.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	p, agent, err := Start(os.Args[0], theirs.(*net.UnixConn), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Kill(p.Pid, unix.SIGKILL) }()
	defer agent.Close()
	for name, c := range map[string]*net.UnixConn{"relay to daemon": theirs.(*net.UnixConn), "agent to relay": agent} {
		rc, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var size int
		var serr error
		if err := rc.Control(func(fd uintptr) { size, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		if size < sendBuffer {
			t.Errorf("%s: send buffer %d bytes, want at least %d", name, size, sendBuffer)
		}
	}
}

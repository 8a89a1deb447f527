// Package lazyrelay keeps a post-copy pull going across an agent's death,
// one process at each end. At the destination it runs pagestream.Relay in
// a process of its own: the agent starts `ferry lazy-relay` with the
// lazy-pages daemon's connection and serves the daemon through the
// relay's socket. At the source the page keeper (keeper.go) holds CRIU's
// page server connection. An agent restarted after a crash connects to
// that socket again and the pull goes on.
package lazyrelay

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/pagestream"
	"github.com/ferry-migrate/ferry/internal/tail"
	"golang.org/x/sys/unix"
)

// Command is the subcommand of the ferry binary that runs a relay.
const Command = "lazy-relay"

// Names in the work directory.
const (
	socketName = "lazy-relay.socket"
	logName    = "lazy-relay.log"
	// doneName is written once the daemon's closing command was answered:
	// every page of the copy is in place. An agent that died between that
	// and recording the pull's end finds it there.
	doneName = "lazy-relay.done"
)

// Socket is where the relay for work directory dir listens.
func Socket(dir string) string { return filepath.Join(dir, socketName) }

// Process is a running relay.
type Process struct {
	Pid    int
	exited chan error
}

// Start runs exe's relay for the daemon connection daemon (which it
// shares: the caller closes its own copy, never shuts it down) in work
// directory dir, and returns once the relay listens, with a connection to
// it. The relay has a session of its own: what stops the agent does not
// stop it.
func Start(exe string, daemon *net.UnixConn, dir string) (*Process, *net.UnixConn, error) {
	if err := bigSendBuffer(daemon); err != nil {
		return nil, nil, err
	}
	f, err := daemon.File()
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var conn *net.UnixConn
	p, err := start(exe, dir, logName, f, []string{Command, "--socket", Socket(dir)}, func() (err error) {
		conn, err = Dial(dir)
		return err
	})
	return p, conn, err
}

// start runs exe with args in a session of its own, logging to logName in
// dir, with extra as its fd 3, and returns once ready succeeds.
func start(exe, dir, logName string, extra *os.File, args []string, ready func() error) (*Process, error) {
	logf, err := os.OpenFile(filepath.Join(dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(exe, args...)
	if extra != nil {
		cmd.ExtraFiles = []*os.File{extra} // fd 3
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	p := &Process{Pid: cmd.Process.Pid, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if ready() == nil {
			return p, nil
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			return nil, fmt.Errorf("%s exited early: %v: %s", args[0], err, tail.File(filepath.Join(dir, logName), 3))
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("%s did not listen in 10 s", args[0])
		}
	}
}

// Dial connects to the relay of work directory dir.
func Dial(dir string) (*net.UnixConn, error) { return dialConn(Socket(dir)) }

// sendBuffer is what the agent's and the relay's replies may queue ahead
// of their reader: two of the daemon's largest requests (4 MiB each).
// With the default (208 KiB) the agent, the relay and the daemon took
// turns, each waiting for the next to read; with room for whole replies
// each stage works while the next one does.
const sendBuffer = 8 << 20

// bigSendBuffer gives c's socket sendBuffer, past net.core.wmem_max
// (SO_SNDBUFFORCE: the agent runs as root; elsewhere the default stays).
func bigSendBuffer(c syscall.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer)
	})
}

// Kill stops the process (SIGKILL, by PID), unless it has ended (its PID
// may be another's by then), and waits for it. Only for one this process
// started.
func (p *Process) Kill() {
	select {
	case err := <-p.exited:
		p.exited <- err
		return
	default:
	}
	_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	_ = p.Wait()
}

// Wait returns once the relay has exited (only for one this process
// started).
func (p *Process) Wait() error {
	err := <-p.exited
	p.exited <- err
	return err
}

// Main is the relay process: fd 3 is the daemon's connection; it serves
// each agent that connects to socket in turn, and ends with the daemon.
func Main(socket string) error {
	daemon, err := net.FileConn(os.NewFile(3, "lazy-pages-daemon"))
	if err != nil {
		return fmt.Errorf("fd 3 is not the lazy-pages daemon's connection: %w", err)
	}
	l, err := listen(socket)
	if err != nil {
		return err
	}
	defer os.Remove(socket)
	closed, err := pagestream.ServeRelay(daemon, l)
	if closed {
		if werr := os.WriteFile(filepath.Join(filepath.Dir(socket), doneName), nil, 0o600); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

// Completed says whether the relay of work directory dir saw its pull end
// whole (the daemon's closing command answered).
func Completed(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, doneName))
	return err == nil
}

package lazyrelay

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/pagestream"
	"golang.org/x/sys/unix"
)

// The source's half: a pull that outlives the source's agent. CRIU's lazy
// page server serves one connection in its life, and ends its dump when
// that connection closes: an agent holding it that dies takes the memory
// the destination's copy still lacks with it. So a keeper, a process of its
// own, holds that connection (a pagestream.LazyProxy: whole requests in,
// whole replies out, the last reply kept) and serves each agent that
// connects to its socket in turn. It is started before the freeze, so that
// its fork and exec stay out of the downtime, and given CRIU's connection
// once CRIU listens (Keep).

// KeeperCommand is the subcommand of the ferry binary that runs a keeper.
const KeeperCommand = "page-keeper"

// Names in the work directory.
const (
	keeperSocketName = "page-keeper.socket"
	keeperLogName    = "page-keeper.log"
)

// KeeperIdle is how long a keeper holds CRIU's connection with no agent
// connected before it lets go (CRIU then ends its dump; the container
// stays frozen): longer than an agent's restart and its recovery's first
// question to the destination.
const KeeperIdle = 10 * time.Minute

// KeeperSocket is where the keeper of work directory dir listens.
func KeeperSocket(dir string) string { return filepath.Join(dir, keeperSocketName) }

// StartKeeper runs exe's keeper in work directory dir and returns once it
// listens. It has a session of its own: what stops the agent does not stop
// it.
func StartKeeper(exe, dir string) (*Process, error) {
	// Ready once its socket exists: a connection would be its first agent's.
	return start(exe, dir, keeperLogName, nil, []string{KeeperCommand, "--socket", KeeperSocket(dir)},
		func() error { _, err := os.Stat(KeeperSocket(dir)); return err })
}

// Keep hands the keeper of dir CRIU's page server connection and returns
// the connection through which the keeper serves it to this agent. The
// caller closes its own copy of criu.
func Keep(dir string, criu *net.TCPConn) (*net.UnixConn, error) {
	f, err := criu.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := DialKeeper(dir)
	if err != nil {
		return nil, err
	}
	if _, _, err := c.WriteMsgUnix([]byte{'K'}, unix.UnixRights(int(f.Fd())), nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("hand the page keeper CRIU's connection: %w", err)
	}
	return c, nil
}

// DialKeeper connects to the keeper of work directory dir.
func DialKeeper(dir string) (*net.UnixConn, error) { return dialConn(KeeperSocket(dir)) }

// KeeperMain is the keeper process: the first agent to connect to socket
// hands it CRIU's connection (Keep); it serves that agent and every next
// one in turn, and ends well (exit status 0) once CRIU's close was passed
// on; it fails after idle with no agent, or once its socket is removed.
func KeeperMain(socket string, idle time.Duration) error {
	l, err := listen(socket)
	if err != nil {
		return err
	}
	defer os.Remove(socket)
	var proxy *pagestream.LazyProxy
	var mu sync.Mutex
	var criu net.Conn
	gone := make(chan struct{})
	defer func() {
		mu.Lock()
		if criu != nil {
			criu.Close()
		}
		mu.Unlock()
	}()
	// A keeper whose socket is removed (its work directory cleared: a
	// restarted agent found nothing to go on with) lets go at once, CRIU's
	// connection with it, rather than after idle.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			if _, err := os.Stat(socket); errors.Is(err, fs.ErrNotExist) {
				close(gone)
				l.Close()
				mu.Lock()
				if criu != nil {
					criu.Close()
				}
				mu.Unlock()
				return
			}
		}
	}()
	for {
		if err := l.SetDeadline(time.Now().Add(idle)); err != nil {
			return err
		}
		c, err := l.AcceptUnix()
		select {
		case <-gone:
			if c != nil {
				c.Close()
			}
			return errors.New("the socket was removed: CRIU's connection let go")
		default:
		}
		if err != nil {
			return fmt.Errorf("no agent came for %v: CRIU's connection let go: %w", idle, err)
		}
		if err := bigSendBuffer(c); err != nil {
			c.Close()
			return err
		}
		if proxy == nil {
			conn, err := receiveConn(c)
			if err != nil {
				c.Close()
				return err
			}
			mu.Lock()
			criu = conn
			mu.Unlock()
			proxy = pagestream.NewLazyProxy(conn)
		}
		closed, err := proxy.Serve(c)
		c.Close()
		if closed {
			return nil
		}
		if errors.Is(err, pagestream.ErrPageServer) {
			return err // nothing left to keep
		}
		fmt.Fprintf(os.Stderr, "%s agent gone (%v); waiting for the next\n", time.Now().Format(time.RFC3339Nano), err)
	}
}

// receiveConn reads the connection Keep hands over on c.
func receiveConn(c *net.UnixConn) (net.Conn, error) {
	b, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		return nil, err
	}
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, fmt.Errorf("the first agent handed no connection: %w", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || n != 1 || b[0] != 'K' || len(msgs) != 1 {
		return nil, errors.New("the first agent handed no connection")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, errors.New("the first agent handed no connection")
	}
	f := os.NewFile(uintptr(fds[0]), "criu-page-server")
	defer f.Close()
	return net.FileConn(f)
}

func dialConn(socket string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := bigSendBuffer(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// listen listens on socket (one left by a process before is replaced),
// for this user alone; the caller removes it when done.
func listen(socket string) (*net.UnixListener, error) {
	// The path appears only once the socket listens (bound, listening and
	// private under a temporary name, then renamed): readiness is "the path
	// exists", and a dial between bind and listen would be refused.
	_ = os.Remove(socket)
	tmp := socket + ".new"
	_ = os.Remove(tmp)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false) // the path is the caller's to remove once renamed
	// One err for both: a shadowed one here lost the rename's failure.
	if err = os.Chmod(tmp, 0o600); err == nil {
		err = os.Rename(tmp, socket)
	}
	if err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, err
	}
	return l, nil
}

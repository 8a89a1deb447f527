// Package privnet makes private network namespaces: a namespace holding
// only a loopback interface, which no process can reach unless it was
// started in it or enters it. CRIU's lazy page server listens on TCP and
// serves a frozen container's memory to whoever connects first; started in
// such a namespace, only ferry can connect to it.
package privnet

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is a private network namespace, held open by a file descriptor: it
// lives until Close and the last process in it are gone.
type NS struct {
	h netns.NsHandle
}

// New makes a namespace with its loopback interface up.
func New() (*NS, error) {
	var ns *NS
	err := onThread(func(orig netns.NsHandle) error {
		h, err := netns.New() // unshare: this thread is in it now
		if err != nil {
			return fmt.Errorf("new network namespace: %w", err)
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			h.Close()
			return fmt.Errorf("loopback up in a new network namespace: %w", err)
		}
		ns = &NS{h: h}
		return nil
	})
	return ns, err
}

// Do runs f on a thread inside the namespace: sockets f makes are the
// namespace's, processes it starts are born in it.
func (n *NS) Do(f func() error) error {
	return onThread(func(netns.NsHandle) error {
		if err := netns.Set(n.h); err != nil {
			return fmt.Errorf("enter private network namespace: %w", err)
		}
		return f()
	})
}

// File is a descriptor of the namespace of its own, for a child process
// to enter (nsenter --net=/proc/self/fd/N); the caller closes it.
func (n *NS) File() (*os.File, error) {
	fd, err := unix.Dup(int(n.h))
	if err != nil {
		return nil, fmt.Errorf("network namespace descriptor: %w", err)
	}
	return os.NewFile(uintptr(fd), "netns"), nil
}

// Close lets the namespace go once nothing runs in it.
func (n *NS) Close() error { return n.h.Close() }

// onThread runs f on a locked OS thread and puts the thread back in the
// namespace it had. A thread that cannot go back is never reused: it stays
// locked, and Go ends it with its goroutine.
func onThread(f func(orig netns.NsHandle) error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return // the thread dies locked, as it is unchanged anyway
		}
		defer orig.Close()
		ferr := f(orig)
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("back to the original network namespace: %w", err))
			return // locked: the thread dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// FromHandle wraps a namespace handle someone else opened (a named
// namespace, say), to run code in it; Close closes the handle.
func FromHandle(h netns.NsHandle) *NS { return &NS{h: h} }

// SharesOurs says whether pid is in this process's network namespace: a
// container that is has no namespace of its own to hide a server in.
func SharesOurs(pid int) (bool, error) {
	theirs, err := netns.GetFromPid(pid)
	if err != nil {
		return false, fmt.Errorf("network namespace of pid %d: %w", pid, err)
	}
	defer theirs.Close()
	ours, err := netns.GetFromPid(os.Getpid())
	if err != nil {
		return false, err
	}
	defer ours.Close()
	return theirs.Equal(ours), nil
}

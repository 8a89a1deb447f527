package lab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/mounts"
)

// netnsDir is where named network namespaces are bind-mounted, the place
// `ip netns` and vishvananda/netns both use.
const netnsDir = "/run/netns"

func netnsPath(name string) string { return filepath.Join(netnsDir, name) }

// ensureNetnsDir makes netnsDir a shared mount point, as `ip netns add`
// does. Processes started with `ip netns exec` (the agents) get their own
// mount namespace as a slave of this one; without a shared mount there, a
// namespace deleted here would stay mounted, and alive, in their copy.
func ensureNetnsDir() error { return mounts.MakeShared(netnsDir) }

// onFreshThread runs fn on a locked OS thread of its own and puts the
// thread back into the caller's network namespace afterwards. If that
// fails the goroutine exits still locked, so Go discards the thread instead
// of reusing it in the wrong namespace.
func onFreshThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			done <- errors.Join(err, fmt.Errorf("return to original netns: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// addNetNS creates a named network namespace with its loopback up.
func addNetNS(name string) error {
	if err := ensureNetnsDir(); err != nil {
		return err
	}
	err := onFreshThread(func() error {
		h, err := netns.NewNamed(name)
		if err != nil {
			return err
		}
		return h.Close()
	})
	if err != nil {
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	nl, err := handleAt(name)
	if err != nil {
		return err
	}
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err == nil {
		err = nl.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("netns %s: lo up: %w", name, err)
	}
	return nil
}

// delNetNS unmounts and removes a named network namespace; a missing one
// is not an error. The namespace itself goes away with its last user,
// taking its veth ends (and so their peers) with it.
func delNetNS(name string) error {
	p := netnsPath(name)
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return nil
}

func netnsExists(name string) bool {
	_, err := os.Lstat(netnsPath(name))
	return err == nil
}

// netnsInode identifies a named namespace; processes inside it show the
// same inode in /proc/PID/ns/net.
func netnsInode(name string) (uint64, error) {
	fi, err := os.Stat(netnsPath(name))
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("stat %s: no inode", netnsPath(name))
	}
	return st.Ino, nil
}

// handleAt opens a netlink handle inside a named namespace.
func handleAt(name string) (*netlink.Handle, error) {
	h, err := cnet.NetlinkIn(netnsPath(name))
	if err != nil {
		return nil, fmt.Errorf("netlink in netns %s: %w", name, err)
	}
	return h, nil
}

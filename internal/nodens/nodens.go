// Package nodens takes an agent started in a Kubernetes pod out to its
// node: into the node's mount namespace, where the node's file systems,
// runtimes, CRIU and containers are, and out of the pod's cgroups, so that
// what the agent starts (CRIU, lazy-pages relays, page keepers) outlives
// the pod as it outlives an agent restarted by systemd (KillMode=process).
//
// The pod must be privileged and share the node's PID namespace
// (hostPID): the agent's parent is then its container's shim, which runs
// in the node's mount namespace. PID 1's is not used: it is the same on
// an ordinary node, but not readable where the node is itself a sandbox.
package nodens

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cgroups"
)

// Paths are the pod's own paths an agent reads after Enter: Enter opens
// each and gives the re-executed agent Flag=/proc/self/fd/N instead, a
// path that still leads into the pod's file system (a Secret, a
// ConfigMap) from the node's.
type Paths map[string]string

// Enter re-executes the calling program, with args, in its parent's mount
// namespace, and returns only on failure, or at once (nil) when the
// program already runs there. The flags of keep are appended to args.
//
// setns into a mount namespace needs a thread that shares no file-system
// context with others, which a Go program's threads do: the locked thread
// unshares its own first, joins, and executes the program again, so the
// whole new process starts in the node's namespace.
func Enter(args []string, keep Paths) error {
	ppid := os.Getppid()
	parent := "/proc/" + strconv.Itoa(ppid) + "/ns/mnt"
	if ppid <= 1 {
		return errors.New("no parent to take the mount namespace from: run the pod with hostPID: true (deploy/kubernetes/agent.yaml)")
	}
	same, err := sameNS("/proc/self/ns/mnt", parent)
	if err != nil {
		return fmt.Errorf("the node's mount namespace (%s): %w (the pod needs hostPID and privileged)", parent, err)
	}
	if same {
		return nil
	}
	goruntime.LockOSThread() // never unlocked: the thread executes the program or the process exits
	self, err := openKept("/proc/self/exe")
	if err != nil {
		return err
	}
	for flag, path := range keep {
		if path == "" {
			continue
		}
		fd, err := openKept(path)
		if err != nil {
			return fmt.Errorf("--%s: %w", flag, err)
		}
		args = append(args, "--"+flag+"=/proc/self/fd/"+strconv.Itoa(fd))
	}
	ns, err := os.Open(parent)
	if err != nil {
		return err
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare the file-system context: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("join the node's mount namespace: %w (the pod needs privileged: true)", err)
	}
	exe := "/proc/self/fd/" + strconv.Itoa(self)
	return fmt.Errorf("execute %s again in the node's mount namespace: %w", exe, syscall.Exec(exe, append([]string{os.Args[0]}, args...), os.Environ()))
}

// openKept opens path for the re-executed program: O_PATH, and without
// close-on-exec, so that /proc/self/fd/N names it there.
func openKept(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func sameNS(a, b string) (bool, error) {
	sa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	sb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(sa, sb), nil
}

// LeavePod moves the calling process into cgroup rel (below each
// hierarchy's root, made if missing) out of the pod's, whose processes
// the pod's end kills. Its later children start there too.
func LeavePod(rel string) error {
	rel = filepath.Clean("/" + rel)
	if err := cgroups.Make(rel); err != nil {
		return err
	}
	return cgroups.Join(rel, os.Getpid())
}

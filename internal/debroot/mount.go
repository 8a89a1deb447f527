package debroot

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/filelock"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// ServicePath is the PATH systemd gives a service: a command run in a
// root gets it and nothing else of its caller's environment.
const ServicePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// NSDir holds each mounted root's mount namespace, bound to a file as `ip
// netns` binds network namespaces (and a record of who made it), so that
// any number of commands, from any process, enter the same one.
var NSDir = "/run/ferry-debroot"

// MountUnits are the root's mount units mounted as systemd would at boot,
// when the root has them: CRIU's kernel-feature cache (the ferry
// package's run-criu.mount, which ferry-agent.service requires).
var MountUnits = []string{"run-criu.mount"}

// Bind is a host file or directory seen inside a mounted root.
type Bind struct {
	// Source is the host's path.
	Source string
	// Target is the path inside the root; "" is Source's. Symbolic
	// links in it resolve inside the root.
	Target string
	// ReadOnly binds it read-only (its top mount; submounts as they are).
	ReadOnly bool
}

// MountOptions say what of the host a mounted root sees besides what
// every host has (Mount).
type MountOptions struct {
	Binds []Bind
}

// Mounted is a root with its own mount namespace, where commands run as
// on a host of their own (Command, Start). Close ends it.
type Mounted struct {
	// Root is the root filesystem's directory on the host.
	Root string
	// NSFile is the mount namespace, for nsenter --mount.
	NSFile  string
	record  string
	nsenter string
}

// record is who mounted a root: an NSDir/NAME.json beside NAME.mnt.
type record struct {
	Root  string `json:"root"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Mount gives root a mount namespace of its own whose root it is, as a
// host booted from it would have, with everything mounted there and
// nowhere else: a fresh /proc, the host's /sys with its cgroup hierarchies, the
// host's /dev with a /dev/shm of the root's own (a tmpfs: the agent's
// scratch lives there), the host's /run/netns (so that network
// namespaces made later appear too), the root's MountUnits, and the
// binds o asks for. The root's /run is its own directory, not a tmpfs:
// the host reaches sockets there (ROOT/run/ferry/agent.sock).
//
// Mounts the host makes later below a bound directory appear inside
// only if that directory is a shared mount on the host (as /run/netns
// is); the mounts made inside never appear on the host. However the
// caller ends, the host's view of root holds no mount: removing root
// never reaches into /dev or a bound directory.
func Mount(root string, o MountOptions) (*Mounted, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "usr/bin/env")); err != nil {
		return nil, fmt.Errorf("mount %s: not a root filesystem (no usr/bin/env): %w", root, err)
	}
	m := &Mounted{Root: root}
	if m.nsenter, err = exec.LookPath("nsenter"); err != nil {
		return nil, fmt.Errorf("mount %s: %w (util-linux)", root, err)
	}
	for _, b := range o.Binds {
		if !filepath.IsAbs(b.Source) || (b.Target != "" && !filepath.IsAbs(b.Target)) {
			return nil, fmt.Errorf("mount %s: bind %s -> %s: paths must be absolute", root, b.Source, b.Target)
		}
		if _, err := os.Stat(b.Source); err != nil {
			return nil, fmt.Errorf("mount %s: bind: %w", root, err)
		}
	}
	if err := prepareNSDir(); err != nil {
		return nil, err
	}
	// Network namespaces named later (a lab's hosts) appear inside only
	// if /run/netns is a shared mount by then.
	if err := mounts.MakeShared("/run/netns"); err != nil {
		return nil, fmt.Errorf("mount %s: %w", root, err)
	}
	// One Mount at a time, whichever process asks (it takes milliseconds).
	unlock, err := filelock.Lock(context.Background(), filepath.Join(NSDir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	sweep()
	name := nsName(root)
	m.NSFile, m.record = filepath.Join(NSDir, name+".mnt"), filepath.Join(NSDir, name+".json")
	if isMountPoint(m.NSFile) {
		return nil, fmt.Errorf("mount %s: already mounted (%s, %s): Attach to it, or Close it first", root, m.NSFile, describe(m.record, m.NSFile))
	}
	f, err := os.OpenFile(m.NSFile, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return nil, err
	}
	f.Close()

	// The namespace is made on a thread of its own, locked and never
	// unlocked, so that the runtime ends the thread with the goroutine:
	// nothing else ever runs in it (offMainThread: never the main thread,
	// which the runtime keeps). Its mounts live as long as the namespace:
	// its file bound below, or a process inside.
	type made struct {
		tid int
		err error
	}
	ready, done := make(chan made), make(chan struct{})
	go offMainThread(func() {
		err := setupNamespace(root, o)
		ready <- made{unix.Gettid(), err}
		<-done
	})
	r := <-ready
	if r.err == nil {
		r.err = unix.Mount(fmt.Sprintf("/proc/%d/task/%d/ns/mnt", os.Getpid(), r.tid), m.NSFile, "", unix.MS_BIND, "")
		if r.err != nil {
			r.err = fmt.Errorf("bind the mount namespace to %s: %w", m.NSFile, r.err)
		}
	}
	close(done)
	if r.err != nil {
		_ = os.Remove(m.NSFile)
		return nil, fmt.Errorf("mount %s: %w", root, r.err)
	}
	if err := writeRecord(m.record, root); err != nil {
		return nil, errors.Join(err, m.Close())
	}
	return m, nil
}

// Attach returns the mount namespace Mount gave root, from any process
// (one that ends what an earlier one started).
func Attach(root string) (*Mounted, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if r, err := filepath.EvalSymlinks(root); err == nil {
		root = r
	}
	name := nsName(root)
	m := &Mounted{Root: root, NSFile: filepath.Join(NSDir, name+".mnt"), record: filepath.Join(NSDir, name+".json")}
	if !isMountPoint(m.NSFile) {
		return nil, fmt.Errorf("%s is not mounted (no namespace at %s)", root, m.NSFile)
	}
	if m.nsenter, err = exec.LookPath("nsenter"); err != nil {
		return nil, err
	}
	return m, nil
}

// Argv is the command line that runs argv inside the root: in its mount
// namespace (whose root it is), in the network namespace netns (a path such as
// /run/netns/h1; "" the caller's), with ServicePath and no other
// environment (argv may begin with env NAME=VALUE ... to add some). The
// PID of a process started from it is argv's: nsenter and env each exec
// the next.
func (m *Mounted) Argv(netns string, argv ...string) []string {
	a := []string{m.nsenter, "--mount=" + m.NSFile}
	if netns != "" {
		a = append(a, "--net="+netns)
	}
	a = append(a, "--", "/usr/bin/env", "-i", "PATH="+ServicePath)
	return append(a, argv...)
}

// Command is an exec.Cmd of Argv, for the caller to run.
func (m *Mounted) Command(ctx context.Context, netns string, argv ...string) *exec.Cmd {
	a := m.Argv(netns, argv...)
	return exec.CommandContext(ctx, a[0], a[1:]...)
}

// Start starts argv inside the root as a daemon (procs.StartDetached: a
// session of its own, its output appended to logPath, a host path).
func (m *Mounted) Start(netns, logPath string, argv ...string) (procs.Started, error) {
	return procs.StartDetached(m.Argv(netns, argv...), "", logPath, nil)
}

// StartService starts the root's service unit as systemd would, without
// systemd: its ExecStart exactly (ExecStart), inside the root, in the
// network namespace netns, as a daemon whose output goes to logPath (a
// host path). The unit's limits, OOM score and restarts are systemd's
// and not applied; a SIGTERM to the PID is systemd's stop.
func (m *Mounted) StartService(unit, netns, logPath string) (procs.Started, error) {
	argv, err := ExecStart(m.Root, unit)
	if err != nil {
		return procs.Started{}, err
	}
	return m.Start(netns, logPath, argv...)
}

// HostPath is where the root's path p is on the host, the root's
// symbolic links left unresolved (ROOT/run/ferry/agent.sock for the
// agent's control socket).
func (m *Mounted) HostPath(p string) string { return filepath.Join(m.Root, p) }

// Processes are the processes in the root's mount namespace (a container
// a runtime there started has a namespace of its own, and is not one).
func (m *Mounted) Processes() ([]int, error) {
	pids, err := procs.InNamespace(m.NSFile, "mnt")
	return slices.DeleteFunc(pids, func(p int) bool { return p == os.Getpid() }), err
}

// Close ends the namespace: the processes still inside get SIGTERM, then
// SIGKILL after 5 s, and its file is unmounted; the kernel then drops
// every mount inside. Closing twice is harmless.
func (m *Mounted) Close() error {
	var errs []error
	if isMountPoint(m.NSFile) {
		pids, err := m.Processes()
		errs = append(errs, err)
		if len(pids) > 0 {
			errs = append(errs, procs.Terminate(pids, 5*time.Second))
		}
		if err := unix.Unmount(m.NSFile, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m.NSFile, err))
		}
	}
	for _, p := range []string{m.NSFile, m.record} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close the root %s: %w", m.Root, err)
	}
	return nil
}

// offMainThread runs fn on a locked thread other than the process's main
// one, and returns when it did; call it as a goroutine of its own. fn may
// change its thread for good (its mount namespace): the runtime ends a
// thread whose goroutine exits locked, but it keeps the main thread,
// whose namespaces are the process's as /proc/self shows them (its
// mountinfo, ns/mnt), so fn must not run there. On the main thread, the
// goroutine holds it, locked, while another finds a thread of its own.
func offMainThread(fn func()) {
	runtime.LockOSThread()
	if unix.Gettid() != unix.Getpid() {
		fn() // and exit locked: the thread ends
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		offMainThread(fn)
	}()
	<-done
	runtime.UnlockOSThread() // the main thread, untouched
}

// nsName names a root's files in NSDir.
func nsName(root string) string {
	sum := sha256.Sum256([]byte(root))
	return hex.EncodeToString(sum[:8])
}

// setupNamespace runs on a locked thread: it gives the thread a mount
// namespace of its own whose root is root, with the root's view mounted
// there. A failure leaves nothing behind: the namespace goes with the
// thread.
func setupNamespace(root string, o MountOptions) error {
	// CLONE_NEWNS also unshares the thread's root and working directory,
	// so the chroot and pivot_root below are this thread's alone.
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	// Slave: the host's mount events (a new /run/netns/NAME) still come
	// in; nothing done here goes out, unmounts included.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave: %w", err)
	}
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", root, err)
	}
	// The host's paths are opened first and bound through /proc/self/fd
	// from inside a chroot, so that every target resolves inside the root
	// (its absolute symbolic links too), never on the host.
	type source struct {
		path, target string
		readOnly     bool
		fd           int
	}
	var sources []source
	for _, p := range []string{"/sys", "/dev", "/run/netns"} {
		sources = append(sources, source{path: p, target: p})
	}
	for _, b := range o.Binds {
		t := b.Target
		if t == "" {
			t = b.Source
		}
		sources = append(sources, source{path: b.Source, target: t, readOnly: b.ReadOnly})
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	open := func(path string) (int, error) {
		fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", path, err)
		}
		fds = append(fds, fd)
		return fd, nil
	}
	top, err := open("/")
	if err != nil {
		return err
	}
	for i := range sources {
		if sources[i].fd, err = open(sources[i].path); err != nil {
			return err
		}
	}
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := os.MkdirAll("/proc", 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, s := range sources {
		if err := bindFD(s.fd, s.target, s.readOnly); err != nil {
			return fmt.Errorf("bind %s at %s: %w", s.path, s.target, err)
		}
		if s.path == "/dev" {
			// The host's devices, but a /dev/shm of the root's own.
			if err := unix.Mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
				return fmt.Errorf("mount /dev/shm: %w", err)
			}
		}
	}
	// The root becomes the namespace's root mount, as a booted host's
	// is, not a chroot inside the host's: runc, and CRIU after it, tell
	// a container's root from its namespace's by that (CRIU refuses to
	// dump "a root task with another root than mntns" otherwise). Out of
	// the chroot through the descriptor kept, then pivot_root(".", "."),
	// which stacks the old root on the new, detached at once.
	if err := unix.Fchdir(top); err != nil {
		return err
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("leave the chroot: %w", err)
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	for _, name := range MountUnits {
		if err := mountUnit(name); err != nil {
			return err
		}
	}
	return nil
}

// bindFD binds what fd (O_PATH) names at target, made inside the root
// (the thread is chrooted) as a directory or an empty file, like it.
func bindFD(fd int, target string, readOnly bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		f.Close()
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fd), target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if readOnly {
		return unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
	}
	return nil
}

// mountUnit mounts what the root's mount unit name says, as systemd
// would, if the root has that unit (the thread is in the root).
func mountUnit(name string) error {
	path, err := UnitPath("/", name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	u, err := ReadUnit(path)
	if err != nil {
		return err
	}
	what, where, typ := u.Get("Mount", "What"), u.Get("Mount", "Where"), u.Get("Mount", "Type")
	if where == "" || typ == "" {
		return fmt.Errorf("%s: no Where= or Type=", path)
	}
	flags, data := mountOptions(u.Get("Mount", "Options"))
	if err := os.MkdirAll(where, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(what, where, typ, flags, data); err != nil {
		return fmt.Errorf("mount %s as %s says: %w", where, name, err)
	}
	return nil
}

// mountOptions splits a mount's options into the flags mount(2) takes
// and the file system's own.
func mountOptions(opts string) (uintptr, string) {
	known := map[string]uintptr{
		"ro": unix.MS_RDONLY, "rw": 0, "nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV,
		"noexec": unix.MS_NOEXEC, "sync": unix.MS_SYNCHRONOUS, "noatime": unix.MS_NOATIME,
		"nodiratime": unix.MS_NODIRATIME, "relatime": unix.MS_RELATIME, "strictatime": unix.MS_STRICTATIME,
		"suid": 0, "dev": 0, "exec": 0, "defaults": 0,
	}
	var flags uintptr
	var data []string
	for _, o := range strings.Split(opts, ",") {
		if o == "" {
			continue
		}
		if f, ok := known[o]; ok {
			flags |= f
			continue
		}
		data = append(data, o)
	}
	return flags, strings.Join(data, ",")
}

// prepareNSDir makes NSDir, a private mount where the mount holding it
// is shared: a namespace file bound there must not propagate into that
// namespace itself (a loop that would keep it forever).
func prepareNSDir() error {
	if err := os.MkdirAll(NSDir, 0o700); err != nil {
		return err
	}
	mp, shared, err := containingMount(NSDir)
	if err != nil || !shared {
		return err
	}
	if mp != NSDir {
		if err := unix.Mount(NSDir, NSDir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", NSDir, err)
		}
	}
	if err := unix.Mount("", NSDir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", NSDir, err)
	}
	return nil
}

// containingMount is the mount point dir lies on and whether that mount
// is shared (propagates to peers and slaves).
func containingMount(dir string) (string, bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	best, shared := "", false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 {
			continue
		}
		mp := fields[4]
		if mp != "/" && mp != dir && !strings.HasPrefix(dir, mp+"/") {
			continue
		}
		if len(mp) >= len(best) { // the last of stacked mounts wins
			best = mp
			sep := slices.Index(fields, "-")
			shared = sep > 6 && slices.ContainsFunc(fields[6:sep], func(s string) bool { return strings.HasPrefix(s, "shared:") })
		}
	}
	return best, shared, sc.Err()
}

// isMountPoint says whether path is the mount point of a mount (a bound
// namespace file is one).
func isMountPoint(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Stat(filepath.Dir(path), &parent) != nil {
		return false
	}
	if st.Dev != parent.Dev {
		return true
	}
	// A bind mount of a file on the same file system: ask the table.
	mps, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(mps)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func writeRecord(path, root string) error {
	start, _ := procs.StartTime(os.Getpid())
	b, err := json.Marshal(record{Root: root, PID: os.Getpid(), Start: start})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func readRecord(path string) (record, error) {
	var r record
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// creatorAlive says whether the process that mounted a root still runs.
func (r record) creatorAlive() bool {
	st, ok := procs.StartTime(r.PID)
	return ok && st == r.Start && procs.Alive(r.PID)
}

// describe says who holds a mounted root's namespace, for errors.
func describe(recordPath, nsFile string) string {
	pids, _ := procs.InNamespace(nsFile, "mnt")
	r, err := readRecord(recordPath)
	if err != nil {
		return fmt.Sprintf("no record; %d processes inside", len(pids))
	}
	state := "gone"
	if r.creatorAlive() {
		state = "running"
	}
	return fmt.Sprintf("mounted by pid %d (%s); %d processes inside", r.PID, state, len(pids))
}

// sweep drops the namespaces of roots whose mounter is gone and in which
// nothing runs (a test killed before its Close), and records of files no
// longer mounted (after a reboot). A namespace with processes inside is
// left alone: a lab whose agents outlived the command that started them.
func sweep() {
	recs, _ := filepath.Glob(filepath.Join(NSDir, "*.json"))
	for _, rp := range recs {
		nsFile := strings.TrimSuffix(rp, ".json") + ".mnt"
		if isMountPoint(nsFile) {
			r, err := readRecord(rp)
			if err == nil && r.creatorAlive() {
				continue
			}
			if pids, err := procs.InNamespace(nsFile, "mnt"); err != nil || len(pids) > 0 {
				continue
			}
			if unix.Unmount(nsFile, unix.MNT_DETACH) != nil {
				continue
			}
		}
		_ = os.Remove(nsFile)
		_ = os.Remove(rp)
	}
}

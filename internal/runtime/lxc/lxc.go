// Package lxc moves LXC containers: it implements runtime.Runtime for
// liblxc 5 (Debian 12's lxc 5.0.2) by driving the lxc-* commands, without
// cgo.
//
// The source stays resumable until the commit through the cgroup freezer:
// Freeze is lxc-freeze, and Checkpoint runs `lxc-checkpoint` without -s,
// so liblxc passes CRIU --leave-running; CRIU finds the freezer cgroup
// FROZEN and writes FROZEN back before it lets go of the tasks. The
// container stays frozen, lxc-unfreeze (Thaw) resumes it after a failure,
// and Remove stops and destroys it after the commit.
//
// liblxc has no flag for CRIU's page server (only for pre-dumps'), so the
// memory goes to ferry's page server through a CRIU configuration file
// named by CRIU_CONFIG_FILE: liblxc execs criu with its own environment.
// The same file carries mntns-compat-mode into the restore (see Restore).
//
// liblxc looks "criu" up in PATH. Every lxc-* command runs with PATH
// starting at the directory of Runtime.CRIU, so the CRIU ferry checked is
// the one that runs (Debian's own criu 3.17 does not work on new kernels).
package lxc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/privnet"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/tail"
)

const (
	// DefaultLXCPath is liblxc's own default lxcpath.
	DefaultLXCPath = "/var/lib/lxc"
	// systemPath follows the CRIU's directory in the PATH lxc-* runs with.
	systemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// minCRIU is the oldest CRIU that works on the kernels ferry runs on
// (4.1 cannot dump TCP sockets on Linux >= 6.16; 3.17 fails on the vDSO).
var minCRIU = [3]int{4, 2, 0}

// Runtime is LXC as a ferry runtime: the containers under one lxcpath.
// Two emulated hosts on one machine use two lxcpaths.
type Runtime struct {
	// LXCPath holds the containers, one directory each (lxc-* -P);
	// empty means DefaultLXCPath.
	LXCPath string
	// NetNS, when set, is the network namespace (a path) the lxc-* tools
	// run in: the one the containers' monitors run in (a lab host's), for
	// callers outside it. The agent runs there already and leaves it empty.
	NetNS string
	// CRIU is the criu binary liblxc runs; empty means criu.Binary's. Its
	// file name must be "criu" (liblxc looks that name up in PATH).
	CRIU string
	// Admission is what this host accepts of an incoming container's
	// config, checked before Prepare writes anything (see policy).
	Admission admission.Policy
	// ContainerNetNS is the network namespace (a path) this host gives
	// restored containers: the agent's --netns.
	ContainerNetNS string
	// SharedBridges are bridges on a segment the hosts share (the agent's
	// --segment-bridge): a container on one keeps its address and its
	// connections; on another bridge they are closed.
	SharedBridges []string
	// Lazy says CRIU's lazy pages work on this host (fs.pipe-max-size,
	// userfaultfd): the lazy modes are offered.
	Lazy bool

	checkOnce sync.Once
	checkErr  error
	// sysfsAlien: /sys shows another network namespace (sysfsForeign).
	sysfsOnce  sync.Once
	sysfsAlien bool
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns the runtime for the containers under lxcpath ("" for
// DefaultLXCPath).
func New(lxcpath string) *Runtime { return &Runtime{LXCPath: lxcpath} }

func (r *Runtime) path() string {
	if r.LXCPath != "" {
		return r.LXCPath
	}
	return DefaultLXCPath
}

func (r *Runtime) criu() string {
	if r.CRIU != "" {
		return r.CRIU
	}
	p, err := criu.Binary()
	if err != nil {
		return "criu" // doCheck says it is missing
	}
	return p
}

// dir is a container's directory: its config, and its rootfs when ferry
// made it.
func (r *Runtime) dir(name string) string { return filepath.Join(r.path(), name) }

// Kind is "lxc".
func (r *Runtime) Kind() string { return "lxc" }

// Caps: the freezer keeps the source resumable (see the package comment).
// liblxc has no flag for CRIU's lazy pages, but CRIU's configuration file
// does (lazyDump, Restore): offered where they work here. liblxc's
// pre-dump needs soft-dirty tracking and is not wired: not offered. A
// restored copy stays frozen until Start (see Restore).
func (r *Runtime) Caps() runtime.Caps {
	return runtime.Caps{Freeze: true, LazyDump: r.Lazy, LazyRestore: r.Lazy, RestoreStopped: true}
}

// env is the environment of every lxc-* command: PATH finds r.criu()
// first, and CRIU_CONFIG_FILE is conf or nothing (never one inherited).
func (r *Runtime) env(conf string) []string { return r.envWithCRIU(conf, filepath.Dir(r.criu())) }

// envWithCRIU is env with PATH finding "criu" in dir first.
func (r *Runtime) envWithCRIU(conf, dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "CRIU_CONFIG_FILE=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+dir+":"+systemPath)
	if conf != "" {
		env = append(env, "CRIU_CONFIG_FILE="+conf)
	}
	return env
}

// command builds an lxc-* command for this lxcpath in its own process
// group: cancelling ctx kills the group, so a criu that lxc-checkpoint
// forked does not outlive it.
func (r *Runtime) command(ctx context.Context, conf, tool string, args ...string) *exec.Cmd {
	argv := append([]string{tool, "-P", r.path()}, args...)
	if r.sysfsForeign() {
		// liblxc finds bridges and links through /sys/class/net, which
		// shows the namespace sysfs was mounted in: where that is not the
		// one the tools run in (entered by nsenter, as the lab's hosts
		// are), they run with a sysfs of their own, the cgroup mounts
		// kept.
		argv = append([]string{"unshare", "--mount", "--", "sh", "-c", remountSysfs, "lxc-sysfs"}, argv...)
	}
	if r.NetNS != "" {
		// liblxc's command socket answers only inside the network
		// namespace its monitor runs in.
		argv = append([]string{"nsenter", "--net=" + r.NetNS, "--"}, argv...)
	}
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Env = r.env(conf)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 5 * time.Second
	return c
}

// remountSysfs mounts a sysfs of the caller's network namespace over
// /sys in a mount namespace of its own, moves the cgroup mounts onto it,
// and runs its arguments.
const remountSysfs = `mount --make-rprivate / && d=$(mktemp -d /run/ferry-lxc-cgroup.XXXXXX) && ` +
	`mount --rbind /sys/fs/cgroup "$d" && mount -t sysfs sysfs /sys && mount --move "$d" /sys/fs/cgroup && rmdir "$d" && exec "$@"`

// sysfsForeign says, once, whether /sys shows another network namespace
// than the one the tools run in: one of its interfaces is missing from
// /sys/class/net.
func (r *Runtime) sysfsForeign() bool {
	r.sysfsOnce.Do(func() {
		var names []string
		list := func() error {
			ifs, err := net.Interfaces()
			for _, i := range ifs {
				names = append(names, i.Name)
			}
			return err
		}
		var err error
		if r.NetNS == "" {
			err = list()
		} else {
			var h netns.NsHandle
			if h, err = netns.GetFromPath(r.NetNS); err == nil {
				ns := privnet.FromHandle(h)
				err = ns.Do(list)
				ns.Close()
			}
		}
		for _, n := range names {
			if _, serr := os.Stat(filepath.Join("/sys/class/net", n)); serr != nil && err == nil {
				r.sysfsAlien = true
			}
		}
	})
	return r.sysfsAlien
}

// Start starts a container of this lxcpath (lxc-start, daemonized).
func (r *Runtime) Start(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	_, err := r.run(ctx, "", "lxc-start", "-n", name)
	return err
}

// run runs an lxc-* command that leaves no process behind and returns its
// standard output; an error quotes the tail of its standard error.
func (r *Runtime) run(ctx context.Context, conf, tool string, args ...string) (string, error) {
	c := r.command(ctx, conf, tool, args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.String(), r.failed(tool, args, err, errb.Bytes())
	}
	return out.String(), nil
}

// failed is the error of an lxc-* command: the command line, how it
// ended, and the tail of its standard error.
func (r *Runtime) failed(tool string, args []string, err error, stderr []byte) error {
	return fmt.Errorf("%s -P %s %s: %w: %s", tool, r.path(), strings.Join(args, " "), err, tail.Lines(strings.TrimSpace(string(stderr)), 6))
}

// check says, once, whether this host can checkpoint and restore LXC
// containers: the lxc-* tools and a recent enough CRIU.
func (r *Runtime) check() error {
	r.checkOnce.Do(func() { r.checkErr = r.doCheck() })
	return r.checkErr
}

func (r *Runtime) doCheck() error {
	for _, tool := range []string{"lxc-checkpoint", "lxc-info", "lxc-freeze", "lxc-unfreeze", "lxc-cgroup", "lxc-stop", "lxc-destroy"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("LXC is not installed (%s not found; apt-get install lxc)", tool)
		}
	}
	bin := r.criu()
	if filepath.Base(bin) != "criu" {
		return fmt.Errorf("CRIU binary %s: liblxc runs \"criu\" from PATH, so the file must be named criu", bin)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w (CRIU >= %d.%d is needed)", bin, err, minCRIU[0], minCRIU[1])
	}
	v, err := criuVersion(string(out))
	if err != nil {
		return fmt.Errorf("%s --version: %w", bin, err)
	}
	for i := range v {
		if v[i] != minCRIU[i] {
			if v[i] < minCRIU[i] {
				return fmt.Errorf("%s is CRIU %d.%d.%d: LXC migration needs CRIU >= %d.%d", bin, v[0], v[1], v[2], minCRIU[0], minCRIU[1])
			}
			break
		}
	}
	return nil
}

// criuVersion reads "Version: 4.2.1" from `criu --version`.
func criuVersion(out string) ([3]int, error) {
	var v [3]int
	for _, l := range strings.Split(out, "\n") {
		s, ok := strings.CutPrefix(strings.TrimSpace(l), "Version:")
		if !ok {
			continue
		}
		for i, p := range strings.SplitN(strings.TrimSpace(s), ".", 3) {
			n, err := strconv.Atoi(strings.TrimFunc(p, func(r rune) bool { return r < '0' || r > '9' }))
			if err != nil {
				return v, fmt.Errorf("cannot read version %q", s)
			}
			v[i] = n
		}
		return v, nil
	}
	return v, fmt.Errorf("no version in %q", strings.TrimSpace(out))
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name || strings.ContainsAny(name, " \t\n") {
		return fmt.Errorf("bad LXC container name %q", name)
	}
	return nil
}

// info reads the container's state (RUNNING, FROZEN, STOPPED, ...) and,
// when it runs, its init PID from lxc-info.
func (r *Runtime) info(ctx context.Context, name string) (string, int, error) {
	out, err := r.run(ctx, "", "lxc-info", "-n", name, "-s", "-p")
	if err != nil {
		return "", 0, err
	}
	var state string
	var pid int
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "State":
			state = strings.TrimSpace(v)
		case "PID":
			pid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if state == "" {
		return "", 0, fmt.Errorf("lxc-info -P %s -n %s printed no state: %q", r.path(), name, out)
	}
	return state, pid, nil
}

// status maps liblxc's states onto ferry's running, paused and stopped.
func status(state string) string {
	switch state {
	case "RUNNING", "THAWED":
		return "running"
	case "FROZEN", "FREEZING":
		return "paused"
	case "STOPPED":
		return "stopped"
	}
	return strings.ToLower(state)
}

// Inspect reads the container's config and lxc-info. Meta carries the
// config ("config"), the source's lxcpath ("lxcpath", to rewrite paths
// under it) and the files under the container's directory that the config
// names ("file:<path relative to it>": an fstab, hook scripts).
func (r *Runtime) Inspect(ctx context.Context, name string) (*runtime.Container, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	dir := r.dir(name)
	cfg, err := os.ReadFile(filepath.Join(dir, "config"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("lxc -P %s: no container %q: %w", r.path(), name, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	lines := parseConfig(cfg)
	rv, _ := lookup(lines, "lxc.rootfs.path")
	root, err := rootfsDir(rv)
	if err != nil {
		return nil, fmt.Errorf("container %q: %w", name, err)
	}
	state, pid, err := r.info(ctx, name)
	if err != nil {
		return nil, err
	}
	meta := map[string][]byte{"config": cfg, "lxcpath": []byte(r.path())}
	for _, l := range lines {
		if !strings.HasPrefix(l.Value, dir+"/") || l.Key == "lxc.rootfs.path" || l.Key == "lxc.log.file" || l.Key == "lxc.console.logfile" {
			continue
		}
		st, err := os.Stat(l.Value)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if st.Size() > 1<<20 {
			return nil, fmt.Errorf("container %q: %s (%s) is over 1 MiB, too large to carry with the config", name, l.Value, l.Key)
		}
		b, err := os.ReadFile(l.Value)
		if err != nil {
			return nil, err
		}
		meta["file:"+strings.TrimPrefix(l.Value, dir+"/")] = b
	}
	return &runtime.Container{Runtime: r.Kind(), Name: name, ID: name, PID: pid, Status: status(state), Rootfs: root, Meta: meta,
		Networks: networksOf(lines, r.SharedBridges), Shared: sharedOf(lines)}, nil
}

// Freeze stops the container with the cgroup freezer and tells liblxc's
// monitor (lxc-freeze), which then reports FROZEN.
//
// With cgroup v1, lxc-freeze alone often costs a second: it writes FROZEN,
// reads the state back at once, and on FREEZING (tasks not yet in the
// refrigerator) sleeps a whole second before it looks again. So the
// freezer is set through lxc-cgroup and polled here first; lxc-freeze
// then finds it FROZEN on its first look.
func (r *Runtime) Freeze(ctx context.Context, c *runtime.Container) error {
	if file, _ := freezer(); file == "freezer.state" {
		if _, err := r.run(ctx, "", "lxc-cgroup", "-n", c.ID, file, "FROZEN"); err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := r.run(ctx, "", "lxc-cgroup", "-n", c.ID, file)
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) == "FROZEN" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("lxc: container %q did not freeze in 10 s (freezer %s)", c.ID, strings.TrimSpace(out))
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	_, err := r.run(ctx, "", "lxc-freeze", "-n", c.ID)
	return err
}

// Thaw is lxc-unfreeze. liblxc thaws only a container its monitor knows
// as FROZEN; a freezer cgroup frozen behind its back (CRIU restores the
// freezer state it dumped) is thawed through lxc-cgroup as well.
func (r *Runtime) Thaw(ctx context.Context, c *runtime.Container) error {
	if _, err := r.run(ctx, "", "lxc-unfreeze", "-n", c.ID); err != nil {
		return err
	}
	return r.thawCgroup(ctx, c.ID)
}

// freezer names the freezer's control file and its thawed value: cgroup
// v1's freezer.state where the v1 freezer is mounted, else v2's
// cgroup.freeze.
func freezer() (file, thawed string) {
	if st, err := os.Stat("/sys/fs/cgroup/freezer"); err == nil && st.IsDir() {
		return "freezer.state", "THAWED"
	}
	return "cgroup.freeze", "0"
}

// thawCgroup thaws the container's freezer cgroup unless it is thawed.
func (r *Runtime) thawCgroup(ctx context.Context, name string) error {
	file, thawed := freezer()
	out, err := r.run(ctx, "", "lxc-cgroup", "-n", name, file)
	if err == nil && strings.TrimSpace(out) == thawed {
		return nil
	}
	_, err = r.run(ctx, "", "lxc-cgroup", "-n", name, file, thawed)
	return err
}

// Checkpoint dumps the frozen container with `lxc-checkpoint -D ImagesDir`
// (no -s: it stays, frozen), its memory going to o.PageServer. liblxc
// writes CRIU's log to ImagesDir/dump.log; it is moved to WorkDir, where
// CRIU also writes stats-dump.
func (r *Runtime) Checkpoint(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions) (runtime.Dump, error) {
	switch {
	case o.PreDump || o.ParentDir != "":
		return nil, errors.New("lxc: CRIU pre-dumps are not supported by ferry's LXC runtime")
	case o.Lazy && !r.Lazy:
		return nil, errors.New("lxc: lazy dumps are not available on this host (see ferry check)")
	case o.ImagesDir == "" || o.WorkDir == "":
		return nil, errors.New("lxc: a checkpoint needs an images and a work directory")
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(filepath.Join(r.dir(c.ID), "config"))
	if err != nil {
		return nil, fmt.Errorf("lxc: container %q: %w", c.ID, err)
	}
	if err := checkMovable(parseConfig(cfg)); err != nil {
		return nil, fmt.Errorf("lxc: container %q: %w", c.ID, err)
	}
	for _, d := range []string{o.ImagesDir, o.WorkDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	// A running container is frozen first, so that a dump always leaves
	// it frozen (resumable by Thaw, gone after Remove).
	state, _, err := r.info(ctx, c.ID)
	if err != nil {
		return nil, err
	}
	switch state {
	case "FROZEN":
	case "RUNNING":
		if err := r.Freeze(ctx, c); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("lxc: container %q is %s, not running", c.ID, state)
	}
	conf := append([]string{"work-dir " + quote(o.WorkDir), "verbosity=4"},
		tcpOptions(o.TCPEstablished, o.TCPClose, o.NetworkQuiet)...)
	if o.PageServer != "" {
		host, port, err := net.SplitHostPort(o.PageServer)
		if err != nil {
			return nil, fmt.Errorf("lxc: page server %q: %w", o.PageServer, err)
		}
		// A lazy dump is the page server (it listens there); any other
		// sends its pages to one.
		if !o.Lazy {
			conf = append(conf, "page-server")
		}
		conf = append(conf, "address "+host, "port "+port)
	}
	for _, p := range o.IrmapScanPaths {
		conf = append(conf, "irmap-scan-path "+quote(p))
	}
	if o.Lazy {
		return r.lazyDump(ctx, c, o, conf)
	}
	confPath := filepath.Join(o.WorkDir, "criu-dump.conf")
	if err := writeCRIUConfig(confPath, conf); err != nil {
		return nil, err
	}
	_, err = r.run(ctx, confPath, "lxc-checkpoint", "-n", c.ID, "-D", o.ImagesDir)
	if err != nil {
		return nil, fmt.Errorf("%w%s", err, criu.LogErrors(dumpLog(o)))
	}
	dumpLog(o)
	return doneDump{}, nil
}

// dumpLog moves the CRIU log liblxc writes into the images directory to
// the work directory, and returns where it is.
func dumpLog(o runtime.CheckpointOptions) string {
	log := filepath.Join(o.WorkDir, "dump.log")
	if err := os.Rename(filepath.Join(o.ImagesDir, "dump.log"), log); err != nil && !errors.Is(err, os.ErrNotExist) {
		return filepath.Join(o.ImagesDir, "dump.log")
	}
	return log
}

// Fixed descriptors of a lazy dump's lxc-checkpoint, which liblxc leaves
// open for the criu it execs: CRIU's readiness (status-fd), and the
// private network namespace its page server is to listen in.
const (
	lazyStatusFD = 3
	lazyNetFD    = 4
)

// lazyDump runs `lxc-checkpoint` with CRIU's lazy-pages (through its
// configuration file: liblxc has no flag for it) and returns once CRIU's
// page server listens; lxc-checkpoint runs on until that server is closed.
//
// lxc-checkpoint itself must run where the container's monitor answers
// (its command socket is an abstract one, seen in one network namespace
// only), but the page server must listen in o.PageNet: criu is reached
// through a wrapper, first in PATH, that enters the namespace
// lxc-checkpoint was handed as a descriptor.
func (r *Runtime) lazyDump(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions, conf []string) (runtime.Dump, error) {
	conf = append(conf, "lazy-pages", "status-fd "+strconv.Itoa(lazyStatusFD))
	confPath := filepath.Join(o.WorkDir, "criu-dump.conf")
	if err := writeCRIUConfig(confPath, conf); err != nil {
		return nil, err
	}
	status, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer status.Close()
	errPath := filepath.Join(o.WorkDir, "lxc-dump.err")
	errf, err := os.Create(errPath)
	if err != nil {
		w.Close()
		return nil, err
	}
	defer errf.Close()
	args := []string{"-n", c.ID, "-D", o.ImagesDir}
	cmd := r.command(ctx, confPath, "lxc-checkpoint", args...)
	cmd.Stdout, cmd.Stderr = errf, errf
	cmd.ExtraFiles = []*os.File{w}
	if o.PageNet != nil {
		wrapper, err := criuInNetns(o.WorkDir, r.criu())
		if err != nil {
			w.Close()
			return nil, err
		}
		nsf, err := o.PageNet.File()
		if err != nil {
			w.Close()
			return nil, err
		}
		defer nsf.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, nsf)
		cmd.Env = r.envWithCRIU(confPath, wrapper)
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("lxc-checkpoint: %w", err)
	}
	d := &lazyDumping{done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		if d.err != nil {
			msg, _ := os.ReadFile(errPath)
			d.err = fmt.Errorf("%w%s", r.failed("lxc-checkpoint", args, d.err, msg), criu.LogErrors(dumpLog(o)))
		} else {
			dumpLog(o)
		}
		close(d.done)
	}()
	var b [1]byte
	if n, rerr := status.Read(b[:]); n != 1 {
		<-d.done
		return nil, errors.Join(d.err, fmt.Errorf("lxc: CRIU never signalled that the lazy page server is ready: %v", rerr))
	}
	return d, nil
}

// lazyDumping is a lazy lxc-checkpoint whose page server serves; the
// container stays frozen (Caps.Freeze), so Release has nothing to do.
type lazyDumping struct {
	done chan struct{}
	err  error
}

func (d *lazyDumping) Wait() error                       { <-d.done; return d.err }
func (*lazyDumping) Release(context.Context, bool) error { return nil }

// criuInNetns writes, in dir, a directory holding a "criu" that runs real
// in the network namespace open on descriptor lazyNetFD, and returns the
// directory (to go first in PATH: liblxc looks "criu" up there).
func criuInNetns(dir, real string) (string, error) {
	bin := filepath.Join(dir, "criu-in-netns")
	if err := os.MkdirAll(bin, 0o700); err != nil {
		return "", err
	}
	script := fmt.Sprintf("#!/bin/sh\nexec nsenter --net=/proc/self/fd/%d -- %s \"$@\"\n", lazyNetFD, shellQuote(real))
	if err := os.WriteFile(filepath.Join(bin, "criu"), []byte(script), 0o700); err != nil {
		return "", err
	}
	return bin, nil
}

// shellQuote makes s one word for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// writeCRIUConfig writes a CRIU configuration file, one option a line.
func writeCRIUConfig(path string, lines []string) error {
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// quote makes a path one value in a CRIU configuration file.
func quote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}

// doneDump is a dump that had finished when Checkpoint returned; the
// container it leaves frozen is thawed (Thaw) or removed (Remove).
type doneDump struct{}

func (doneDump) Wait() error                         { return nil }
func (doneDump) Release(context.Context, bool) error { return nil }

// Remove stops (kills) the container and destroys it: its config, and its
// rootfs as lxc-destroy does. A container already gone counts as removed.
func (r *Runtime) Remove(ctx context.Context, c *runtime.Container) error {
	return r.destroy(ctx, c.ID)
}

func (r *Runtime) destroy(ctx context.Context, name string) error {
	if _, err := os.Stat(filepath.Join(r.dir(name), "config")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	state, _, err := r.info(ctx, name)
	if err != nil {
		return err
	}
	if state != "STOPPED" {
		// liblxc's stop kills init and thaws a frozen container, then
		// waits for it to stop.
		if _, err := r.run(ctx, "", "lxc-stop", "-n", name, "-k"); err != nil {
			if st, _, ierr := r.info(ctx, name); ierr != nil || st != "STOPPED" {
				return err
			}
		}
	}
	if _, err = r.run(ctx, "", "lxc-destroy", "-n", name); err != nil {
		return err
	}
	return RemoveIdleCgroups(name)
}

// Prepare makes the container here: its directory under this lxcpath, the
// source's config rewritten for it (see rewriteConfig), the files the
// config names, and an empty rootfs for the engine to sync into. It
// refuses a name taken here, what cannot work on this host, and what this
// host's admission policy refuses of the rewritten config, before it
// writes anything.
func (r *Runtime) Prepare(ctx context.Context, c *runtime.Container, o runtime.PrepareOptions) (runtime.Target, error) {
	if err := validName(c.Name); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	cfg := c.Meta["config"]
	if len(cfg) == 0 {
		return nil, fmt.Errorf("lxc: the source sent no LXC config for %q", c.Name)
	}
	if o.NetNS != "" {
		return nil, errors.New("lxc: containers cannot join a network namespace ferry rebuilt; LXC makes its own from the config")
	}
	dir := r.dir(c.Name)
	if _, err := os.Lstat(dir); err == nil {
		if _, err := os.Stat(filepath.Join(dir, "config")); err == nil {
			return nil, fmt.Errorf("lxc -P %s already has a container named %q", r.path(), c.Name)
		}
		return nil, fmt.Errorf("lxc -P %s: %s already exists (left over? remove it first)", r.path(), dir)
	}
	files := map[string][]byte{}
	for k, v := range c.Meta {
		if rel, ok := strings.CutPrefix(k, "file:"); ok {
			p := filepath.Join(dir, rel)
			if !strings.HasPrefix(p, dir+"/") {
				return nil, fmt.Errorf("lxc: bad file %q from the source", rel)
			}
			files[p] = v
		}
	}
	env := defaultHostEnv()
	env.addressTaken = func(link string, a netip.Addr) string { return r.addressTaken(c.Name, link, a) }
	hostPath := env.pathExists
	env.pathExists = func(p string) bool { _, carried := files[p]; return carried || hostPath(p) }
	srcDir := ""
	if p := string(c.Meta["lxcpath"]); p != "" {
		srcDir = filepath.Join(p, c.Name)
	}
	newCfg, _, err := rewriteConfig(cfg, srcDir, dir, env)
	if err != nil {
		return nil, fmt.Errorf("lxc: container %q cannot run here: %w", c.Name, err)
	}
	text := admissionText(newCfg, files)
	if err := r.policy().CheckLXCConfig(text); err != nil {
		return nil, fmt.Errorf("lxc: container %q: %w", c.Name, err)
	}
	if err := os.MkdirAll(r.path(), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o770); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("lxc -P %s already has a container named %q", r.path(), c.Name)
		}
		return nil, err
	}
	t := &target{r: r, name: c.Name, dir: dir, config: text}
	err = os.Mkdir(t.RootfsDir(), 0o755)
	for p, b := range files {
		if err != nil {
			break
		}
		if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
			err = os.WriteFile(p, b, 0o644)
		}
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "config"), newCfg, 0o640)
	}
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	return t, nil
}

// addressTaken names a container under this lxcpath, other than name,
// whose config gives it address a on link ("" for none): running or not,
// the two could not both run.
func (r *Runtime) addressTaken(name, link string, a netip.Addr) string {
	ents, _ := os.ReadDir(r.path())
	for _, e := range ents {
		if e.Name() == name {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.path(), e.Name(), "config"))
		if err != nil {
			continue
		}
		for _, n := range networksOf(parseConfig(b), nil) {
			if n.Name == link && n.Address == a.String() {
				return e.Name()
			}
		}
	}
	return ""
}

// policy is the admission policy for a container restored here. A
// container on LXC's "none" network shares the network namespace that
// lxc-checkpoint runs in: NetNS when set (a namespace chosen for the
// containers, as a lab host's), else this process's. That is not this
// machine's own network when it is ContainerNetNS, the namespace where
// this host puts restored containers (a runc container that joined one
// goes there too): so where the agent runs in its --netns (the lab's
// agents), such a container is admitted without --allow-host-network.
func (r *Runtime) policy() admission.Policy {
	p := r.Admission
	if r.NetNS != "" || (r.ContainerNetNS != "" && sameFile("/proc/self/ns/net", r.ContainerNetNS)) {
		p.HostNetwork = true
	}
	return p
}

// sameFile says whether two paths name the same file (for namespaces: the
// same namespace).
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// admissionText is the config as the admission policy reads it: a fstab
// the container carries (written by Prepare with the config) inlined as
// the lxc.mount.entry lines it amounts to, since the policy reads no
// files. Any other lxc.mount.fstab stays, and is refused.
func admissionText(cfg []byte, files map[string][]byte) string {
	var b strings.Builder
	for _, l := range parseConfig(cfg) {
		fstab, carried := files[l.Value]
		if l.Key != "lxc.mount.fstab" || !carried {
			b.WriteString(l.Raw + "\n")
			continue
		}
		for _, e := range strings.Split(string(fstab), "\n") {
			if e = strings.TrimSpace(e); e != "" && !strings.HasPrefix(e, "#") {
				b.WriteString("lxc.mount.entry = " + e + "\n")
			}
		}
	}
	return b.String()
}

// target is a container defined here, waiting for its rootfs and restore.
type target struct {
	r    *Runtime
	name string
	dir  string
	// config is the container's config as admission read it.
	config string
}

func (t *target) RootfsDir() string { return filepath.Join(t.dir, "rootfs") }

// CheckImages checks the CRIU images against the container's config
// (admission.CheckLXCImages): CRIU restores the tasks' capabilities from
// the images, not from the config.
func (t *target) CheckImages(dir string) error {
	return t.r.policy().CheckLXCImages(dir, t.config)
}

// Restore runs `lxc-checkpoint -r -d` from ImagesDir (every image, the
// pages too, and liblxc's tty.info where the container has a console).
//
// Its CRIU config file adds mntns-compat-mode: CRIU's newer mount engine
// fails on liblxc's bind mounts of host directories ("mnt-v2: Failed to
// move_mount"). The container comes back frozen: CRIU restores the freezer
// state it dumped (the source is always frozen for its dump), and liblxc
// does not know. It stays frozen until Start, so that a copy that is never
// committed never runs: Restore waits until lxc-info reports it FROZEN
// with an init PID. Should CRIU ever bring it back thawed, Restore freezes
// it at once.
func (t *target) Restore(ctx context.Context, o runtime.RestoreOptions) (int, error) {
	r := t.r
	if o.Lazy && !r.Lazy {
		return 0, errors.New("lxc: lazy restores are not available on this host (see ferry check)")
	}
	if o.ImagesDir == "" || o.WorkDir == "" {
		return 0, errors.New("lxc: a restore needs an images and a work directory")
	}
	if err := r.check(); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
		return 0, err
	}
	confPath := filepath.Join(o.WorkDir, "criu-restore.conf")
	conf := append([]string{"mntns-compat-mode", "work-dir " + quote(o.WorkDir), "verbosity=4"},
		tcpOptions(o.TCPEstablished, o.TCPClose, false)...)
	if o.Lazy {
		// The lazy-pages daemon's socket is in the work directory.
		conf = append(conf, "lazy-pages")
	}
	if err := writeCRIUConfig(confPath, conf); err != nil {
		return 0, err
	}
	// The container's monitor is lxc-checkpoint's grandchild and keeps its
	// standard error open as long as the container runs: a file, not a
	// pipe that Wait would wait on.
	errPath := filepath.Join(o.WorkDir, "lxc-restore.err")
	errf, err := os.Create(errPath)
	if err != nil {
		return 0, err
	}
	args := []string{"-n", t.name, "-r", "-D", o.ImagesDir, "-d"}
	cmd := r.command(ctx, confPath, "lxc-checkpoint", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Stderr = errf
	err = cmd.Run()
	errf.Close()
	log := filepath.Join(o.WorkDir, "restore.log")
	if rerr := os.Rename(filepath.Join(o.ImagesDir, "restore.log"), log); rerr != nil {
		log = filepath.Join(o.ImagesDir, "restore.log")
	}
	if err != nil {
		msg, _ := os.ReadFile(errPath)
		return 0, fmt.Errorf("%w%s", r.failed("lxc-checkpoint", args, err, msg), criu.LogErrors(log))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		state, pid, err := r.info(ctx, t.name)
		if err == nil && state == "RUNNING" && pid > 0 {
			if err := r.Freeze(ctx, &runtime.Container{Name: t.name, ID: t.name}); err != nil {
				return 0, fmt.Errorf("restored container runs before its commit and cannot be frozen: %w", err)
			}
			continue
		}
		if err == nil && state == "FROZEN" && pid > 0 {
			return pid, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("lxc-info says %s", state)
			}
			return 0, fmt.Errorf("restored container %q is not running: %w", t.name, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Start thaws the restored container.
func (t *target) Start(ctx context.Context) error {
	return t.r.Continue(ctx, &runtime.Container{Name: t.name, ID: t.name})
}

// Continue thaws a container restored frozen (an agent restarted between
// the commit and the start).
func (r *Runtime) Continue(ctx context.Context, c *runtime.Container) error {
	return r.Thaw(ctx, c)
}

// Discard stops and destroys whatever Prepare and Restore made, the
// cgroups of a restore that died among them.
func (t *target) Discard(ctx context.Context) error {
	err := t.r.destroy(ctx, t.name)
	return errors.Join(err, os.RemoveAll(t.dir))
}

// List is lxc-ls under the lxcpath, with each container's lxc-info.
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	if _, err := os.Stat(r.path()); errors.Is(err, os.ErrNotExist) {
		return nil, nil // no container was ever made here
	}
	out, err := r.run(ctx, "", "lxc-ls", "-1")
	if err != nil {
		return nil, err
	}
	var cs []runtime.Container
	for _, name := range strings.Fields(out) {
		state, pid, err := r.info(ctx, name)
		if err != nil {
			return nil, err
		}
		c := runtime.Container{Runtime: r.Kind(), Name: name, ID: name, Status: status(state)}
		if c.Status != "stopped" {
			c.PID = pid
		}
		cs = append(cs, c)
	}
	return cs, nil
}

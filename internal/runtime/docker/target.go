package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// checkpointName is the checkpoint ferry's images appear as in the
// restored container's checkpoints directory.
const checkpointName = "ferry"

// Prepare has this host's Docker create the container from the source's
// configuration, under the same name and a new ID, not started. It
// refuses first, with nothing created, another runtime's container, what
// this host's admission policy refuses (admit), a missing image, a taken
// name.
func (r *Runtime) Prepare(ctx context.Context, c *runtime.Container, o runtime.PrepareOptions) (runtime.Target, error) {
	if c.Runtime != r.Kind() {
		return nil, fmt.Errorf("docker cannot receive a %s container", c.Runtime)
	}
	if o.NetNS != "" {
		return nil, errors.New("docker: the container had a network namespace of its own that ferry rebuilt; Docker sets up its containers' networks itself: not supported")
	}
	cfg, err := parseConfig(c)
	if err != nil {
		return nil, err
	}
	if err := r.admit(cfg); err != nil {
		return nil, err
	}
	cl, err := r.connect()
	if err != nil {
		return nil, err
	}
	if _, err := cl.ImageInspect(ctx, cfg.Image); errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("docker (%s) does not have the image of %s, %s (ID %s): ferry moves only the container's writable layer; load the same image here first",
			r.host(), cfg.Name, cfg.Config.Image, cfg.Image)
	} else if err != nil {
		return nil, err
	}
	if _, err := cl.ContainerInspect(ctx, cfg.Name); err == nil {
		return nil, fmt.Errorf("docker (%s) already has a container named %q: remove it or rename it before moving this one here", r.host(), cfg.Name)
	} else if !errdefs.IsNotFound(err) {
		return nil, err
	}
	if err := r.volumesHere(ctx, cl, c.Volumes); err != nil {
		return nil, err
	}
	// The image by ID: the name may point elsewhere here.
	conf := *cfg.Config
	conf.Image = cfg.Image
	hc := *cfg.HostConfig
	eps, err := r.attachHere(ctx, cl, c, &hc)
	if err != nil {
		return nil, err
	}
	stopped := r.hasStoppedRuntime()
	if !stopped && runtime.HostLocal(c.Networks) {
		return nil, fmt.Errorf("docker (%s): a container on a bridge network is restored with its connections closed, which needs the daemon's %s runtime (dockerd --add-runtime %s=PATH; see ferry check)", r.host(), StoppedRuntime, StoppedRuntime)
	}
	if stopped {
		hc.Runtime = StoppedRuntime
	} else if hc.Runtime == StoppedRuntime {
		hc.Runtime = "runc"
	}
	// Docker 20.10 creates a container on one network: the others join
	// before it starts.
	var nc *network.NetworkingConfig
	if ep, ok := eps[primaryNetwork(hc.NetworkMode)]; ok {
		nc = &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{primaryNetwork(hc.NetworkMode): ep}}
	}
	resp, err := cl.ContainerCreate(ctx, &conf, &hc, nc, nil, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("docker: create %s: %w", cfg.Name, err)
	}
	// Docker made the named volumes the configuration mounts: the
	// target's to remove if the migration does not commit.
	t := &target{r: r, id: resp.ID, name: cfg.Name, stopped: stopped, volumes: c.Volumes}
	for name, ep := range eps {
		if name == primaryNetwork(hc.NetworkMode) {
			continue
		}
		if err := cl.NetworkConnect(ctx, name, resp.ID, ep); err != nil {
			_ = t.Discard(ctx)
			return nil, fmt.Errorf("docker: connect %s to network %s: %w", cfg.Name, name, err)
		}
	}
	j, err := r.inspect(ctx, resp.ID)
	if err == nil && j.GraphDriver.Data["UpperDir"] == "" {
		err = fmt.Errorf("docker created %s without a writable layer", cfg.Name)
	}
	if err != nil {
		_ = t.Discard(ctx)
		return nil, err
	}
	t.upper = j.GraphDriver.Data["UpperDir"]
	t.mounts = j.Mounts
	info, err := cl.Info(ctx)
	if err != nil {
		_ = t.Discard(ctx)
		return nil, err
	}
	t.checkpoints = filepath.Join(info.DockerRootDir, "containers", resp.ID, "checkpoints")
	return t, nil
}

// admit applies this host's admission policy to the source's host
// configuration: what would reach into this host (privileges, host
// namespaces, volumes and bind mounts, devices, capabilities beyond the
// policy's) is refused unless the operator allowed it. A container on the
// host network shares the daemon's: with NetNS set, the namespace this
// host gives containers.
func (r *Runtime) admit(cfg *config) error {
	p := r.Admission
	if p.Privileged {
		return nil
	}
	h := cfg.HostConfig
	var why []string
	add := func(ok bool, format string, args ...any) {
		if !ok {
			why = append(why, fmt.Sprintf(format, args...))
		}
	}
	add(!h.Privileged, "is privileged (--privileged)")
	var outside []string
	for _, src := range hostPaths(h) {
		if !p.BindAllowed(src) {
			outside = append(outside, src)
		}
	}
	add(len(outside) == 0, "has bind mounts of host paths this host does not allow (%s): ferry remounts a host directory only from where the agent allows (--allow-bind) and copies none; move data in a named volume", strings.Join(outside, ", "))
	add(len(h.Devices) == 0, "has host devices (--device)")
	add(len(h.DeviceCgroupRules) == 0, "has device cgroup rules (--device-cgroup-rule %s)", strings.Join(h.DeviceCgroupRules, ", "))
	// The daemon lists the paths it masks and keeps read-only; none (a
	// daemon that says nothing of them aside) lifts that confinement.
	add(h.MaskedPaths == nil || slices.Contains(h.MaskedPaths, "/proc/kcore"), "does not mask /proc/kcore (MaskedPaths)")
	add(h.ReadonlyPaths == nil || slices.Contains(h.ReadonlyPaths, "/proc/sys"), "does not keep /proc/sys read-only (ReadonlyPaths)")
	for k := range h.Sysctls {
		add(admission.NamespacedSysctl(k), "sets host kernel sysctl %s (--sysctl)", k)
	}
	add(!h.PidMode.IsHost(), "shares the host's PID namespace")
	add(!h.IpcMode.IsHost(), "shares the host's IPC namespace")
	add(!h.UTSMode.IsHost(), "shares the host's UTS namespace")
	add(!h.UsernsMode.IsHost(), "runs in the host's user namespace")
	add(!h.NetworkMode.IsHost() || p.HostNetwork || r.NetNS != "", "shares the host's network (--network host; the agent allows it with --allow-host-network)")
	add(!h.NetworkMode.IsContainer(), "shares the network of another container (%s)", h.NetworkMode)
	for _, s := range h.SecurityOpt {
		add(!strings.Contains(s, "unconfined"), "relaxes its confinement (--security-opt %s)", s)
	}
	allowed := p.MaxCaps
	if len(allowed) == 0 {
		allowed = admission.DefaultCaps
	}
	for _, cp := range h.CapAdd {
		name := strings.ToUpper(cp)
		if !strings.HasPrefix(name, "CAP_") {
			name = "CAP_" + name
		}
		add(slices.Contains(allowed, name), "adds capability %s", name)
	}
	if len(why) > 0 {
		return &admission.Refused{Reasons: why}
	}
	return nil
}

// target is a container Docker created here, waiting for its restore.
type target struct {
	r           *Runtime
	id, name    string
	upper       string
	checkpoints string // the container's checkpoints directory
	// stopped: the container runs under StoppedRuntime here, whose
	// restore leaves the processes stopped.
	stopped bool
	pid     int // the restored init's, once restored
	// volumes are the ones Docker made for it here; mounts where it
	// mounts them.
	volumes []runtime.Volume
	mounts  []container.MountPoint
}

func (t *target) RootfsDir() string { return t.upper }

// VolumeDir is where Docker keeps the named volume it made for the
// container.
func (t *target) VolumeDir(name string) (string, error) {
	for _, mp := range t.mounts {
		if mp.Type == mount.TypeVolume && mp.Name == name && mp.Source != "" {
			return mp.Source, nil
		}
	}
	return "", fmt.Errorf("docker: the container created here mounts no volume %q", name)
}

var _ runtime.VolumeTarget = (*target)(nil)

// hostPaths are the host directories a container's configuration binds.
func hostPaths(h *container.HostConfig) []string {
	var out []string
	for _, b := range h.Binds {
		if src, _, _ := strings.Cut(b, ":"); strings.HasPrefix(src, "/") {
			out = append(out, src)
		}
	}
	for _, m := range h.Mounts {
		if m.Type == mount.TypeBind {
			out = append(out, m.Source)
		}
	}
	return out
}

// CRIUDirs: the shim has CRIU work in its own directory, and read the
// images through their bind mount (runtime.CRIUElsewhere).
func (t *target) CRIUDirs() []string {
	return []string{t.r.shimWorkDir(t.id), filepath.Join(t.checkpoints, checkpointName)}
}

var _ runtime.CRIUElsewhere = (*target)(nil)

// Restore bind-mounts the images directory as a checkpoint of the
// container and starts it from there; returns once Docker says running.
func (t *target) Restore(ctx context.Context, o runtime.RestoreOptions) (int, error) {
	if o.Lazy && !t.stopped {
		return 0, fmt.Errorf("docker: a lazy restore needs the daemon's %s runtime", StoppedRuntime)
	}
	cl, err := t.r.connect()
	if err != nil {
		return 0, err
	}
	logDir := t.r.shimWorkDir(t.id)
	if t.stopped {
		// StoppedRuntime hands CRIU this file, and a lazy restore its work
		// directory, where the lazy-pages daemon's socket is.
		conf := runc.CRIUConfig{LeaveStopped: true, TCPEstablished: o.TCPEstablished, TCPClose: o.TCPClose, LazyPages: o.Lazy}.WithYard(o.WorkDir)
		if o.Lazy {
			conf.WorkDir, logDir = o.WorkDir, o.WorkDir
		}
		if err := conf.Write(filepath.Join(o.ImagesDir, criuConf)); err != nil {
			return 0, err
		}
	}
	dir := filepath.Join(t.checkpoints, checkpointName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	if err := unix.Mount(o.ImagesDir, dir, "", unix.MS_BIND, ""); err != nil {
		return 0, fmt.Errorf("docker: bind %s as the container's checkpoint: %w", o.ImagesDir, err)
	}
	start := time.Now()
	err = cl.ContainerStart(ctx, t.id, container.StartOptions{CheckpointID: checkpointName})
	_ = unix.Unmount(dir, unix.MNT_DETACH)
	_ = os.Remove(dir)
	removeUnpacked(o.ImagesDir, start)
	if err != nil {
		// CRIU's own words, from its work directory (the shim's, for a
		// restore that is not lazy, is gone once the shim gave up on the
		// task: then only Docker's message is left).
		if e := criu.LogErrors(filepath.Join(logDir, "restore.log")); e != "" {
			err = fmt.Errorf("%w: %s", err, e)
		}
		return 0, fmt.Errorf("docker: restore %s: %w", t.name, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		j, err := t.r.inspect(ctx, t.id)
		if err != nil {
			return 0, err
		}
		if j.State.Running && j.State.Pid > 0 {
			t.pid = j.State.Pid
			return t.pid, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("docker: the restored container is %s, not running", j.State.Status)
		}
	}
}

// removeUnpacked deletes the copy of the images containerd 1.6 unpacked
// for the restore and never removes (ctrd-checkpoint* in its
// XDG_RUNTIME_DIR, else the temporary directory): the one made since
// start whose inventory is the images'.
func removeUnpacked(images string, since time.Time) {
	inv, err := os.ReadFile(filepath.Join(images, "inventory.img"))
	if err != nil {
		return
	}
	dirs := []string{os.TempDir()}
	for _, pid := range procs.Named("containerd") {
		if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
			for _, kv := range bytes.Split(env, []byte{0}) {
				if v, ok := bytes.CutPrefix(kv, []byte("XDG_RUNTIME_DIR=")); ok && len(v) > 0 {
					dirs = append(dirs, string(v))
				}
			}
		}
	}
	for _, d := range dirs {
		found, _ := filepath.Glob(filepath.Join(d, "ctrd-checkpoint*"))
		for _, f := range found {
			st, err := os.Stat(f)
			if err != nil || st.ModTime().Before(since.Add(-time.Second)) {
				continue
			}
			if b, err := os.ReadFile(filepath.Join(f, "inventory.img")); err == nil && bytes.Equal(b, inv) {
				_ = os.RemoveAll(f)
			}
		}
	}
}

// Start continues the processes CRIU left stopped (a no-op where the
// restored copy runs already).
func (t *target) Start(ctx context.Context) error {
	if !t.stopped {
		return nil
	}
	return t.r.runc().ContinueRestored(ctx, t.id, t.pid)
}

// Continue sends every process of a container restored here SIGCONT.
func (r *Runtime) Continue(ctx context.Context, c *runtime.Container) error {
	j, err := r.inspect(ctx, c.Name)
	if err != nil {
		return err
	}
	return r.runc().ContinueAll(ctx, j.ID)
}

// Discard removes the container Docker created here (running or not)
// and the volumes it made for it.
func (t *target) Discard(ctx context.Context) error {
	return t.r.Remove(ctx, &runtime.Container{ID: t.id, Name: t.name, Volumes: t.volumes})
}

// Package runc is runc as a ferry runtime (runtime.Runtime): containers
// under one runc root, moved with their bundles. The runc binary itself
// is package internal/runc's, which the other runtimes whose containers
// runc runs share.
package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/mounts"
	driver "github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Runtime is runc as a ferry runtime: containers under one runc root, at
// the source wherever their bundles are, at the destination in bundles
// under BundleRoot.
type Runtime struct {
	driver.Host
	// BundleRoot holds the bundles of containers restored here, one
	// directory per container, and runc's log for each (NAME.log).
	BundleRoot string
	// CgroupParent is the cgroup restored containers live under; two
	// emulated hosts on one machine must not share it.
	CgroupParent string
	// NetNS is the network namespace a restored container joins when its
	// source joined one that ferry does not rebuild ("": refuse those).
	NetNS string
	// Admission is what this host accepts of an incoming config.json,
	// which runc runs as it is.
	Admission admission.Policy
	// ImageRoots are the directories whose trees a container received
	// here may have as its image (an overlay root's lower layers).
	ImageRoots []string
	// Lazy says CRIU's lazy dump works here (fs.pipe-max-size, uffd);
	// DirtyTracking that CRIU's pre-dump does (soft-dirty).
	Lazy, DirtyTracking bool
}

var _ runtime.Runtime = (*Runtime)(nil)

// Kind is "runc".
func (r *Runtime) Kind() string { return "runc" }

// Caps: runc pauses without dumping and leaves a paused container paused
// through a dump, so the source is resumable until the commit.
func (r *Runtime) Caps() runtime.Caps {
	return runtime.Caps{Freeze: true, LazyDump: r.Lazy, LazyRestore: r.Lazy, PreDump: r.DirtyTracking, RestoreStopped: true, SmapsSnapshot: true}
}

// Inspect reads `runc state` and the bundle's config.json. The rootfs is
// where the spec's root.path points, relative to the bundle or absolute;
// where an overlay is mounted there, only its writable layer (layers.go).
func (r *Runtime) Inspect(ctx context.Context, name string) (*runtime.Container, error) {
	st, err := r.State(ctx, name)
	if errors.Is(err, driver.ErrNotFound) {
		return nil, fmt.Errorf("runc --root %s: no container %q: %w", r.Root, name, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	spec, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read the container's bundle: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(spec, &s); err != nil {
		return nil, fmt.Errorf("%s/config.json: %w", st.Bundle, err)
	}
	if s.Root == nil || s.Root.Path == "" {
		return nil, fmt.Errorf("%s/config.json names no root filesystem", st.Bundle)
	}
	root := s.Root.Path
	if !filepath.IsAbs(root) {
		root = filepath.Join(st.Bundle, root)
	}
	if s.Process != nil && s.Process.Terminal {
		return nil, fmt.Errorf("container %q has a terminal: CRIU can restore it only as a shell job, which ferry does not move", name)
	}
	c := &runtime.Container{Runtime: r.Kind(), Name: name, ID: name, PID: st.Pid, Status: st.Status, Rootfs: root, Spec: spec, Meta: map[string][]byte{}}
	upper, image, meta, err := overlayRoot(root)
	if err != nil {
		return nil, err
	}
	if upper != "" {
		c.Rootfs, c.Image, c.Meta[layersMeta] = upper, image, meta
	}
	// What its dump's descriptors.json will say, for a restore started
	// before the images (restoregate.go); a container that ended has none.
	if stdio, err := stdioOf(st.Pid); err == nil {
		c.Meta[stdioMeta] = stdio
	}
	return c, nil
}

// Freeze is runc pause: the cgroup freezer runc made for the container,
// here without runc's exec (runc reads the container's state from that
// freezer); runc's own where its record names none.
func (r *Runtime) Freeze(ctx context.Context, c *runtime.Container) error {
	if dir, err := r.FreezerDir(c.ID); err == nil && cgroups.Freeze(dir) == nil {
		return nil
	}
	return r.Pause(ctx, c.ID)
}

// Thaw is runc resume, as Freeze is runc pause.
func (r *Runtime) Thaw(ctx context.Context, c *runtime.Container) error {
	if dir, err := r.FreezerDir(c.ID); err == nil && cgroups.Thaw(dir) == nil {
		return nil
	}
	return r.Resume(ctx, c.ID)
}

// Remove deletes the container, and the bundle ferry made for it here if
// it has one (a container restored, or prepared for a restore); a deleted
// one counts as removed.
func (r *Runtime) Remove(ctx context.Context, c *runtime.Container) error {
	if r.BundleRoot != "" && c.Name != "" && filepath.Base(c.Name) == c.Name {
		t := r.target(c.Name)
		failLeftGate(t.criuConf(), t.gateClosed())
	}
	if err := r.Delete(ctx, c.ID); err != nil {
		return err
	}
	if r.BundleRoot != "" && c.Name != "" && filepath.Base(c.Name) == c.Name {
		bundle := filepath.Join(r.BundleRoot, c.Name)
		_ = os.Remove(bundle + ".log")
		return mounts.RemoveAll(bundle) // an overlay root is mounted there
	}
	return nil
}

// Checkpoint runs `runc checkpoint --leave-running`: the container, paused
// before, stays paused. A lazy dump returns once CRIU's page server listens
// and runs on until that page server is closed.
func (r *Runtime) Checkpoint(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions) (runtime.Dump, error) {
	return r.Dump(ctx, c.ID, o)
}

// Prepare makes the container's bundle here: an empty rootfs (for an
// overlay root, an empty writable layer over the image, which must be
// here) and the source's config.json adapted to this host.
func (r *Runtime) Prepare(ctx context.Context, c *runtime.Container, o runtime.PrepareOptions) (runtime.Target, error) {
	if c.Name == "" || filepath.Base(c.Name) != c.Name || c.Name == "." || c.Name == ".." {
		return nil, fmt.Errorf("bad container name %q", c.Name)
	}
	if err := r.Admission.CheckSpec(c.Spec); err != nil {
		return nil, err
	}
	if _, err := r.State(ctx, c.Name); err == nil {
		return nil, fmt.Errorf("runc --root %s already has a container named %q", r.Root, c.Name)
	} else if !errors.Is(err, driver.ErrNotFound) {
		return nil, err
	}
	t := r.target(c.Name)
	t.stdio = c.Meta[stdioMeta]
	if c.Meta[layersMeta] != nil {
		lower, err := imageHere(c, r.ImageRoots)
		if err != nil {
			return nil, err
		}
		t.lower = lower
	}
	spec, err := r.adaptSpec(c, o.NetNS, t.criuConf())
	if err != nil {
		return nil, err
	}
	if err := mounts.RemoveAll(t.bundle); err != nil {
		return nil, err
	}
	dirs := []string{t.RootfsDir()} // the root itself, for a plain root
	if t.lower != nil {
		dirs = append(dirs, t.root(), t.work())
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	// CRIU leaves the restored processes stopped until the commit (Start);
	// the file is emptied once the restore has read it, so that a later
	// dump of this container is not left stopped too.
	if err := driver.LeaveStopped(t.criuConf()); err != nil {
		_ = os.RemoveAll(t.bundle)
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(t.bundle, "config.json"), spec, 0o600); err != nil {
		_ = os.RemoveAll(t.bundle)
		return nil, err
	}
	return t, nil
}

// adaptSpec rewrites the source's config.json for this host: the rootfs
// in the bundle, this host's cgroup parent, the network namespace the
// container joins here.
func (r *Runtime) adaptSpec(c *runtime.Container, netns, criuConf string) ([]byte, error) {
	var s specs.Spec
	if err := json.Unmarshal(c.Spec, &s); err != nil {
		return nil, fmt.Errorf("source sent a bad config.json: %w", err)
	}
	if s.Root == nil {
		return nil, errors.New("source config.json has no root")
	}
	s.Root.Path = "rootfs"
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.CgroupsPath = "/" + r.CgroupParent + "/" + c.Name
	if netns == "" {
		netns = r.NetNS
	}
	if err := driver.JoinNetNS(&s, netns); err != nil {
		return nil, err
	}
	// ferry's own CRIU configuration file, instead of one the source named
	// (runc reads /etc/criu/runc.conf when none is named).
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[driver.CRIUConfigAnnotation] = criuConf
	return json.MarshalIndent(&s, "", "  ")
}

// target is a bundle waiting for its restore.
type target struct {
	r      *Runtime
	name   string
	bundle string
	// lower is the image an overlay root is mounted over, none for a
	// plain root; mounted, once it is.
	lower   []string
	mounted bool
	// stdio is the source's descriptors.json to be (stdioMeta).
	stdio []byte
	pid   int // the restored init, once restored
}

var _ runtime.EarlyTarget = (*target)(nil)

// target is the bundle of container name here.
func (r *Runtime) target(name string) *target {
	return &target{r: r, name: name, bundle: filepath.Join(r.BundleRoot, name)}
}

// root is the bundle's root filesystem: where the layer is applied for a
// plain root, the overlay's mount point otherwise.
func (t *target) root() string { return filepath.Join(t.bundle, "rootfs") }

// work is overlayfs's scratch directory (unused for a plain root).
func (t *target) work() string { return filepath.Join(t.bundle, "work") }

func (t *target) RootfsDir() string {
	if t.lower == nil {
		return t.root()
	}
	return filepath.Join(t.bundle, "upper")
}

// criuConf is the CRIU configuration file runc passes CRIU for this
// container (its org.criu.config annotation).
func (t *target) criuConf() string { return filepath.Join(t.bundle, "criu.conf") }

// Start continues the processes CRIU left stopped.
func (t *target) Start(ctx context.Context) error {
	return t.r.ContinueRestored(ctx, t.name, t.pid)
}

// Continue sends every process of the container SIGCONT: a container
// restored stopped runs (one that runs already is unaffected).
func (r *Runtime) Continue(ctx context.Context, c *runtime.Container) error {
	return r.ContinueAll(ctx, c.ID)
}

// Restore mounts an overlay root (only now: its layer is complete, and
// overlayfs does not allow writing to a mounted upper directory) and runs
// runc restore.
func (t *target) Restore(ctx context.Context, o runtime.RestoreOptions) (int, error) {
	if err := t.mountRoot(); err != nil {
		return 0, err
	}
	if err := t.restoreConfig(o).Write(t.criuConf()); err != nil {
		return 0, err
	}
	err := t.runRestore(ctx, o)
	// Read by now: later dumps of this container must not leave it stopped.
	_ = driver.ClearCRIUConfig(t.criuConf())
	if err != nil {
		return 0, err
	}
	return t.restored()
}

// mountRoot mounts an overlay root over its image, once.
func (t *target) mountRoot() error {
	if t.lower == nil || t.mounted {
		return nil
	}
	if err := (mounts.Overlay{Lower: t.lower, Upper: t.RootfsDir(), Work: t.work()}).Mount(t.root()); err != nil {
		return err
	}
	t.mounted = true
	return nil
}

// restoreConfig is the file Prepare wrote, now with a cgroup yard in the
// work directory.
func (t *target) restoreConfig(o runtime.RestoreOptions) driver.CRIUConfig {
	return (driver.CRIUConfig{LeaveStopped: true}).WithYard(o.WorkDir)
}

// pidFile is where runc writes the restored init's PID.
func (t *target) pidFile() string { return t.bundle + ".pid" }

func (t *target) runRestore(ctx context.Context, o runtime.RestoreOptions) error {
	return t.r.Host.Restore(ctx, t.name, driver.RestoreOptions{ImagePath: o.ImagesDir, WorkPath: o.WorkDir, Bundle: t.bundle,
		LogPath: t.bundle + ".log", TCPEstablished: o.TCPEstablished, LazyPages: o.Lazy, PidFile: t.pidFile()})
}

// restored reads the init's PID runc wrote once CRIU had restored it
// (asking runc's state instead costs an exec inside the downtime).
func (t *target) restored() (int, error) {
	pid, err := restoredPid(t.pidFile())
	if err != nil {
		return 0, fmt.Errorf("restored container is not running: %w", err)
	}
	t.pid = pid
	return pid, nil
}

// restoredPid reads a pid file runc wrote and checks that the process is
// there.
func restoredPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	_ = os.Remove(path)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("runc's pid file %s holds %q", path, b)
	}
	if err := unix.Kill(pid, 0); err != nil {
		return 0, fmt.Errorf("restored init %d: %w", pid, err)
	}
	return pid, nil
}

// Discard deletes the container and its bundle. Its error says the
// container may still exist; leftover files are not worth that.
func (t *target) Discard(ctx context.Context) error {
	failLeftGate(t.criuConf(), t.gateClosed())
	if err := t.r.Delete(ctx, t.name); err != nil {
		return err
	}
	// A restore whose CRIU was killed leaves restored processes in the
	// container's cgroups, which runc no longer knows.
	if err := cgroups.Destroy(cgroups.Root, "/"+t.r.CgroupParent+"/"+t.name); err != nil {
		return err
	}
	_ = os.Remove(t.bundle + ".log")
	_ = mounts.RemoveAll(t.bundle)
	return nil
}

// List is `runc list` under the root.
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	sts, err := r.Host.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Container, 0, len(sts))
	for _, s := range sts {
		out = append(out, runtime.Container{Runtime: r.Kind(), Name: s.ID, ID: s.ID, PID: s.Pid, Status: s.Status})
	}
	return out, nil
}

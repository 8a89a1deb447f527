package podman

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/tail"
	"github.com/google/renameio/v2"
)

// Meta keys of a Podman container's records.
const (
	MetaConfig = "config.dump" // libpod's container configuration
	MetaSpec   = "spec.dump"   // the OCI spec (the bundle's config.json)
)

// devShmTar is where Podman keeps the contents of a container's /dev/shm
// in a checkpoint (its own name for it).
const devShmTar = "devshm-checkpoint.tar"

// Runtime is one host's Podman instance (rootful Podman 4.3.1 with runc)
// as a ferry runtime: the engine moves a Podman container, and afterwards
// the destination's Podman owns it under the same name (podman ps, logs,
// stop, rm work there) and the source's no longer lists it.
//
// Source. A Podman container is a runc container. Freeze is `podman pause`
// (so Podman, too, says paused), the dump is ferry's usual `runc --root
// RuncRoot checkpoint --leave-running --page-server ADDR:PORT --file-locks
// --manage-cgroups-mode soft`, run in Host.NetNS (CRIU must share the
// namespace of a host-network container): the memory streams to ferry's
// page server, the other images go to CheckpointOptions.ImagesDir, and the
// container stays paused, resumable by Thaw (`podman unpause`) until the
// commit; Remove is `podman rm --force`. Podman's own `container
// checkpoint` was not used: it refuses a paused container, has no
// page-server flag (a CRIU configuration file can add one, through a
// `criu` wrapper in PATH), and a dump held open by a post-dump action
// script (which does work: exit 1 resumes the tasks, exit 0 kills them)
// holds Podman's container lock, so `podman inspect` of the container at
// the source hangs until the commit.
//
// Podman's records of the container travel in Container.Meta: libpod's
// configuration (config.dump) and the OCI spec (spec.dump). Podman writes
// them only when it exports a checkpoint, before any check: Inspect runs
// `podman container checkpoint --export X` with a `criu` in PATH that
// always fails, so Podman stops at its CRIU version check, nothing frozen
// or dumped, and leaves the two files in the bundle; Inspect reads and
// deletes them (once per container ID).
//
// Destination. Prepare checks the records against this host's admission
// policy (see admit), then has Podman create the container from them:
// `podman container restore --import ARCHIVE --name NAME`, ARCHIVE (tens of
// KB, in PrepareOptions.WorkDir) holding config.dump (minus the paths into
// the source container's own directories), spec.dump, a checkpoint
// directory with an empty inventory.img, and a rootfs-diff.tar that is no
// tar. Podman creates the container (new ID, same name), mounts it,
// writes its config.json for this host (rootfs, bind mounts, cgroup), then
// fails on the placeholder, unmounts it and leaves it created. Its overlay
// upper dir, not mounted, is RootfsDir. Restore makes the container's
// checkpoint directory a symbolic link to RestoreOptions.ImagesDir and runs
// `podman container restore --file-locks [--tcp-established] ID`: CRIU
// reads the pages where ferry's page server wrote them, never copied.
//
// The new ID: two Podman instances on one machine share runc's root
// (/run/runc) and cgroup tree (/libpod_parent/libpod-ID), where the paused
// source holds its ID until the commit; with a new ID nothing collides and
// each instance keeps its default runc root (a --runtime-flag root=... per
// instance would be lost by Podman's exit cleanup command, which does not
// carry runtime flags).
//
// Named volumes move with the container, and a container on a bridge
// network (Podman's default one, users' own) is attached to the
// destination's network of that name, with an address of its own there
// (attach.go). Not moved: overlay and image volumes, pods, containers
// sharing another's namespaces, logs written before the move (they stay
// with the source, as with Podman's own checkpoint export).
type Runtime struct {
	Host Host
	// RuncRoot is the runc root Podman's runc keeps its containers in:
	// runc's default, /run/runc, unless Podman runs with
	// --runtime-flag root=DIR. Empty means /run/runc.
	RuncRoot string
	// LazyDump says CRIU's lazy dump works on this host (ferry check):
	// the source side of pre-copy's rebuild switchover, whose
	// destination restores a plain dump.
	Lazy bool
	// Admission is what this host accepts of an incoming container's
	// records, which Podman here runs as root (see Prepare).
	Admission admission.Policy

	mu       sync.Mutex
	recs     map[string]records // by container ID
	ociName  string             // this host's default OCI runtime
	runcOnce sync.Once
	runcBin  string // runc, or a script running it in Host.NetNS
	runcErr  error
}

type records struct{ config, spec []byte }

var _ runtime.Runtime = (*Runtime)(nil)

// New returns the adapter for a host's Podman instance.
func New(h Host) *Runtime { return &Runtime{Host: h} }

// Kind is "podman".
func (r *Runtime) Kind() string { return "podman" }

// Caps: Podman pauses a container without dumping it (cgroup freezer) and
// a paused container stays paused through ferry's runc dump, which can be
// lazy where CRIU's lazy pages work (post-copy, hybrid, pre-copy's
// rebuild switchover). Podman's restore has no lazy option, but the CRIU
// configuration file the restored config.json names does, and it leaves
// the processes stopped until Start. CRIU's pre-dump: not offered (needs
// soft-dirty tracking, absent on the machines this was built on, so never
// tried).
func (r *Runtime) Caps() runtime.Caps {
	return runtime.Caps{Freeze: true, LazyDump: r.Lazy, LazyRestore: r.Lazy, RestoreStopped: true, SmapsSnapshot: true}
}

// inspectData is the part of `podman container inspect` the adapter uses.
type inspectData struct {
	attachments
	ID    string `json:"Id"`
	Name  string `json:"Name"`
	State struct {
		Status string `json:"Status"`
		Pid    int    `json:"Pid"`
	} `json:"State"`
	Image       string `json:"Image"`
	ImageName   string `json:"ImageName"`
	OCIRuntime  string `json:"OCIRuntime"`
	StaticDir   string `json:"StaticDir"`
	GraphDriver struct {
		Name string `json:"Name"`
		Data struct {
			UpperDir string `json:"UpperDir"`
		} `json:"Data"`
	} `json:"GraphDriver"`
}

// inspect reads one container's description; ErrNotFound when Podman does
// not know it.
func (r *Runtime) inspect(ctx context.Context, name string) (*inspectData, error) {
	out, err := r.Host.podman(ctx, "container", "inspect", "--format", "json", name)
	if err != nil {
		if strings.Contains(err.Error(), "no such container") {
			return nil, fmt.Errorf("podman (%s): no container %q: %w", r.Host.Dir, name, runtime.ErrNotFound)
		}
		return nil, err
	}
	var all []inspectData
	if err := json.Unmarshal([]byte(out), &all); err != nil {
		return nil, fmt.Errorf("podman container inspect %s: %w", name, err)
	}
	if len(all) != 1 {
		return nil, fmt.Errorf("podman container inspect %s: %d answers", name, len(all))
	}
	return &all[0], nil
}

// status maps Podman's states on the engine's running, paused, stopped.
func status(podman string) string {
	switch podman {
	case "running", "paused":
		return podman
	}
	return "stopped" // created, configured, exited, stopped, stopping, removing
}

// Inspect describes a container. For a running or paused one it also
// carries Podman's records (Meta), read once per container.
func (r *Runtime) Inspect(ctx context.Context, name string) (*runtime.Container, error) {
	d, err := r.inspect(ctx, name)
	if err != nil {
		return nil, err
	}
	c := &runtime.Container{Runtime: r.Kind(), Name: d.Name, ID: d.ID, PID: d.State.Pid,
		Status: status(d.State.Status), Rootfs: d.GraphDriver.Data.UpperDir, Image: d.Image}
	if c.Status == "stopped" {
		c.PID = 0
	}
	if d.GraphDriver.Name != "overlay" {
		return nil, fmt.Errorf("podman container %q uses the %q storage driver: ferry moves the writable layer of overlay only", name, d.GraphDriver.Name)
	}
	if c.Status == "stopped" {
		return c, nil
	}
	rec, err := r.exportRecords(ctx, d)
	if err != nil {
		return nil, err
	}
	c.Spec = rec.spec
	c.Meta = map[string][]byte{MetaConfig: rec.config, MetaSpec: rec.spec}
	c.Shared = sharedOf(d)
	if c.Volumes, err = r.volumesOf(ctx, d); err != nil {
		return nil, err
	}
	if c.Networks, err = r.networksOf(ctx, d); err != nil {
		return nil, err
	}
	return c, nil
}

// exportRecords has Podman write config.dump and spec.dump into the bundle (see
// the package comment on how) and reads them.
func (r *Runtime) exportRecords(ctx context.Context, d *inspectData) (records, error) {
	r.mu.Lock()
	rec, ok := r.recs[d.ID]
	r.mu.Unlock()
	if ok {
		return rec, nil
	}
	scratch := r.Host.path("ferry")
	stub := filepath.Join(scratch, "no-criu", "criu")
	if err := writeScript(stub, "echo 'ferry: exporting the configuration only, no checkpoint' >&2\nexit 1\n"); err != nil {
		return rec, err
	}
	tmp, err := os.MkdirTemp(scratch, "export-")
	if err != nil {
		return rec, err
	}
	defer os.RemoveAll(tmp)
	cmd := r.Host.Command(ctx, "container", "checkpoint", "--export", filepath.Join(tmp, "never-written.tar"), d.ID)
	cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(stub)+":"+os.Getenv("PATH"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmdErr := cmd.Run()
	cfgPath, specPath := filepath.Join(d.StaticDir, "config.dump"), filepath.Join(d.StaticDir, "spec.dump")
	defer os.Remove(cfgPath)
	defer os.Remove(specPath)
	if cmdErr == nil {
		// Cannot happen with a criu that always fails; never ignore it.
		return rec, fmt.Errorf("podman checkpointed %s although no CRIU was available to it", d.Name)
	}
	if rec.config, err = os.ReadFile(cfgPath); err == nil {
		rec.spec, err = os.ReadFile(specPath)
	}
	if err != nil {
		return rec, fmt.Errorf("podman did not export the configuration of %s: %v: %s", d.Name, err, tail.Lines(stderr.String(), 4))
	}
	if !json.Valid(rec.config) || !json.Valid(rec.spec) {
		return rec, fmt.Errorf("podman exported a malformed configuration for %s", d.Name)
	}
	r.mu.Lock()
	if r.recs == nil {
		r.recs = map[string]records{}
	}
	r.recs[d.ID] = rec
	r.mu.Unlock()
	return rec, nil
}

func writeScript(path, body string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	want := "#!/bin/sh\n" + body
	if b, err := os.ReadFile(path); err == nil && string(b) == want {
		return nil
	}
	return renameio.WriteFile(path, []byte(want), 0o700)
}

// Freeze is `podman pause`: Podman knows the container is paused.
func (r *Runtime) Freeze(ctx context.Context, c *runtime.Container) error {
	_, err := r.Host.podman(ctx, "pause", c.ID)
	return err
}

// Thaw is `podman unpause`. A CRIU killed mid-dump leaves the cgroup
// thawed (CRIU thaws a frozen container to seize its tasks and freezes it
// again when done), so the container runs while Podman still records it
// paused and refuses to unpause it ("container not paused"): then Thaw
// freezes it through runc and unpauses it through Podman, whose record
// follows.
func (r *Runtime) Thaw(ctx context.Context, c *runtime.Container) error {
	_, err := r.Host.podman(ctx, "unpause", c.ID)
	if err == nil || !strings.Contains(err.Error(), "not paused") {
		return err
	}
	rc, rerr := r.runc()
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	// runc knows the container by Podman's ID only (a recovering agent
	// has the name from its journal).
	d, ierr := r.inspect(ctx, c.ID)
	if ierr != nil {
		return errors.Join(err, ierr)
	}
	if perr := rc.Pause(ctx, d.ID); perr != nil {
		return errors.Join(err, fmt.Errorf("freezing it again to bring Podman's record in line: %w", perr))
	}
	_, err = r.Host.podman(ctx, "unpause", c.ID)
	return err
}

// Remove is `podman rm --force` (a paused container too), then `podman
// volume rm` of the volumes that moved with it (c.Volumes); a container
// or volume already gone counts as removed.
//
// A paused container's processes are killed first, while frozen: Podman's
// rm thaws a paused container before it kills it, and the source's copy
// ran again for an instant beside the destination's (a client heard its
// counter go back, 1 run in 3 of bench migrate's pre-copy).
func (r *Runtime) Remove(ctx context.Context, c *runtime.Container) error {
	if rc, err := r.runc(); err == nil && c.PID > 0 {
		if st, err := rc.State(ctx, c.ID); err == nil && st.Status == "paused" && st.Pid == c.PID {
			// Not runc kill --all, which thaws the cgroup after it
			// signalled: killed while frozen, they die as Podman thaws
			// them, before any of their code runs.
			for _, pid := range append([]int{c.PID}, procs.Descendants(c.PID, "")...) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if err := r.forceRemove(ctx, c.ID); err != nil {
		return err
	}
	return r.removeVolumes(ctx, c.Volumes)
}

// runc returns runc for Podman's containers: runc itself, or a script
// running it in the host's network namespace, where the containers on
// the host network live (CRIU must see their namespace as its own).
func (r *Runtime) runc() (runc.Host, error) {
	r.runcOnce.Do(func() {
		r.runcBin = "runc"
		if r.Host.NetNS != "" {
			r.runcBin = r.Host.path("ferry", "runc-in-netns")
			r.runcErr = writeScript(r.runcBin, "exec nsenter --net="+shellQuote(r.Host.netnsPath())+" -- runc \"$@\"\n")
		}
	})
	root := r.RuncRoot
	if root == "" {
		root = "/run/runc"
	}
	return runc.Host{Root: root, Binary: r.runcBin}, r.runcErr
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Checkpoint dumps the paused container with `runc checkpoint
// --leave-running`, the pages going to o.PageServer, the other images to
// o.ImagesDir; it stays paused. The contents of its /dev/shm (a tmpfs
// outside the writable layer, which CRIU does not dump) go to o.ImagesDir
// as Podman's own checkpoints carry them.
func (r *Runtime) Checkpoint(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions) (runtime.Dump, error) {
	if err := o.Refuse(r.Kind(), r.Caps()); err != nil {
		return nil, err
	}
	cfg, err := parseConfig(c.Meta[MetaConfig])
	if err != nil {
		return nil, err
	}
	if cfg.Runtime != "runc" {
		return nil, fmt.Errorf("podman container %q runs under OCI runtime %q: ferry checkpoints Podman containers only under runc", c.Name, cfg.Runtime)
	}
	rc, err := r.runc()
	if err != nil {
		return nil, err
	}
	if len(c.Networks) > 0 {
		// On a Podman network the container has a namespace of its own:
		// CRIU, and a lazy dump's page server, run where the engine
		// puts them (runtime.CheckpointOptions.PageNet), not in the host's.
		rc.Binary = ""
	}
	if err := rc.RequirePaused(ctx, c.ID, fmt.Sprintf("podman container %q", c.Name), " (Podman run with --runtime-flag root=...? set RuncRoot)"); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.ImagesDir, 0o700); err != nil {
		return nil, err
	}
	if err := tarShm(cfg.ShmDir, filepath.Join(o.ImagesDir, devShmTar)); err != nil {
		return nil, fmt.Errorf("save /dev/shm of %s: %w", c.Name, err)
	}
	// runc's own dump: the container, paused, stays paused; a lazy one
	// leaves the memory to CRIU's page server.
	return rc.Dump(ctx, c.ID, o)
}

// podmanConfig is the part of libpod's container configuration
// (config.dump) the adapter reads.
type podmanConfig struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	Pod           string            `json:"pod"`
	Dependencies  []string          `json:"Dependencies"`
	ImageID       string            `json:"rootfsImageID"`
	ImageName     string            `json:"rootfsImageName"`
	Rootfs        string            `json:"rootfs"`
	Runtime       string            `json:"runtime"`
	ShmDir        string            `json:"ShmDir"`
	NamedVolumes  []json.RawMessage `json:"namedVolumes"`
	OverlayVols   []json.RawMessage `json:"overlayVolumes"`
	ImageVolumes  []json.RawMessage `json:"ctrImageVolumes"`
	IPCNsCtr      string            `json:"ipcNsCtr"`
	MountNsCtr    string            `json:"mountNsCtr"`
	NetNsCtr      string            `json:"netNsCtr"`
	PIDNsCtr      string            `json:"pidNsCtr"`
	UserNsCtr     string            `json:"userNsCtr"`
	UTSNsCtr      string            `json:"utsNsCtr"`
	CgroupNsCtr   string            `json:"cgroupNsCtr"`
	CreateNetNS   bool              `json:"createNetNS"`
	StaticDir     string            `json:"staticDir"`
	ConmonPidFile string            `json:"conmonPidFile"`
	PidFile       string            `json:"pid_file"`
	Secrets       []struct {
		Name string `json:"name"`
	} `json:"secrets"`
	// ExitCommand is what conmon runs, as root on this host, when the
	// container exits, where a Podman keeps the one it made at create
	// (4.3 keeps none: it makes one at each start).
	ExitCommand []string `json:"exitCommand"`
}

func parseConfig(b []byte) (*podmanConfig, error) {
	if len(b) == 0 {
		return nil, errors.New("podman: the container's description carries no Podman configuration (inspect it with the podman adapter while it runs)")
	}
	var c podmanConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("podman: bad container configuration: %w", err)
	}
	if c.ID == "" || c.Name == "" {
		return nil, errors.New("podman: the container configuration names no container")
	}
	return &c, nil
}

// movable refuses what the adapter cannot move: what lives outside the
// container's writable layer and memory, or depends on other containers.
func (c *podmanConfig) movable() error {
	var ns []string
	for _, n := range []struct{ kind, ctr string }{{"ipc", c.IPCNsCtr}, {"mount", c.MountNsCtr}, {"network", c.NetNsCtr},
		{"pid", c.PIDNsCtr}, {"user", c.UserNsCtr}, {"uts", c.UTSNsCtr}, {"cgroup", c.CgroupNsCtr}} {
		if n.ctr != "" {
			ns = append(ns, n.kind)
		}
	}
	switch {
	case c.Pod != "":
		return fmt.Errorf("podman container %q is in a pod: pods are not moved", c.Name)
	case len(c.Dependencies) > 0 || len(ns) > 0:
		return fmt.Errorf("podman container %q depends on other containers (shares their %s namespaces): not moved", c.Name, strings.Join(ns, ", "))
	case c.Rootfs != "":
		return fmt.Errorf("podman container %q runs on a root directory (--rootfs), not an image: not moved", c.Name)
	case c.ImageID == "":
		return fmt.Errorf("podman container %q has no image", c.Name)
	case len(c.OverlayVols)+len(c.ImageVolumes) > 0:
		return fmt.Errorf("podman container %q has overlay or image volumes: their contents are not moved (named volumes are)", c.Name)
	}
	return nil
}

// tarShm writes the contents of a container's /dev/shm (regular files,
// directories, symbolic links) as Podman's devshm-checkpoint.tar, when
// there are any; an empty or absent /dev/shm writes nothing.
func tarShm(dir, dst string) error {
	_ = os.Remove(dst)
	if dir == "" {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case info.Mode().IsRegular(), info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: cannot carry a %v", p, info.Mode().Type())
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name = filepath.ToSlash(rel)
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		_, err = io.Copy(tw, in)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
	}
	return err
}

// List is `podman ps --all`.
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	out, err := r.Host.podman(ctx, "ps", "--all", "--format", "json")
	if err != nil {
		return nil, err
	}
	var ps []struct {
		ID    string   `json:"Id"`
		Names []string `json:"Names"`
		State string   `json:"State"`
		Pid   int      `json:"Pid"`
	}
	if b := strings.TrimSpace(out); b != "" && b != "null" {
		if err := json.Unmarshal([]byte(b), &ps); err != nil {
			return nil, fmt.Errorf("podman ps: %w", err)
		}
	}
	cs := make([]runtime.Container, 0, len(ps))
	for _, p := range ps {
		c := runtime.Container{Runtime: r.Kind(), Name: p.ID, ID: p.ID, Status: status(p.State)}
		if len(p.Names) > 0 {
			c.Name = p.Names[0]
		}
		if c.Status != "stopped" {
			c.PID = p.Pid
		}
		cs = append(cs, c)
	}
	return cs, nil
}

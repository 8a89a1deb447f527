package podman

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// placeholderDiff stands in for rootfs-diff.tar in the archive Prepare
// imports: not a tar, so Podman stops there, after it created the
// container and wrote its config.json, before it starts anything.
var placeholderDiff = bytes.Repeat([]byte("ferry: placeholder, not a tar archive; the writable layer is synced into the container's upper dir\n"), 12)

// failedOnPlaceholder is how Podman reports the placeholder.
const failedOnPlaceholder = "failed to apply root file-system diff file"

// Prepare has this host's Podman create the container from the source's
// records, under the same name and a new ID, created but not started (see
// the package comment). It refuses first, with nothing created, what
// cannot work here: another runtime's container, a container the adapter
// cannot move, what this host's admission policy refuses (admit), an OCI
// runtime other than runc, a missing image, a taken name.
func (r *Runtime) Prepare(ctx context.Context, c *runtime.Container, o runtime.PrepareOptions) (runtime.Target, error) {
	if c.Runtime != r.Kind() {
		return nil, fmt.Errorf("podman cannot receive a %s container", c.Runtime)
	}
	if o.NetNS != "" {
		return nil, errors.New("podman: the container had a network namespace of its own that ferry rebuilt; Podman sets up its containers' networks itself: not supported")
	}
	cfg, err := parseConfig(c.Meta[MetaConfig])
	if err != nil {
		return nil, err
	}
	if err := cfg.movable(); err != nil {
		return nil, err
	}
	spec := c.Meta[MetaSpec]
	if !json.Valid(spec) {
		return nil, errors.New("podman: the container's description carries no valid OCI spec (spec.dump)")
	}
	if c.Image != "" && c.Image != cfg.ImageID {
		return nil, fmt.Errorf("podman: the container's image %s differs from its configuration's %s", c.Image, cfg.ImageID)
	}
	config, err := adaptConfig(c.Meta[MetaConfig])
	if err != nil {
		return nil, err
	}
	spec, volDirs, err := r.placeVolumes(ctx, spec, c.Volumes)
	if err != nil {
		return nil, err
	}
	if err := r.admit(cfg.ID, config, spec, volDirs); err != nil {
		return nil, err
	}
	if err := r.requireRunc(ctx); err != nil {
		return nil, err
	}
	if err := r.requireImage(ctx, cfg); err != nil {
		return nil, err
	}
	if taken, err := r.exists(ctx, cfg.Name); err != nil {
		return nil, err
	} else if taken {
		return nil, fmt.Errorf("podman (%s) already has a container named %q: remove it or rename it before moving this one here", r.Host.Dir, cfg.Name)
	}
	if err := r.attachHere(ctx, c); err != nil {
		return nil, err
	}
	workDir := o.WorkDir
	if workDir == "" {
		workDir = r.Host.path("ferry")
	}
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(workDir, "podman-create-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	t := &target{r: r, name: cfg.Name, volumes: c.Volumes}
	archive := filepath.Join(dir, "create.tar")
	if err := writeCreateArchive(archive, config, spec, c.Volumes); err != nil {
		return nil, err
	}
	_, ierr := r.Host.podman(ctx, "container", "restore", "--import", archive, "--name", cfg.Name)
	if ierr == nil || !strings.Contains(ierr.Error(), failedOnPlaceholder) {
		if ierr == nil {
			ierr = errors.New("podman started a container from a placeholder checkpoint")
		}
		// Whatever Podman made under the name is ours: it was free (unless
		// someone took it in between).
		if !strings.Contains(ierr.Error(), "already in use") {
			_ = t.Discard(ctx)
		}
		return nil, fmt.Errorf("podman could not create %s from the source's configuration: %w", cfg.Name, ierr)
	}
	d, err := r.inspect(ctx, cfg.Name)
	if err == nil && (d.StaticDir == "" || d.GraphDriver.Data.UpperDir == "") {
		err = fmt.Errorf("podman created %s without a bundle or writable layer", cfg.Name)
	}
	if err == nil && d.State.Status != "created" && d.State.Status != "configured" {
		err = fmt.Errorf("podman created %s in state %s", cfg.Name, d.State.Status)
	}
	if err != nil {
		_ = t.Discard(ctx)
		return nil, err
	}
	t.id, t.bundle, t.upper = d.ID, d.StaticDir, d.GraphDriver.Data.UpperDir
	// The placeholders have done their work; the checkpoint directory
	// becomes a link to the images at the restore.
	for _, f := range []string{"rootfs-diff.tar", "checkpoint", "restore.log"} {
		if err := os.RemoveAll(filepath.Join(t.bundle, f)); err != nil {
			_ = t.Discard(ctx)
			return nil, err
		}
	}
	// Podman's restore reads the bundle's config.json and keeps its
	// annotations, so runc hands CRIU the file Restore writes (the
	// processes stay stopped until the commit, Start).
	if err := runc.AnnotateCRIUConfig(filepath.Join(t.bundle, "config.json"), t.criuConf()); err != nil {
		_ = t.Discard(ctx)
		return nil, err
	}
	return t, nil
}

// admit applies this host's admission policy to the source's records
// before Podman creates anything from them. spec.dump becomes the
// container's config.json here, run by runc as root: it is checked as
// runc's is, Podman's own bind mounts aside (admission.CheckPodmanSpec).
// Of libpod's configuration (config, as adaptConfig left it), what Podman
// would do outside the container: write PID files at host paths the
// source chose (--pidfile, --conmon-pidfile; the source's own were
// cleared), copy this host's Podman secrets of the names it lists into
// the container, and join a network namespace by path as the spec names
// it (see below).
//
// A container on Podman's host network shares the namespace Podman runs
// in. With Host.NetNS set (the agent passes its --netns), that is the
// namespace this host gives containers, where a runc container that
// joined one goes too, so it is admitted as such; without, it is this
// machine's own network, which needs --allow-host-network.
func (r *Runtime) admit(id string, config, spec []byte, volumes []string) error {
	p := r.Admission
	if r.Host.NetNS != "" {
		p.HostNetwork = true
	}
	var why []string
	err := p.CheckPodmanSpec(spec, id, volumes...)
	var refusal *admission.Refused
	if errors.As(err, &refusal) {
		why = append(why, refusal.Reasons...)
	} else if err != nil {
		return fmt.Errorf("podman: %w", err)
	}
	if !p.Privileged {
		cfg, err := parseConfig(config)
		if err != nil {
			return err
		}
		if cfg.PidFile != "" {
			why = append(why, fmt.Sprintf("writes its PID to host file %s (--pidfile)", cfg.PidFile))
		}
		if cfg.ConmonPidFile != "" {
			why = append(why, fmt.Sprintf("writes conmon's PID to host file %s (--conmon-pidfile)", cfg.ConmonPidFile))
		}
		for _, s := range cfg.Secrets {
			why = append(why, fmt.Sprintf("would get this host's Podman secret %q", s.Name))
		}
		if r := admission.CheckPodmanExitCommand(cfg.ExitCommand, podmanPath()); r != "" {
			why = append(why, r)
		}
		// Podman puts a network namespace of its own in place of the
		// spec's only when it makes one (createNetNS); otherwise a path
		// there (--network ns:PATH) is joined as it is.
		var sp struct {
			Linux *struct {
				Namespaces []struct{ Type, Path string } `json:"namespaces"`
			} `json:"linux"`
		}
		if err := json.Unmarshal(spec, &sp); err != nil {
			return fmt.Errorf("podman: bad spec.dump: %w", err)
		}
		for i := 0; sp.Linux != nil && i < len(sp.Linux.Namespaces); i++ {
			if ns := sp.Linux.Namespaces[i]; ns.Type == "network" && ns.Path != "" && !cfg.CreateNetNS {
				why = append(why, fmt.Sprintf("joins the network namespace at %s (--network ns:PATH)", ns.Path))
			}
		}
	}
	if len(why) > 0 {
		return &admission.Refused{Reasons: why}
	}
	return nil
}

// requireRunc checks that Podman here uses runc: an imported container
// gets the host's default OCI runtime, and only runc's checkpoints work
// (Debian 12's crun has no CRIU).
func (r *Runtime) requireRunc(ctx context.Context) error {
	r.mu.Lock()
	name := r.ociName
	r.mu.Unlock()
	if name == "" {
		out, err := r.Host.podman(ctx, "info", "--format", "{{.Host.OCIRuntime.Name}}")
		if err != nil {
			return err
		}
		name = strings.TrimSpace(out)
		r.mu.Lock()
		r.ociName = name
		r.mu.Unlock()
	}
	if name != "runc" {
		return fmt.Errorf("podman (%s) runs containers with %q: ferry restores Podman containers only under runc (containers.conf [engine] runtime)", r.Host.Dir, name)
	}
	return nil
}

// requireImage checks that the container's image is here, by ID: only the
// writable layer moves.
func (r *Runtime) requireImage(ctx context.Context, cfg *podmanConfig) error {
	out, err := r.Host.podman(ctx, "image", "inspect", "--format", "{{.Id}}", cfg.ImageID)
	if err != nil {
		if strings.Contains(err.Error(), "image not known") {
			return fmt.Errorf("podman (%s) does not have the image of %s, %s (ID %s): ferry moves only the container's writable layer; load the same image here first",
				r.Host.Dir, cfg.Name, cfg.ImageName, cfg.ImageID)
		}
		return err
	}
	if got := strings.TrimSpace(out); got != cfg.ImageID {
		return fmt.Errorf("podman (%s) found image %s for %s, not %s", r.Host.Dir, got, cfg.ImageName, cfg.ImageID)
	}
	return nil
}

// exists reports whether a container of that name or ID exists here.
func (r *Runtime) exists(ctx context.Context, name string) (bool, error) {
	cmd := r.Host.Command(ctx, "container", "exists", name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return false, nil
	}
	return false, fmt.Errorf("podman container exists %s: %v: %s", name, err, tail.Lines(stderr.String(), 4))
}

// adaptConfig readies the source's libpod configuration for this host:
// paths inside the source container's own directories (its conmon and
// container PID files, its /dev/shm mount) would name the source's files
// here. Podman regenerates what is left empty. Everything else is kept as
// the source had it.
func adaptConfig(b []byte) ([]byte, error) {
	cfg, err := parseConfig(b)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	own := "/overlay-containers/" + cfg.ID + "/"
	for k, v := range m {
		var s string
		if json.Unmarshal(v, &s) == nil {
			if strings.Contains(s, own) {
				m[k] = json.RawMessage(`""`)
			}
			continue
		}
		var list []string
		if json.Unmarshal(v, &list) != nil || list == nil {
			continue
		}
		kept := []string{}
		for _, e := range list {
			if !strings.Contains(e, own) {
				kept = append(kept, e)
			}
		}
		if len(kept) != len(list) && k != "CreateCommand" {
			nv, err := json.Marshal(kept)
			if err != nil {
				return nil, err
			}
			m[k] = nv
		}
	}
	return json.Marshal(m)
}

// writeCreateArchive writes what `podman container restore --import`
// needs to create the container: the records, a checkpoint directory with
// an inventory to find, and the placeholder diff.
func writeCreateArchive(path string, config, spec []byte, vols []runtime.Volume) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	type entry struct {
		name string
		data []byte
	}
	entries := []entry{{"config.dump", config}, {"spec.dump", spec}, {"checkpoint/", nil}, {"checkpoint/inventory.img", []byte{}}, {"rootfs-diff.tar", placeholderDiff}}
	// Podman makes the named volumes from the tars the archive holds:
	// empty ones here, filled by the sync.
	if len(vols) > 0 {
		entries = append(entries, entry{"volumes/", nil})
	}
	for _, v := range vols {
		entries = append(entries, entry{"volumes/" + v.Name + ".tar", emptyTar})
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.data)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o700
		}
		if err = tw.WriteHeader(h); err != nil {
			break
		}
		if _, err = tw.Write(e.data); err != nil {
			break
		}
	}
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// emptyTar is a tar archive of nothing: its end marker.
var emptyTar = make([]byte, 1024)

// target is a container Podman created here, waiting for its restore.
type target struct {
	r      *Runtime
	name   string
	id     string // Podman's ID here (not the source's)
	bundle string // Podman's directory for it (config.json, checkpoint)
	upper  string // its writable layer
	pid    int    // the restored init's, once restored
	// volumes are the ones made for it here.
	volumes []runtime.Volume
}

func (t *target) RootfsDir() string { return t.upper }

// criuConf is the CRIU configuration file of the container's restore.
func (t *target) criuConf() string { return filepath.Join(t.bundle, "ferry-criu.conf") }

// Restore links the images in as the container's checkpoint and has
// Podman restore it, then reads the running container's PID back.
func (t *target) Restore(ctx context.Context, o runtime.RestoreOptions) (int, error) {
	// runc hands CRIU this file, which overrides what Podman asks of it:
	// a lazy restore's work directory is where the lazy-pages daemon's
	// socket is.
	conf := runc.CRIUConfig{LeaveStopped: true, LazyPages: o.Lazy, TCPClose: o.TCPClose}.WithYard(o.WorkDir)
	if o.Lazy {
		conf.WorkDir = o.WorkDir
	}
	if err := conf.Write(t.criuConf()); err != nil {
		return 0, err
	}
	images, err := filepath.Abs(o.ImagesDir)
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(filepath.Join(images, "inventory.img")); err != nil {
		return 0, fmt.Errorf("podman: no CRIU images to restore %s from: %w", t.name, err)
	}
	links := []string{filepath.Join(t.bundle, "checkpoint")}
	if err := relink(images, links[0]); err != nil {
		return 0, err
	}
	if _, err := os.Stat(filepath.Join(images, devShmTar)); err == nil {
		links = append(links, filepath.Join(t.bundle, devShmTar))
		if err := relink(filepath.Join(images, devShmTar), links[1]); err != nil {
			return 0, err
		}
	}
	args := []string{"container", "restore", "--file-locks"}
	if o.TCPEstablished {
		args = append(args, "--tcp-established")
	}
	_, err = t.r.Host.podman(ctx, append(args, t.id)...)
	// Read by now: later dumps of this container must not leave it stopped.
	_ = runc.ClearCRIUConfig(t.criuConf())
	if err != nil {
		// Podman keeps CRIU's log in the bundle when a restore fails.
		logPath := filepath.Join(t.bundle, "restore.log")
		if o.WorkDir != "" {
			if b, rerr := os.ReadFile(logPath); rerr == nil && os.WriteFile(filepath.Join(o.WorkDir, "restore.log"), b, 0o600) == nil {
				logPath = filepath.Join(o.WorkDir, "restore.log")
			}
		}
		for _, l := range links {
			_ = os.Remove(l)
		}
		return 0, fmt.Errorf("%w%s", err, criu.LogErrors(logPath))
	}
	d, err := t.r.inspect(ctx, t.id)
	if err != nil {
		return 0, err
	}
	if d.State.Status != "running" || d.State.Pid <= 0 {
		return 0, fmt.Errorf("podman restored %s, which is %s (pid %d), not running", t.name, d.State.Status, d.State.Pid)
	}
	t.pid = d.State.Pid
	return t.pid, nil
}

// relink makes link a symbolic link to dst, replacing whatever was there.
func relink(dst, link string) error {
	if err := os.RemoveAll(link); err != nil {
		return err
	}
	return os.Symlink(dst, link)
}

// Start lets the processes CRIU left stopped run.
func (t *target) Start(ctx context.Context) error {
	rc, err := t.r.runc()
	if err != nil {
		return err
	}
	return rc.ContinueRestored(ctx, t.id, t.pid)
}

// Continue lets a container restored stopped run, found by name (its ID
// here is not the source's).
func (r *Runtime) Continue(ctx context.Context, c *runtime.Container) error {
	d, err := r.inspect(ctx, c.Name)
	if err != nil {
		return err
	}
	return r.continueID(ctx, d.ID)
}

// continueID sends every process of Podman's container id SIGCONT.
func (r *Runtime) continueID(ctx context.Context, id string) error {
	rc, err := r.runc()
	if err != nil {
		return err
	}
	return rc.ContinueAll(ctx, id)
}

// Discard removes the container Prepare created (restored or not), and
// the volumes it made; one already gone counts as removed.
//
// A post-copy copy whose page source broke dies (SIGBUS on a page that
// never comes) about when it is discarded. Podman, still recording it
// running or paused, then fails to kill it ("container not running",
// "state improper: stopped") and only afterwards reads that it exited: a
// second try, once Podman has caught up, removes it.
func (t *target) Discard(ctx context.Context) error {
	ref := t.id
	if ref == "" {
		ref = t.name
	}
	if err := t.r.forceRemove(ctx, ref); err != nil {
		return err
	}
	return t.r.removeVolumes(ctx, t.volumes)
}

// forceRemove is `podman rm --force`, tried again while Podman's record
// of the container's state lags behind its processes' (they died while
// Podman called it running or paused).
func (r *Runtime) forceRemove(ctx context.Context, ref string) error {
	var err error
	for try := 0; try < 5; try++ {
		if try > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(500 * time.Millisecond):
			}
		}
		if _, err = r.Host.podman(ctx, "rm", "--force", "--ignore", "--time", "0", ref); err == nil || !staleState(err) {
			return err
		}
	}
	return err
}

// staleState says a podman error came from its record of a container's
// state lagging behind the runtime's.
func staleState(err error) bool {
	s := err.Error()
	return strings.Contains(s, "state improper") || strings.Contains(s, "not running") || strings.Contains(s, "not paused")
}

// podmanPath is this host's podman binary, as conmon would run it.
func podmanPath() string {
	p, err := exec.LookPath("podman")
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return real
	}
	return p
}

package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/api/restoreshim"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
)

// restoreWait bounds the shim's restore once asked (runc restore, CRIU).
const restoreWait = 5 * time.Minute

func (r *Runtime) restoreDir() string {
	if r.RestoreDir == "" {
		return restoreshim.DefaultDir
	}
	return r.RestoreDir
}

// Prepare finds the replacement pod's container that waits for c (the
// shim's rendezvous under c's ID), waiting for its kubelet to make it, and
// refuses one over another image.
func (r *Runtime) Prepare(ctx context.Context, c *runtime.Container, _ runtime.PrepareOptions) (runtime.Target, error) {
	if c.Runtime != r.Kind() {
		return nil, fmt.Errorf("kubernetes cannot receive a %s container", c.Runtime)
	}
	if err := restoreshim.CheckKey(c.ID); err != nil {
		return nil, err
	}
	dir := restoreshim.KeyDir(r.restoreDir(), c.ID)
	created, err := r.awaitReplacement(ctx, dir)
	if err != nil {
		return nil, err
	}
	cl, err := r.Containerd.Connect()
	if err != nil {
		return nil, err
	}
	nctx := withNamespace(ctx, created.Namespace)
	ctr, err := cl.LoadContainer(nctx, created.ID)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: the replacement container %s: %w", created.ID, err)
	}
	info, err := ctr.Info(nctx)
	if err != nil {
		return nil, err
	}
	img, err := cl.GetImage(nctx, info.Image)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: the replacement container's image %s: %w", info.Image, err)
	}
	if _, want, _ := strings.Cut(c.Image, "@"); want != "" && img.Target().Digest.String() != want {
		return nil, fmt.Errorf("kubernetes: the replacement pod's image %s is %s here, %s at the source: ferry moves only the container's own layer over the same image", info.Image, img.Target().Digest, want)
	}
	upper, err := containerd.UpperDir(nctx, cl, info.Snapshotter, info.SnapshotKey)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: the replacement container %s: %w", created.ID, err)
	}
	spec, err := os.ReadFile(filepath.Join(created.Bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("kubernetes: the replacement container's spec: %w", err)
	}
	rc, err := r.Containerd.RuncOf(ctx, containerd.JoinName(created.Namespace, created.ID))
	if err != nil {
		return nil, err
	}
	return &target{r: r, dir: dir, ns: created.Namespace, id: created.ID, upper: upper, spec: spec, podUID: info.Labels[LabelPodUID], runc: rc}, nil
}

// awaitReplacement waits for the shim's word that it created the
// replacement container (PrepareWait; the kubelet may still be making
// its pod's sandbox).
func (r *Runtime) awaitReplacement(ctx context.Context, dir string) (restoreshim.Created, error) {
	var created restoreshim.Created
	wait := r.PrepareWait
	if wait == 0 {
		wait = 90 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(filepath.Join(dir, restoreshim.CreatedFile))
		if err == nil {
			if err := json.Unmarshal(b, &created); err != nil {
				return created, fmt.Errorf("kubernetes: the shim's %s: %w", restoreshim.CreatedFile, err)
			}
			if procs.Alive(created.ShimPID) {
				return created, nil
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return created, err
		}
		if time.Now().After(deadline) {
			return created, fmt.Errorf("kubernetes: %w on this node within %v: its pod needs runtimeClassName ferry and the annotation %s=%s (ferry's Migration controller makes it), and this node's containerd the ferry runtime handler, its shim's %s=%s",
				errNoReplacement, wait, restoreshim.Annotation, filepath.Base(dir), restoreshim.DirEnv, filepath.Dir(dir))
		}
		select {
		case <-ctx.Done():
			return created, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// target is the replacement pod's container, created and waiting in its
// shim's Start.
type target struct {
	r              *Runtime
	dir            string // the rendezvous
	ns, id, podUID string
	upper          string
	spec           []byte // the replacement's own, its kubelet's
	runc           runc.Host
	asked          bool // the shim was asked (restore or abort)
	pid            int
}

var (
	_ runtime.VolumeTarget  = (*target)(nil)
	_ runtime.ImagesChecker = (*target)(nil)
)

func (t *target) RootfsDir() string { return t.upper }

// VolumeDir is the replacement's own emptyDir volume of that name.
func (t *target) VolumeDir(name string) (string, error) {
	var s specs.Spec
	if err := json.Unmarshal(t.spec, &s); err != nil {
		return "", err
	}
	return emptyDirOf(&s, t.podUID, name)
}

// CheckImages checks the images against the replacement's own spec:
// what its kubelet made for it here, not what the source sent.
func (t *target) CheckImages(dir string) error { return t.r.Admission.CheckImages(dir, t.spec) }

// Restore points the shim at the images and CRIU's work directory and
// lets its Start restore, leaving the processes stopped until Start.
func (t *target) Restore(ctx context.Context, o runtime.RestoreOptions) (int, error) {
	conf := filepath.Join(t.dir, "criu.conf")
	c := runc.CRIUConfig{LeaveStopped: true, TCPEstablished: o.TCPEstablished, TCPClose: o.TCPClose, LazyPages: o.Lazy}.WithYard(o.WorkDir)
	if err := c.Write(conf); err != nil {
		return 0, err
	}
	for link, dst := range map[string]string{restoreshim.ImagesLink: o.ImagesDir, restoreshim.WorkLink: o.WorkDir} {
		path := filepath.Join(t.dir, link)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
		if err := os.Symlink(dst, path); err != nil {
			return 0, err
		}
	}
	rep, err := t.ask(ctx, restoreshim.Request{CRIUConfig: conf})
	// Read by now, and the spec names it from now on: a later dump of
	// this container must not leave it stopped, nor look for this
	// restore's cgroup yard.
	_ = runc.ClearCRIUConfig(conf)
	if err != nil {
		return 0, err
	}
	if rep.Error != "" {
		return 0, fmt.Errorf("kubernetes: the replacement's restore: %s", rep.Error)
	}
	t.pid = rep.PID
	return t.pid, nil
}

// ask sends the waiting shim its one request.
func (t *target) ask(ctx context.Context, req restoreshim.Request) (restoreshim.Reply, error) {
	t.asked = true
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(t.dir, restoreshim.SocketFile))
	if err != nil {
		return restoreshim.Reply{}, fmt.Errorf("kubernetes: the replacement's shim: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	return restoreshim.Ask(conn, req, restoreWait)
}

// Start continues the processes CRIU left stopped.
func (t *target) Start(ctx context.Context) error { return t.runc.ContinueRestored(ctx, t.id, t.pid) }

// Discard fails the shim's Start where it still waits, or kills what it
// restored; the replacement pod is its owner's to delete.
func (t *target) Discard(ctx context.Context) error {
	if !t.asked {
		_, err := t.ask(ctx, restoreshim.Request{Abort: "the migration did not commit"})
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		return nil
	}
	cl, err := t.r.Containerd.Connect()
	if err != nil {
		return err
	}
	ctx = withNamespace(ctx, t.ns)
	ctr, err := cl.LoadContainer(ctx, t.id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

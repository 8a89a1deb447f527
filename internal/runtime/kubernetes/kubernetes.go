// Package kubernetes is a Kubernetes pod's container as a ferry runtime:
// the node's containerd (its CRI namespace, k8s.io) at the source, and at
// the destination a replacement pod that this node's kubelet made and
// ferry's containerd shim holds at its container's Start.
//
// Source. The container is a containerd task under the runc shim: ferry
// freezes and dumps it as it does any containerd container (package
// containerd). After the commit it is not deleted here: deleting a pod's
// container behind the kubelet's back makes the kubelet start it again
// from its image. Its pod is deleted instead (ferry's Migration
// controller does it when the migration reaches its cleanup), and Remove
// waits for the kubelet to have removed the container.
//
// Destination. The replacement pod runs with RuntimeClass ferry and the
// annotation restoreshim.Annotation naming the source container's ID: the
// shim turns its container into a restore and waits at Start (package
// api/restoreshim). Prepare finds that container (waiting for the kubelet
// to make it), checks its image is the source's, and syncs the source's
// writable layer into its snapshot's; Restore points the shim at the
// migration's images and CRIU work directory and lets Start go on. The
// pod gets its own address on this node's pod network: established
// connections are closed, listening sockets kept (the report says so
// before the freeze), and clients reach it again through a Service.
//
// What moves besides memory and the writable layer: emptyDir volumes.
// ConfigMaps, Secrets, projected tokens and the pod's own files are the
// replacement pod's, made by its kubelet. Persistent volumes the
// controller found the target node shares (SharedMounts) stay where they
// are, as host directories whose storage the destination checks is the
// same; other hostPath and persistent volumes are refused before anything
// is frozen.
package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
)

// Namespace is the containerd namespace of the CRI's containers.
const Namespace = "k8s.io"

// The labels the CRI puts on a pod's containers.
const (
	LabelPodName      = "io.kubernetes.pod.name"
	LabelPodNamespace = "io.kubernetes.pod.namespace"
	LabelPodUID       = "io.kubernetes.pod.uid"
	LabelContainer    = "io.kubernetes.container.name"
)

// annotationSandboxID is the spec annotation naming a container's sandbox.
const annotationSandboxID = "io.kubernetes.cri.sandbox-id"

// Runtime is this node's Kubernetes containers.
type Runtime struct {
	// Containerd is the node's containerd, the kubelet's runtime.
	Containerd *containerd.Runtime
	// RestoreDir is the rendezvous directory of this node's ferry shim
	// (restoreshim.DirEnv in containerd's environment); empty:
	// restoreshim.DefaultDir.
	RestoreDir string
	// Admission is what this node accepts of the CRIU images, checked
	// against the replacement container's own spec.
	Admission admission.Policy
	// SharedMounts are where the container mounts storage its controller
	// found the target node shares (api.KubernetesOptionShared, a
	// request's option): host directories, never copied.
	SharedMounts []string
	// PrepareWait bounds the wait for the replacement pod's container;
	// RemoveWait the wait for the kubelet to remove the source's.
	PrepareWait, RemoveWait time.Duration
}

var _ runtime.Runtime = (*Runtime)(nil)

// Kind is "kubernetes".
func (r *Runtime) Kind() string { return "kubernetes" }

// Caps are containerd's.
func (r *Runtime) Caps() runtime.Caps { return r.Containerd.Caps() }

// name is the containerd name of a CRI container ID.
func name(id string) string { return containerd.JoinName(Namespace, id) }

// Inspect describes a pod's container by its containerd ID (as the pod's
// status gives it, without "containerd://"; "k8s.io/ID" too).
func (r *Runtime) Inspect(ctx context.Context, ref string) (*runtime.Container, error) {
	id := strings.TrimPrefix(strings.TrimPrefix(ref, "containerd://"), Namespace+"/")
	if strings.Contains(id, "/") {
		return nil, fmt.Errorf("kubernetes: %q is no container ID of namespace %s: %w", ref, Namespace, runtime.ErrNotFound)
	}
	c, err := r.Containerd.Inspect(ctx, name(id))
	if err != nil {
		return nil, err
	}
	cl, err := r.Containerd.Connect()
	if err != nil {
		return nil, err
	}
	ctr, err := cl.LoadContainer(withNS(ctx), id)
	if err != nil {
		return nil, err
	}
	labels, err := ctr.Labels(withNS(ctx))
	if err != nil {
		return nil, err
	}
	if labels[LabelPodUID] == "" || labels[LabelContainer] == "" {
		return nil, fmt.Errorf("containerd container %s is no Kubernetes pod's container (no %s label): move it with --runtime containerd", c.Name, LabelPodUID)
	}
	c.Runtime = r.Kind()
	if c.Status == "stopped" {
		return c, nil
	}
	var s specs.Spec
	if err := json.Unmarshal(c.Spec, &s); err != nil {
		return nil, err
	}
	m, err := classifyMounts(&s, labels[LabelPodUID], s.Annotations[annotationSandboxID], r.SharedMounts)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s, container %s: %w", labels[LabelPodNamespace], labels[LabelPodName], labels[LabelContainer], err)
	}
	c.Volumes, c.Shared = m.emptyDirs, m.shared
	if addr := podAddress(&s); addr != "" {
		c.Networks = []runtime.Network{{Name: "pod network", Driver: "kubernetes", Address: addr, HostLocal: true}}
	} else {
		c.Networks = []runtime.Network{{Name: "pod network", Driver: "kubernetes", HostLocal: true}}
	}
	return c, nil
}

// podAddress is the pod's IPv4 address as the pod's network namespace
// has it, or "" where that cannot be read.
func podAddress(s *specs.Spec) string {
	path := ""
	if s.Linux != nil {
		for _, ns := range s.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				path = ns.Path
			}
		}
	}
	if path == "" {
		return ""
	}
	addr, _ := addressIn(path)
	return addr
}

func withNS(ctx context.Context) context.Context {
	return withNamespace(ctx, Namespace)
}

// Freeze, Thaw and Checkpoint are containerd's.
func (r *Runtime) Freeze(ctx context.Context, c *runtime.Container) error {
	return r.Containerd.Freeze(ctx, c)
}

func (r *Runtime) Thaw(ctx context.Context, c *runtime.Container) error {
	return r.Containerd.Thaw(ctx, c)
}

func (r *Runtime) Checkpoint(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions) (runtime.Dump, error) {
	return r.Containerd.Checkpoint(ctx, c, o)
}

// Remove waits until the kubelet has removed the source's container, its
// pod deleted by whoever drives the migration (see the package comment).
// Where a SIGKILL waits in its frozen processes (the kubelet's stop of a
// container paused by ferry), it thaws them so the kill lands.
func (r *Runtime) Remove(ctx context.Context, c *runtime.Container) error {
	cl, err := r.Containerd.Connect()
	if err != nil {
		return err
	}
	wait := r.RemoveWait
	if wait == 0 {
		wait = 2 * time.Minute
	}
	ctx = withNS(ctx)
	deadline := time.Now().Add(wait)
	for {
		ctr, err := cl.LoadContainer(ctx, c.ID)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if t, err := ctr.Task(ctx, nil); err == nil {
			if st, err := t.Status(ctx); err == nil && st.Status == client.Stopped {
				return nil // killed: the kubelet removes it in its own time
			} else if err == nil && st.Status == client.Paused && killPending(int(t.Pid())) {
				_ = t.Resume(ctx)
			}
		} else if errdefs.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubernetes: the source's container %s is still there, frozen, %v after the commit: delete its pod (ferry's Migration controller does at the commit; `kubectl delete pod --grace-period=0` by hand)", c.ID, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// errNoReplacement says no replacement pod's container came.
var errNoReplacement = errors.New("no replacement pod's container")

// SandboxAddress is the IPv4 address of pod namespace/name's sandbox on
// the node whose containerd is cd: known as soon as the sandbox is made,
// before the kubelet reports it (a replacement pod's, while its container
// waits in ferry's shim).
func SandboxAddress(ctx context.Context, cd *containerd.Runtime, namespace, name string) (string, error) {
	cl, err := cd.Connect()
	if err != nil {
		return "", err
	}
	ctx = withNS(ctx)
	ctrs, err := cl.Containers(ctx, fmt.Sprintf(`labels."%s"==%s,labels."%s"==%s,labels."io.cri-containerd.kind"==sandbox`,
		LabelPodName, name, LabelPodNamespace, namespace))
	if err != nil {
		return "", err
	}
	for _, c := range ctrs {
		s, err := c.Spec(ctx)
		if err != nil {
			return "", err
		}
		if addr := podAddress(s); addr != "" {
			return addr, nil
		}
	}
	return "", fmt.Errorf("pod %s/%s has no sandbox with an address on this node yet", namespace, name)
}

// List lists the pods' containers (not their sandboxes), by containerd ID.
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	cs, err := r.Containerd.ListNamespace(ctx, Namespace, `labels."io.cri-containerd.kind"==container`)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no kubelet's containerd here
	}
	for i := range cs {
		cs[i].Runtime, cs[i].Name = r.Kind(), cs[i].ID
	}
	return cs, err
}

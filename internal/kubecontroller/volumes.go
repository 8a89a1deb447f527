package kubecontroller

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// sharedMount is a persistent volume the moved container mounts whose
// storage the target node reaches: nothing of it is copied, and the
// destination's agent checks it is the same storage there before the
// freeze (shareddir).
type sharedMount struct {
	Volume, PV, Path string // the pod's volume, its PV, where the container mounts it
	HostPath         string
}

// sharedVolumes checks each persistent volume claim of pod against target:
// a volume moves with its pod only as storage every node reaches at the
// same host path (a hostPath PV with no node affinity, or one that admits
// target), mountable by two pods on two nodes at once (ReadWriteMany or
// ReadOnlyMany: the replacement mounts it before the source ends). It
// returns those the container mounts, or why the pod cannot move.
func sharedVolumes(ctx context.Context, c client.Client, pod *corev1.Pod, container, target string) ([]sharedMount, error) {
	ctr := pickContainer(pod, container)
	var out []sharedMount
	for _, vol := range pod.Spec.Volumes {
		claim := vol.PersistentVolumeClaim
		if claim == nil {
			continue
		}
		var pvc corev1.PersistentVolumeClaim
		if err := c.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: claim.ClaimName}, &pvc); err != nil {
			return nil, fmt.Errorf("volume %q: claim %s: %w", vol.Name, claim.ClaimName, err)
		}
		if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
			return nil, fmt.Errorf("volume %q: claim %s is %s, not bound", vol.Name, pvc.Name, pvc.Status.Phase)
		}
		var pv corev1.PersistentVolume
		if err := c.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			return nil, fmt.Errorf("volume %q: persistent volume %s: %w", vol.Name, pvc.Spec.VolumeName, err)
		}
		if err := reachable(ctx, c, &pv, target); err != nil {
			return nil, fmt.Errorf("volume %q (persistent volume %s): %w", vol.Name, pv.Name, err)
		}
		for _, vm := range ctr.VolumeMounts {
			if vm.Name == vol.Name {
				out = append(out, sharedMount{Volume: vol.Name, PV: pv.Name, Path: vm.MountPath, HostPath: pv.Spec.HostPath.Path})
			}
		}
	}
	return out, nil
}

// sharedPaths are where the container mounts shared.
func sharedPaths(shared []sharedMount) []string {
	var out []string
	for _, s := range shared {
		out = append(out, s.Path)
	}
	return out
}

// reachable says why target cannot use pv beside the source, nil if it
// can.
func reachable(ctx context.Context, c client.Client, pv *corev1.PersistentVolume, target string) error {
	if pv.Spec.HostPath == nil {
		return fmt.Errorf("ferry moves pods whose persistent volumes are storage the nodes share at the same host path (a hostPath persistent volume, e.g. a network filesystem mounted on every node), and checks it is the same storage at the target; this one is another kind")
	}
	if !slices.Contains(pv.Spec.AccessModes, corev1.ReadWriteMany) && !slices.Contains(pv.Spec.AccessModes, corev1.ReadOnlyMany) {
		return fmt.Errorf("access modes %v: the replacement pod on %s mounts it while the source still runs, which needs ReadWriteMany (or ReadOnlyMany)", pv.Spec.AccessModes, target)
	}
	if a := pv.Spec.NodeAffinity; a != nil && a.Required != nil {
		var node corev1.Node
		if err := c.Get(ctx, types.NamespacedName{Name: target}, &node); err != nil {
			return err
		}
		ok, err := nodeaffinity.NewLazyErrorNodeSelector(a.Required).Match(&node)
		if err != nil {
			return fmt.Errorf("its node affinity: %w", err)
		}
		if !ok {
			return fmt.Errorf("its node affinity does not admit the target node %s", target)
		}
	}
	return nil
}

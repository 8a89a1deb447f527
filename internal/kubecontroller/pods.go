package kubecontroller

import (
	"context"
	"fmt"
	"maps"
	"math"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ferry-migrate/ferry/api"
	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/api/restoreshim"
	"github.com/ferry-migrate/ferry/internal/follow"
	"github.com/ferry-migrate/ferry/internal/model"
)

// RuntimeClass is the RuntimeClass of replacement pods: ferry's shim.
const RuntimeClass = "ferry"

// LabelMigration marks a replacement pod with its Migration's name.
const LabelMigration = "ferry.dev/migration"

// The ReplicaSet's label of its pods (a replacement without it is not
// counted until the commit), and the annotation that makes a ReplicaSet
// scaling down pick the source first.
const (
	labelTemplateHash   = appsv1.DefaultDeploymentUniqueLabelKey
	annotationDelCost   = "controller.kubernetes.io/pod-deletion-cost"
	lowestDeletionCost  = "-2147483648"
	serviceAccountToken = "kube-api-access-"
)

// Movable refuses what ferry cannot move yet, saying why: pods of
// controllers that own their pods' names or nodes, and volumes the target
// node does not share.
func Movable(pod *corev1.Pod) error {
	if ref := metav1.GetControllerOf(pod); ref != nil {
		switch ref.Kind {
		case "ReplicaSet":
		case "StatefulSet":
			return fmt.Errorf("belongs to StatefulSet %s: ferry does not move StatefulSet pods yet (the pod's name is its identity, so the source pod must be gone before its replacement exists)", ref.Name)
		default:
			return fmt.Errorf("belongs to %s %s: ferry moves bare pods and Deployments' pods", ref.Kind, ref.Name)
		}
	}
	if len(pod.Spec.InitContainers) > 0 {
		return fmt.Errorf("has init containers: ferry restores every container of the replacement pod from the one it moves, so it moves pods of one container only")
	}
	if pod.Spec.HostNetwork {
		return fmt.Errorf("uses the host's network: its address is its node's")
	}
	kinds := map[string]string{}
	for _, vol := range pod.Spec.Volumes {
		if vol.EmptyDir != nil {
			kinds[vol.Name] = "emptyDir"
		}
	}
	for _, c := range pod.Spec.Containers {
		for _, vm := range c.VolumeMounts {
			if (vm.SubPath != "" || vm.SubPathExpr != "") && kinds[vm.Name] != "" {
				return fmt.Errorf("mounts part of %s volume %q (subPath): ferry moves emptyDir volumes mounted whole only", kinds[vm.Name], vm.Name)
			}
		}
	}
	for _, vol := range pod.Spec.Volumes {
		switch {
		case vol.EmptyDir != nil, vol.ConfigMap != nil, vol.Secret != nil, vol.Projected != nil, vol.DownwardAPI != nil:
		case vol.PersistentVolumeClaim != nil:
			// Checked against the target node once it is known
			// (sharedVolumes).
		case vol.HostPath != nil:
			return fmt.Errorf("volume %q is hostPath %s: it is the source node's, and ferry does not check the target has the same", vol.Name, vol.HostPath.Path)
		default:
			return fmt.Errorf("volume %q is neither emptyDir, configMap, secret, projected, downwardAPI nor a persistent volume claim: ferry moves emptyDir data, and persistent volumes the target node reaches", vol.Name)
		}
	}
	return nil
}

// replacementName names the replacement pod: the source's, with the job's
// first digits.
func replacementName(pod *corev1.Pod, m *v1.Migration) string {
	base := pod.Name
	if len(base) > 50 {
		base = base[:50]
	}
	return base + "-" + JobID(m.UID)[:6]
}

// makeReplacement creates the replacement pod on the target node, once.
// (Its address is not waited for: the kubelet reports it only once the
// container's Start, which waits for the migration, has returned.)
func (r *Reconciler) makeReplacement(ctx context.Context, m *v1.Migration) error {
	var p corev1.Pod
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Status.TargetPod}, &p)
	if err == nil {
		if p.Status.Phase == corev1.PodFailed {
			return fmt.Errorf("pod %s failed on %s: %s %s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	var src corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Status.SourcePod}, &src); err != nil {
		return fmt.Errorf("the source pod: %w", err)
	}
	if err := r.Client.Create(ctx, replacement(&src, m)); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// replacement is the source pod's copy for the target node: RuntimeClass
// ferry, the restore annotation naming the source container, no owner and
// no ReplicaSet label (so the ReplicaSet counts it only once it is
// adopted, after the commit), and without the service account token's
// volume (the target's admission adds its own).
func replacement(src *corev1.Pod, m *v1.Migration) *corev1.Pod {
	labels := maps.Clone(src.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	delete(labels, labelTemplateHash)
	labels[LabelMigration] = m.Name
	ann := map[string]string{restoreshim.Annotation: m.Status.ContainerID}
	for k, v := range src.Annotations {
		if !strings.HasPrefix(k, "kubectl.kubernetes.io/") && k != annotationDelCost && k != restoreshim.Annotation {
			ann[k] = v
		}
	}
	spec := src.Spec.DeepCopy()
	spec.NodeName = m.Status.TargetNode
	// Set by the API, not by a pod's creator: a debugger's ephemeral
	// containers, and the overhead of the source's RuntimeClass (ferry's
	// is another).
	spec.EphemeralContainers, spec.Overhead = nil, nil
	rc := RuntimeClass
	spec.RuntimeClassName = &rc
	var vols []corev1.Volume
	for _, v := range spec.Volumes {
		if !strings.HasPrefix(v.Name, serviceAccountToken) {
			vols = append(vols, v)
		}
	}
	spec.Volumes = vols
	for i := range spec.Containers {
		var ms []corev1.VolumeMount
		for _, vm := range spec.Containers[i].VolumeMounts {
			if !strings.HasPrefix(vm.Name, serviceAccountToken) {
				ms = append(ms, vm)
			}
		}
		spec.Containers[i].VolumeMounts = ms
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: m.Status.TargetPod, Namespace: src.Namespace, Labels: labels, Annotations: ann},
		Spec:       *spec,
	}
}

// deleteReplacement removes a replacement that did not take the pod's
// place (its container was never restored, or its restore dropped).
func (r *Reconciler) deleteReplacement(ctx context.Context, m *v1.Migration) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Status.TargetPod}}
	zero := int64(0)
	if err := r.Client.Delete(ctx, p, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// switchOver gives the source pod's place to the replacement, which runs
// the container now: a ReplicaSet's pod is first made the one its
// ReplicaSet drops (lowest deletion cost), the replacement takes its
// labels (the ReplicaSet adopts it), then the source pod, frozen since
// the commit, is deleted. Each step is idempotent.
func (r *Reconciler) switchOver(ctx context.Context, m *v1.Migration) error {
	var dst corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Status.TargetPod}, &dst); err != nil {
		return fmt.Errorf("the replacement pod: %w", err)
	}
	var src corev1.Pod
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Status.SourcePod}, &src)
	if apierrors.IsNotFound(err) {
		return nil // done before
	}
	if err != nil {
		return err
	}
	if hash := src.Labels[labelTemplateHash]; hash != "" && dst.Labels[labelTemplateHash] != hash {
		// The ReplicaSet, seeing one pod too many for a moment, must drop
		// the source: a ready replacement and the source's lowest cost.
		if err := r.awaitReady(ctx, m); err != nil {
			return err
		}
		patch := client.MergeFrom(src.DeepCopy())
		if src.Annotations == nil {
			src.Annotations = map[string]string{}
		}
		src.Annotations[annotationDelCost] = lowestDeletionCost
		if err := r.Client.Patch(ctx, &src, patch); err != nil {
			return err
		}
		patch = client.MergeFrom(dst.DeepCopy())
		dst.Labels[labelTemplateHash] = hash
		if err := r.Client.Patch(ctx, &dst, patch); err != nil {
			return err
		}
	}
	zero := int64(0)
	err = r.Client.Delete(ctx, &src, &client.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &src.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// awaitReady waits (bounded) for the replacement to be Ready.
func (r *Reconciler) awaitReady(ctx context.Context, m *v1.Migration) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var p corev1.Pod
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Status.TargetPod}, &p); err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replacement pod %s is not Ready 30 s after the commit", p.Name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pickTarget checks the target node asked for, or weighs the Ready,
// schedulable nodes other than the source by follow's policy
// (placeByPolicy); where the agents cannot weigh them, it picks the one
// with the most memory not requested by its pods, and reason says so.
func (r *Reconciler) pickTarget(ctx context.Context, pod *corev1.Pod, want, id string, maxDowntime time.Duration) (target, reason string, err error) {
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return "", "", err
	}
	if want != "" {
		if want == pod.Spec.NodeName {
			return "", "", fmt.Errorf("target node %s is the pod's own node", want)
		}
		for i := range nodes.Items {
			if nodes.Items[i].Name == want {
				if why := unfit(&nodes.Items[i]); why != "" {
					return "", "", fmt.Errorf("target node %s %s", want, why)
				}
				return want, "", nil
			}
		}
		return "", "", fmt.Errorf("no node %q", want)
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods); err != nil {
		return "", "", err
	}
	requested := map[string]int64{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			requested[p.Spec.NodeName] += c.Resources.Requests.Memory().Value()
		}
	}
	best, bestFree := "", int64(math.MinInt64)
	var why, fits []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Name == pod.Spec.NodeName {
			continue
		}
		if w := unfit(n); w != "" {
			why = append(why, n.Name+" "+w)
			continue
		}
		fits = append(fits, n.Name)
		free := n.Status.Allocatable.Memory().Value() - requested[n.Name]
		if best == "" || free > bestFree || (free == bestFree && n.Name < best) {
			best, bestFree = n.Name, free
		}
	}
	if best == "" {
		return "", "", fmt.Errorf("no node to move pod %s to (%s)", pod.Name, strings.Join(append(why, "the source "+pod.Spec.NodeName+" excluded"), "; "))
	}
	node, reason, err := r.placeByPolicy(ctx, pod, id, fits, maxDowntime)
	if err != nil {
		return best, fmt.Sprintf("%s: the node with the most memory not requested (its agents could not weigh the nodes: %v)", best, err), nil
	}
	if node == "" {
		return "", "", fmt.Errorf("no node can take pod %s: %s", pod.Name, reason)
	}
	return node, reason, nil
}

// placeByPolicy weighs the fit nodes as ferry follow weighs hosts (package
// follow, clients left out: this move is not made for them): the source
// node's agent measures the container and asks each node's agent for its
// room and prices, and measures the link to it; the cheapest node with
// room whose predicted downtime fits the budget wins. node is "" when none
// can take it (reason says why).
func (r *Reconciler) placeByPolicy(ctx context.Context, pod *corev1.Pod, id string, fits []string, maxDowntime time.Duration) (node, reason string, err error) {
	src, err := r.Agents.Of(ctx, r.Client, pod.Spec.NodeName)
	if err != nil {
		return "", "", err
	}
	q := api.AssessQuery{Container: id, Runtime: "kubernetes", NoClients: true, Workload: true}
	for _, n := range fits {
		ep, err := r.Agents.Of(ctx, r.Client, n)
		if err != nil {
			return "", "", err
		}
		q.Candidates = append(q.Candidates, ep.Name+"@"+ep.Addr)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a, err := agentclient.Assess(ctx, src, q)
	if err != nil {
		return "", "", err
	}
	svc, cands := follow.FromAssessment(a, fits, maxDowntime)
	pl := follow.Placer{Trigger: follow.DefaultTrigger(), Profile: model.DefaultProfile(), SourceLoad: follow.SourceLoad(a), AnyLatency: true}
	p := pl.Place(svc, cands)
	return p.Chosen, p.Reason, nil
}

// unfit says why a node cannot take a pod, "" when it can.
func unfit(n *corev1.Node) string {
	if n.Spec.Unschedulable {
		return "is cordoned"
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status != corev1.ConditionTrue {
				return "is not Ready"
			}
			return ""
		}
	}
	return "has no Ready condition"
}

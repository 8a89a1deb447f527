// Package kubecontroller reconciles ferry.dev Migrations: it checks the
// pod and picks the target node, makes the replacement pod there (ferry's
// RuntimeClass: its container waits in ferry's shim), asks the source
// node's agent for the migration under a job ID derived from the
// Migration's UID, and once the agent has committed it hands the pod's
// place to the replacement and deletes the source pod.
//
// Reconciling is idempotent: the phase in the status says what is done,
// the job ID is the Migration's, and an agent asked again for a job it
// has follows that job instead of starting another, so a controller
// restarted at any phase finishes (or rolls back) what it drove and never
// moves the pod twice.
package kubecontroller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ferry-migrate/ferry/api"
	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
)

// Reconciler drives Migrations.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Agents finds a node's ferry agent.
	Agents Agents

	mu sync.Mutex
	// following are the migrations whose job this process follows.
	following map[types.UID]bool
}

// SetupWithManager registers the reconciler for Migrations.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1.Migration{}).Named("migration").Complete(r)
}

// JobID is the agent job of a Migration: derived from its UID, so the
// same Migration always names the same job.
func JobID(uid types.UID) string {
	h := sha256.Sum256([]byte(uid))
	return hex.EncodeToString(h[:])[:12]
}

// Reconcile moves a Migration one step on.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var m v1.Migration
	if err := r.Client.Get(ctx, req.NamespacedName, &m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !m.DeletionTimestamp.IsZero() {
		return r.deleted(ctx, &m)
	}
	if !v1.Final(m.Status.Phase) && controllerutil.AddFinalizer(&m, v1.Finalizer) {
		if err := r.Client.Update(ctx, &m); err != nil {
			return ctrl.Result{}, err
		}
	}
	switch m.Status.Phase {
	case "", v1.PhasePending:
		return ctrl.Result{}, r.check(ctx, &m)
	case v1.PhaseTargetPod:
		if m.Spec.Cancel {
			return ctrl.Result{}, r.end(ctx, &m, v1.PhaseAborted, "cancelled before the migration began: the source pod runs on", nil)
		}
		if err := r.makeReplacement(ctx, &m); err != nil {
			return ctrl.Result{}, r.end(ctx, &m, v1.PhaseFailed, "making the replacement pod: "+err.Error(), nil)
		}
		if m.Spec.Hold {
			if !strings.HasPrefix(m.Status.Message, "held") {
				return ctrl.Result{}, r.setPhase(ctx, &m, v1.PhaseTargetPod, fmt.Sprintf("held: replacement pod %s made on %s; set spec.hold false to migrate", m.Status.TargetPod, m.Status.TargetNode))
			}
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, r.setPhase(ctx, &m, v1.PhaseMigrating, fmt.Sprintf("the source node's agent moves container %s to pod %s on %s", m.Status.ContainerID, m.Status.TargetPod, m.Status.TargetNode))
	case v1.PhaseMigrating:
		if m.Spec.Cancel {
			r.cancel(ctx, &m)
		}
		r.follow(&m)
		return ctrl.Result{}, nil
	case v1.PhaseSwitching:
		r.follow(&m)
		return ctrl.Result{}, nil
	}
	// Final: nothing left but the finalizer.
	if controllerutil.RemoveFinalizer(&m, v1.Finalizer) {
		return ctrl.Result{}, r.Client.Update(ctx, &m)
	}
	return ctrl.Result{}, nil
}

// deleted cancels what a deleted Migration still drives, then lets it go.
func (r *Reconciler) deleted(ctx context.Context, m *v1.Migration) (ctrl.Result, error) {
	switch m.Status.Phase {
	case v1.PhaseMigrating, v1.PhaseSwitching:
		r.cancel(ctx, m)
		r.follow(m)
		return ctrl.Result{RequeueAfter: time.Second}, nil // until the job ended
	case v1.PhaseTargetPod:
		if err := r.deleteReplacement(ctx, m); err != nil {
			return ctrl.Result{}, err
		}
	}
	if controllerutil.RemoveFinalizer(m, v1.Finalizer) {
		return ctrl.Result{}, r.Client.Update(ctx, m)
	}
	return ctrl.Result{}, nil
}

// check refuses bad input before anything is made (the Migration ends
// Failed with the reason) and fills in the source, the target and the job.
func (r *Reconciler) check(ctx context.Context, m *v1.Migration) error {
	st, err := r.plan(ctx, m)
	if err != nil {
		return r.end(ctx, m, v1.PhaseFailed, err.Error(), nil)
	}
	m.Status = st
	msg := fmt.Sprintf("moving pod %s (container %s) from %s to %s", st.SourcePod, st.ContainerID, st.SourceNode, st.TargetNode)
	if st.TargetReason != "" {
		msg += " (" + st.TargetReason + ")"
	}
	if len(st.SharedMounts) > 0 {
		msg += fmt.Sprintf("; persistent volumes at %s stay where they are, shared with %s (not copied)", strings.Join(st.SharedMounts, ", "), st.TargetNode)
	}
	return r.setPhase(ctx, m, v1.PhaseTargetPod, msg)
}

// plan is what check finds, or why the Migration cannot be.
func (r *Reconciler) plan(ctx context.Context, m *v1.Migration) (v1.MigrationStatus, error) {
	var st v1.MigrationStatus
	switch m.Spec.Mode {
	case "", api.ModeAuto, api.ModeCold, api.ModePrecopy, api.ModePostcopy, api.ModeHybrid:
	default:
		return st, fmt.Errorf("mode %q: want auto, cold, precopy, postcopy or hybrid", m.Spec.Mode)
	}
	var pod corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.PodName}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return st, fmt.Errorf("no pod %q in namespace %s", m.Spec.PodName, m.Namespace)
		}
		return st, err
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase != corev1.PodRunning {
		return st, fmt.Errorf("pod %s is %s, not running on a node", pod.Name, pod.Status.Phase)
	}
	if err := Movable(&pod); err != nil {
		return st, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	id, err := containerID(&pod, m.Spec.Container)
	if err != nil {
		return st, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	// The budget rules a node out only where it rules out the move: under
	// auto. A named mode runs whatever its prediction (pre-copy's rounds
	// aim for the budget, as a stop rule).
	var budget time.Duration
	if m.Spec.MaxDowntime != nil && (m.Spec.Mode == "" || m.Spec.Mode == api.ModeAuto) {
		budget = m.Spec.MaxDowntime.Duration
	}
	target, why, err := r.pickTarget(ctx, &pod, m.Spec.TargetNode, id, budget)
	if err != nil {
		return st, err
	}
	shared, err := sharedVolumes(ctx, r.Client, &pod, m.Spec.Container, target)
	if err != nil {
		return st, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	if _, err := r.Agents.Of(ctx, r.Client, pod.Spec.NodeName); err != nil {
		return st, fmt.Errorf("the source node's agent: %w", err)
	}
	if _, err := r.Agents.Of(ctx, r.Client, target); err != nil {
		return st, fmt.Errorf("the target node's agent: %w", err)
	}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: RuntimeClass}, &nodev1.RuntimeClass{}); err != nil {
		return st, fmt.Errorf("RuntimeClass %s: %w (install deploy/kubernetes: ferry restores the replacement pod through it)", RuntimeClass, err)
	}
	return v1.MigrationStatus{
		SourceNode: pod.Spec.NodeName, SourcePod: pod.Name, TargetNode: target,
		TargetPod: replacementName(&pod, m), ContainerID: id, JobID: JobID(m.UID), TargetReason: why,
		MaxFrozenMs: livenessTolerance(&pod, m.Spec.Container).Milliseconds(), SharedMounts: sharedPaths(shared),
	}, nil
}

// pickContainer is the pod's container name (its only one when name is
// empty).
func pickContainer(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if name == "" || pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return &corev1.Container{}
}

// livenessTolerance is how long the pod's container (its only one when
// name is empty) may stay silent before its liveness probe has the kubelet
// restart it: a probe begun at the freeze fails after its timeout, and the
// failureThreshold-th after as many periods more. 0 without a probe.
// Restarting a frozen source would lose it, or run a fresh copy beside
// the moved one.
func livenessTolerance(pod *corev1.Pod, name string) time.Duration {
	p := pickContainer(pod, name).LivenessProbe
	if p == nil {
		return 0
	}
	// The API server's defaults, for a pod that was never stored.
	timeout, period, failures := p.TimeoutSeconds, p.PeriodSeconds, p.FailureThreshold
	if timeout <= 0 {
		timeout = 1
	}
	if period <= 0 {
		period = 10
	}
	if failures <= 0 {
		failures = 3
	}
	return time.Duration(timeout+(failures-1)*period) * time.Second
}

// containerID is the containerd ID of the pod's container name (its only
// one when name is empty).
func containerID(pod *corev1.Pod, name string) (string, error) {
	if name == "" {
		if len(pod.Spec.Containers) != 1 {
			return "", fmt.Errorf("has %d containers: name one (spec.container); ferry moves one container, and its pod's others are not frozen with it", len(pod.Spec.Containers))
		}
		name = pod.Spec.Containers[0].Name
	} else if len(pod.Spec.Containers) != 1 {
		return "", fmt.Errorf("has %d containers: ferry moves pods of one container (and its pause) only", len(pod.Spec.Containers))
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != name {
			continue
		}
		id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
		if !ok || cs.State.Running == nil {
			return "", fmt.Errorf("container %s is not a running containerd container (%q)", name, cs.ContainerID)
		}
		return id, nil
	}
	return "", fmt.Errorf("no container %q", name)
}

// setPhase records a phase and its message, with an event.
func (r *Reconciler) setPhase(ctx context.Context, m *v1.Migration, phase, msg string) error {
	m.Status.Phase, m.Status.Message = phase, msg
	if err := r.Client.Status().Update(ctx, m); err != nil {
		return err
	}
	r.event(m, corev1.EventTypeNormal, phase, msg)
	return nil
}

// end records a final phase, removes a replacement that did not take the
// pod's place, and lets the Migration go.
func (r *Reconciler) end(ctx context.Context, m *v1.Migration, phase, msg string, rep *v1.Report) error {
	// In doubt (the source frozen, not knowing whether the destination
	// committed), the replacement may run the only copy: it stays.
	inDoubt := rep != nil && rep.SourceState == "frozen"
	if phase != v1.PhaseSucceeded && m.Status.TargetPod != "" && !inDoubt {
		if err := r.deleteReplacement(ctx, m); err != nil {
			msg += "; the replacement pod is left: " + err.Error()
		}
	}
	if rep != nil {
		m.Status.Report = rep
	}
	if phase == v1.PhaseSucceeded {
		var p corev1.Pod
		if r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Status.TargetPod}, &p) == nil {
			m.Status.TargetPodIP = p.Status.PodIP
		}
	}
	ready := metav1.ConditionFalse
	if phase == v1.PhaseSucceeded {
		ready = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: "Ready", Status: ready, Reason: phase, Message: truncate(msg, 1000)})
	kind := corev1.EventTypeNormal
	if phase == v1.PhaseFailed {
		kind = corev1.EventTypeWarning
	}
	m.Status.Phase, m.Status.Message = phase, msg
	if err := r.Client.Status().Update(ctx, m); err != nil {
		return err
	}
	r.event(m, kind, phase, msg)
	return nil
}

func (r *Reconciler) event(m *v1.Migration, kind, reason, msg string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(m, nil, kind, reason, "Migrate", "%s", truncate(msg, 1000))
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// cancel asks the source's agent to stop the job (before its commit it
// ends and the source resumes; after, the agent says it cannot).
func (r *Reconciler) cancel(ctx context.Context, m *v1.Migration) {
	ep, err := r.Agents.Of(ctx, r.Client, m.Status.SourceNode)
	if err != nil {
		log.FromContext(ctx).Error(err, "cancel: the source node's agent")
		return
	}
	rep, err := agentclient.Cancel(ctx, ep, m.Status.JobID)
	if err != nil {
		log.FromContext(ctx).Error(err, "cancel", "job", m.Status.JobID)
		return
	}
	if !rep.Cancelled {
		log.FromContext(ctx).Info("cancel refused", "job", m.Status.JobID, "reason", rep.Reason)
	}
}

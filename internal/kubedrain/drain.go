// Package kubedrain empties a Kubernetes node the way ferry drain empties
// a host: it cordons the node, moves every pod ferry can move by a
// Migration each (ferry-controller does the moving), the smallest first,
// and evicts, as kubectl drain would, only the pods it cannot move, each
// with the reason.
package kubedrain

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/kubecontroller"
)

// What became of a pod.
const (
	Moved   = "moved"   // a Migration moved it; its replacement runs on TargetNode
	Evicted = "evicted" // it could not move (Reason); evicted as kubectl drain does
	Skipped = "skipped" // left where it is (a DaemonSet's or a static pod, or finished)
	Failed  = "failed"  // neither moved nor evicted: it still runs on the node
)

// AnnotationDrain on a Migration names the node whose drain made it.
const AnnotationDrain = "ferry.dev/drain"

// Options say which node to drain and how.
type Options struct {
	// Client reaches the cluster; its scheme knows ferry.dev/v1alpha1.
	Client client.Client
	Node   string
	// Mode, MaxDowntime and TargetNode go into every Migration's spec
	// (TargetNode "": each Migration's node is weighed by the controller).
	Mode        string
	MaxDowntime time.Duration
	TargetNode  string
	// Concurrency is how many Migrations run at once (default 1, as ferry
	// drain: on a small host more at once share the link and the CPU and
	// end no sooner).
	Concurrency int
	// NoEvict leaves the pods that cannot move where they are (reported
	// Failed) instead of evicting them.
	NoEvict bool
	// MigrationTimeout bounds each Migration (default 10 minutes), and
	// EvictionTimeout each eviction, retried while a disruption budget
	// forbids it (default 2 minutes).
	MigrationTimeout, EvictionTimeout time.Duration
	// Started and Finished, when set, hear of each pod (from several
	// goroutines when Concurrency is above 1).
	Started  func(p Pod)
	Finished func(p Pod)

	// poll is how often Migrations and pods are looked at, retry how
	// often a refused eviction is asked again (tests shorten them).
	poll, retry time.Duration
}

// Pod is what the drain did with one pod.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Outcome   string `json:"outcome"`
	// Reason says why a pod was evicted, skipped or failed.
	Reason string `json:"reason,omitempty"`
	// Migration names the Migration that moved it (or tried to);
	// TargetNode and TargetPod where it went.
	Migration  string      `json:"migration,omitempty"`
	TargetNode string      `json:"targetNode,omitempty"`
	TargetPod  string      `json:"targetPod,omitempty"`
	Report     *v1.Report  `json:"report,omitempty"`
	memory     int64       // requested, for the order
	pod        *corev1.Pod // as listed
	// evict: it is to be evicted (it cannot move, or its Migration ended
	// with the pod where it was).
	evict bool
}

// Result is a drain's outcome, every pod on the node in the order handled.
type Result struct {
	Node    string  `json:"node"`
	Pods    []Pod   `json:"pods"`
	TotalMs float64 `json:"totalMs"`
	// OK: no pod is left running on the node but those skipped.
	OK bool `json:"ok"`
}

func (o *Options) defaults() {
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.MigrationTimeout <= 0 {
		o.MigrationTimeout = 10 * time.Minute
	}
	if o.EvictionTimeout <= 0 {
		o.EvictionTimeout = 2 * time.Minute
	}
	if o.poll <= 0 {
		o.poll = 250 * time.Millisecond
	}
	if o.retry <= 0 {
		o.retry = 5 * time.Second
	}
}

// Run drains o.Node: it cordons it (so nothing new lands there, the
// replacements included), sorts its pods into those to skip, to move and
// to evict, moves the movable ones by Migrations, the smallest memory
// request first and Concurrency at a time, and evicts the rest, also the
// pods whose Migration failed. Run again after an interruption, it follows
// the Migrations already made (each is named after its pod's UID) rather
// than making second ones.
func Run(ctx context.Context, o Options) (Result, error) {
	o.defaults()
	start := time.Now()
	res := Result{Node: o.Node, Pods: []Pod{}}
	if o.TargetNode == o.Node && o.Node != "" {
		return res, fmt.Errorf("the target node %s is the node being drained", o.Node)
	}
	if err := Cordon(ctx, o.Client, o.Node, true); err != nil {
		return res, err
	}
	var list corev1.PodList
	if err := o.Client.List(ctx, &list, client.MatchingFields{"spec.nodeName": o.Node}); err != nil {
		return res, fmt.Errorf("list node %s's pods: %w", o.Node, err)
	}
	var move, evict []Pod
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName != o.Node { // a client that ignores field selectors
			continue
		}
		d := Pod{Namespace: p.Namespace, Name: p.Name, pod: p, memory: requested(p)}
		why, skip := skipped(p)
		unmovable := kubecontroller.Movable(p)
		switch {
		case skip:
			d.Outcome, d.Reason = Skipped, why
			res.Pods = append(res.Pods, d)
		case unmovable != nil:
			d.Reason, d.evict = "ferry cannot move it: it "+unmovable.Error(), true
			evict = append(evict, d)
		default:
			move = append(move, d)
		}
	}
	// The smallest first: each one moved frees the link and the CPU for
	// the others sooner (ferry drain's order; here by memory requested, what
	// the cluster knows of a pod's size).
	sort.SliceStable(move, func(i, j int) bool {
		if move[i].memory != move[j].memory {
			return move[i].memory < move[j].memory
		}
		return move[i].Namespace+"/"+move[i].Name < move[j].Namespace+"/"+move[j].Name
	})
	moved := make([]Pod, len(move))
	slots := make(chan struct{}, o.Concurrency)
	var wg sync.WaitGroup
	for i := range move {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			moved[i] = move[i]
			moved[i].Outcome, moved[i].Reason = Failed, "drain cancelled before its Migration: "+ctx.Err().Error()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if o.Started != nil {
				o.Started(move[i])
			}
			moved[i] = o.migrate(ctx, move[i])
			if moved[i].Outcome == Moved && o.Finished != nil {
				o.Finished(moved[i]) // as it ends; the others after their eviction
			}
		}()
	}
	wg.Wait()
	for _, d := range moved {
		if d.Outcome == Moved {
			res.Pods = append(res.Pods, d)
			continue
		}
		evict = append(evict, d)
	}
	for _, d := range evict {
		if d.evict {
			if o.Started != nil && d.Migration == "" {
				o.Started(d)
			}
			d = o.evict(ctx, d)
		}
		res.Pods = append(res.Pods, d)
		if o.Finished != nil {
			o.Finished(d)
		}
	}
	res.OK = true
	for _, d := range res.Pods {
		if d.Outcome == Failed {
			res.OK = false
		}
	}
	res.TotalMs = float64(time.Since(start)) / float64(time.Millisecond)
	return res, nil
}

// skipped says whether a pod stays where it is, and why: kubectl drain
// leaves them too (with --ignore-daemonsets).
func skipped(p *corev1.Pod) (string, bool) {
	if p.DeletionTimestamp != nil {
		return "being deleted already", true
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return "finished (" + string(p.Status.Phase) + ")", true
	}
	if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return "a static pod: its node's kubelet runs it from a file", true
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "DaemonSet" {
		return "a DaemonSet's pod: its DaemonSet runs one on every node", true
	}
	return "", false
}

// requested is a pod's memory request (its limit where it asks none).
func requested(p *corev1.Pod) int64 {
	var sum int64
	for _, c := range p.Spec.Containers {
		q := c.Resources.Requests.Memory()
		if q.IsZero() {
			q = c.Resources.Limits.Memory()
		}
		sum += q.Value()
	}
	return sum
}

// Cordon marks node unschedulable (on) or schedulable again; a node
// already so is left as it is.
func Cordon(ctx context.Context, c client.Client, node string, on bool) error {
	var n corev1.Node
	if err := c.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if n.Spec.Unschedulable == on {
		return nil
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Spec.Unschedulable = on
	if err := c.Patch(ctx, &n, patch); err != nil {
		return fmt.Errorf("cordon node %s (%v): %w", node, on, err)
	}
	return nil
}

// MigrationName is the Migration that moves pod: named after its UID, so
// that a drain run again finds the one it made.
func MigrationName(p *corev1.Pod) string {
	sum := sha256.Sum256([]byte(p.UID))
	name := "drain-" + hex.EncodeToString(sum[:4]) + "-" + p.Name
	if len(name) > 253 {
		name = strings.TrimRight(name[:253], "-.")
	}
	return name
}

// migrate moves d by a Migration (made, or found from a run before) and
// follows it to its end.
func (o *Options) migrate(ctx context.Context, d Pod) Pod {
	m := &v1.Migration{
		ObjectMeta: metav1.ObjectMeta{Name: MigrationName(d.pod), Namespace: d.Namespace,
			Annotations: map[string]string{AnnotationDrain: o.Node}},
		Spec: v1.MigrationSpec{PodName: d.Name, Mode: o.Mode, TargetNode: o.TargetNode},
	}
	if o.MaxDowntime > 0 {
		m.Spec.MaxDowntime = &metav1.Duration{Duration: o.MaxDowntime}
	}
	d.Migration = m.Name
	if err := o.Client.Create(ctx, m); err != nil && !apierrors.IsAlreadyExists(err) {
		d.Outcome, d.Reason = Failed, fmt.Sprintf("make Migration %s: %v", m.Name, err)
		return d
	}
	ctx, cancel := context.WithTimeout(ctx, o.MigrationTimeout)
	defer cancel()
	var got v1.Migration
	for {
		err := o.Client.Get(ctx, client.ObjectKeyFromObject(m), &got)
		if err == nil && v1.Final(got.Status.Phase) {
			break
		}
		select {
		case <-ctx.Done():
			// Not cancelled: a Migration left running ends as it would; the
			// pod is reported where it is now.
			d.Outcome, d.Reason = Failed, fmt.Sprintf("Migration %s did not end in %s (phase %q: %s); it goes on",
				m.Name, o.MigrationTimeout, got.Status.Phase, got.Status.Message)
			return d
		case <-time.After(o.poll):
		}
	}
	d.TargetNode, d.TargetPod, d.Report = got.Status.TargetNode, got.Status.TargetPod, got.Status.Report
	if got.Status.Phase != v1.PhaseSucceeded {
		// Not moved, so evicted (the pod runs on where it was, or is
		// gone): its Migration says why.
		d.Outcome, d.evict = Failed, true
		d.Reason = fmt.Sprintf("its Migration %s ended %s: %s", m.Name, got.Status.Phase, got.Status.Message)
		return d
	}
	// Moved says what is true: the source pod gone from the node, the
	// replacement running where the Migration says.
	if err := o.gone(ctx, d.pod); err != nil {
		d.Outcome, d.Reason = Failed, fmt.Sprintf("Migration %s succeeded but %v", m.Name, err)
		return d
	}
	var rp corev1.Pod
	if err := o.Client.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: got.Status.TargetPod}, &rp); err != nil {
		d.Outcome, d.Reason = Failed, fmt.Sprintf("Migration %s succeeded but its replacement pod %s: %v", m.Name, got.Status.TargetPod, err)
		return d
	}
	if rp.Spec.NodeName != got.Status.TargetNode || rp.Status.Phase != corev1.PodRunning {
		d.Outcome, d.Reason = Failed, fmt.Sprintf("Migration %s succeeded but its replacement pod %s is %s on %q", m.Name, rp.Name, rp.Status.Phase, rp.Spec.NodeName)
		return d
	}
	d.Outcome = Moved
	return d
}

// evict evicts d's pod through the Eviction API, as kubectl drain does
// (one a disruption budget forbids now is asked again every 5 s),
// unless NoEvict, and waits for the pod to be gone.
func (o *Options) evict(ctx context.Context, d Pod) Pod {
	d.evict = false
	if o.NoEvict {
		d.Outcome = Failed
		d.Reason += " (not evicted: --no-evict)"
		return d
	}
	ctx, cancel := context.WithTimeout(ctx, o.EvictionTimeout)
	defer cancel()
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace}}
	for {
		err := o.Client.SubResource("eviction").Create(ctx, d.pod, ev)
		if err == nil || apierrors.IsNotFound(err) {
			break
		}
		if !apierrors.IsTooManyRequests(err) {
			d.Outcome, d.Reason = Failed, d.Reason+"; eviction refused: "+err.Error()
			return d
		}
		select {
		case <-ctx.Done():
			d.Outcome, d.Reason = Failed, d.Reason+"; eviction still refused after "+o.EvictionTimeout.String()+": "+err.Error()
			return d
		case <-time.After(o.retry):
		}
	}
	if err := o.gone(ctx, d.pod); err != nil {
		d.Outcome, d.Reason = Failed, d.Reason+"; evicted, but "+err.Error()
		return d
	}
	d.Outcome = Evicted
	return d
}

// gone waits until pod (that UID) no longer exists.
func (o *Options) gone(ctx context.Context, pod *corev1.Pod) error {
	for {
		var p corev1.Pod
		err := o.Client.Get(ctx, client.ObjectKeyFromObject(pod), &p)
		if apierrors.IsNotFound(err) || (err == nil && p.UID != pod.UID) {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("pod " + pod.Name + " is still on node " + pod.Spec.NodeName)
		case <-time.After(o.poll):
		}
	}
}

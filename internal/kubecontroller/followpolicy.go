package kubecontroller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ferry-migrate/ferry/api"
	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/follow"
	"github.com/ferry-migrate/ferry/internal/model"
)

// FollowReconciler runs ferry follow's loop (package follow) for each
// FollowPolicy: the pod's node's agent samples its clients' latency, the
// policy weighs the other nodes, and a move is a Migration the policy
// owns, named after the move's ID, so that a restarted controller follows
// the same Migration instead of starting another. Where the pod runs and
// the move under way are kept in the policy's status.
type FollowReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Agents   Agents
	// Profile predicts each move (default: model.DefaultProfile).
	Profile *model.Profile

	mu    sync.Mutex
	loops map[types.NamespacedName]*followLoop
}

// followLoop is one policy's loop, running for one generation of it.
type followLoop struct {
	generation int64
	cancel     func()
	done       chan struct{}
}

// SetupWithManager registers the reconciler for FollowPolicies.
func (r *FollowReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1.FollowPolicy{}).Named("followpolicy").Complete(r)
}

// Reconcile starts the policy's loop, restarts it for a changed spec, and
// stops it for a suspended or deleted policy.
func (r *FollowReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var p v1.FollowPolicy
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		if apierrors.IsNotFound(err) {
			r.stop(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if p.Spec.Suspend || !p.DeletionTimestamp.IsZero() {
		r.stop(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	r.mu.Lock()
	l := r.loops[req.NamespacedName]
	r.mu.Unlock()
	if l != nil && l.generation == p.Generation {
		select {
		case <-l.done: // it ended (an error it reported): start again
		default:
			return ctrl.Result{}, nil
		}
	}
	r.stop(req.NamespacedName)
	cfg, err := r.config(ctx, &p)
	if err != nil {
		r.setMessage(ctx, req.NamespacedName, err.Error())
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}
	loop, err := follow.New(cfg)
	if err != nil {
		r.setMessage(ctx, req.NamespacedName, err.Error())
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}
	lctx, cancel := context.WithCancel(context.Background())
	l = &followLoop{generation: p.Generation, cancel: cancel, done: make(chan struct{})}
	r.mu.Lock()
	if r.loops == nil {
		r.loops = map[types.NamespacedName]*followLoop{}
	}
	r.loops[req.NamespacedName] = l
	r.mu.Unlock()
	go func() {
		defer close(l.done)
		if err := loop.Run(lctx); err != nil {
			log.FromContext(lctx).Error(err, "follow loop ended", "policy", req.NamespacedName)
			r.setMessage(context.Background(), req.NamespacedName, err.Error())
		}
	}()
	return ctrl.Result{}, nil
}

// stop ends a policy's loop and waits for it (a move under way is left
// to its Migration, which the next loop follows).
func (r *FollowReconciler) stop(key types.NamespacedName) {
	r.mu.Lock()
	l := r.loops[key]
	delete(r.loops, key)
	r.mu.Unlock()
	if l != nil {
		l.cancel()
		<-l.done
	}
}

// config is the loop of policy p: its pod, the nodes as hosts (each one's
// agent), its trigger, and the policy's status as the loop's state.
func (r *FollowReconciler) config(ctx context.Context, p *v1.FollowPolicy) (follow.Config, error) {
	key := client.ObjectKeyFromObject(p)
	pod, err := followedPod(ctx, r.Client, p)
	if err != nil {
		return follow.Config{}, err
	}
	if err := Movable(pod); err != nil {
		return follow.Config{}, fmt.Errorf("pod %s cannot follow its clients: it %v", pod.Name, err)
	}
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return follow.Config{}, err
	}
	ka := &kubeAgents{r: r, policy: p.DeepCopy(), peers: map[string]string{}}
	var hosts []follow.Host
	for _, n := range nodes.Items {
		if len(p.Spec.Nodes) > 0 && !slices.Contains(p.Spec.Nodes, n.Name) {
			continue
		}
		ep, err := r.Agents.Of(ctx, r.Client, n.Name)
		if err != nil {
			return follow.Config{}, err
		}
		peer := ep.Name + "@" + ep.Addr
		ka.peers[peer] = n.Name
		hosts = append(hosts, follow.Host{Name: n.Name, Peer: peer})
	}
	trig := follow.DefaultTrigger()
	setDuration(&trig.Threshold, p.Spec.Threshold)
	setDuration(&trig.Dwell, p.Spec.Dwell)
	setDuration(&trig.MinInterval, p.Spec.MinInterval)
	if p.Spec.Hysteresis != nil {
		trig.Hysteresis = *p.Spec.Hysteresis
	}
	interval := time.Second
	setDuration(&interval, p.Spec.Interval)
	var maxDowntime time.Duration
	setDuration(&maxDowntime, p.Spec.MaxDowntime)
	profile := model.DefaultProfile()
	if r.Profile != nil {
		profile = *r.Profile
	}
	return follow.Config{
		Container: key.String(), Runtime: "kubernetes", Hosts: hosts, At: pod.Spec.NodeName,
		Ports: p.Spec.Ports, Probe: p.Spec.Probe, Trigger: trig, MaxDowntime: maxDowntime, Interval: interval,
		Profile: profile, Store: &statusStore{r: r, key: key, at: pod.Spec.NodeName}, Agents: ka,
		Events: ka.event,
	}, nil
}

func setDuration(d *time.Duration, from *metav1.Duration) {
	if from != nil {
		*d = from.Duration
	}
}

// followedPod is the one running pod of p's selector, not being deleted.
func followedPod(ctx context.Context, c client.Client, p *v1.FollowPolicy) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(p.Namespace), client.MatchingLabels(p.Spec.Selector)); err != nil {
		return nil, err
	}
	var live []corev1.Pod
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodRunning && pod.Spec.NodeName != "" {
			live = append(live, pod)
		}
	}
	switch len(live) {
	case 1:
		return &live[0], nil
	case 0:
		return nil, fmt.Errorf("no running pod matches %v", p.Spec.Selector)
	default:
		names := make([]string, len(live))
		for i := range live {
			names[i] = live[i].Name
		}
		return nil, fmt.Errorf("%d running pods match %v (%s): a policy follows one pod", len(live), p.Spec.Selector, strings.Join(names, ", "))
	}
}

// FollowMigrationName is the Migration of a policy's move id.
func FollowMigrationName(policy, id string) string {
	name := "follow-" + policy + "-" + id
	if len(name) > 253 {
		name = "follow-" + policy[:253-len("follow--")-len(id)] + "-" + id
	}
	return name
}

// kubeAgents is the loop's agents in a cluster: assessments and
// reservations go to the nodes' agents, moves are Migrations.
type kubeAgents struct {
	r      *FollowReconciler
	policy *v1.FollowPolicy
	peers  map[string]string // agent peer address -> node
	// lastSample is when a sample's latency was last put in the status.
	lastSample time.Time
}

func (k *kubeAgents) endpoint(ctx context.Context, node string) (agentclient.Endpoint, error) {
	return k.r.Agents.Of(ctx, k.r.Client, node)
}

// Assess asks the pod's node's agent, the pod's container named by its
// current ID (each move makes a new pod).
func (k *kubeAgents) Assess(ctx context.Context, h follow.Host, q api.AssessQuery) (api.Assessment, error) {
	pod, err := followedPod(ctx, k.r.Client, k.policy)
	if err != nil {
		return api.Assessment{}, err
	}
	if pod.Spec.NodeName != h.Name {
		return api.Assessment{}, fmt.Errorf("pod %s runs on %s, not %s", pod.Name, pod.Spec.NodeName, h.Name)
	}
	if q.Container, err = containerID(pod, ""); err != nil {
		return api.Assessment{}, fmt.Errorf("pod %s %w", pod.Name, err)
	}
	q.Runtime = "kubernetes"
	ep, err := k.endpoint(ctx, h.Name)
	if err != nil {
		return api.Assessment{}, err
	}
	return agentclient.Assess(ctx, ep, q)
}

// Reserve asks h's agent to hold room.
func (k *kubeAgents) Reserve(ctx context.Context, h follow.Host, res api.Reservation) (api.ReserveReply, error) {
	ep, err := k.endpoint(ctx, h.Name)
	if err != nil {
		return api.ReserveReply{}, err
	}
	return agentclient.Reserve(ctx, ep, res)
}

// Migrate makes the move's Migration (or finds the one made before under
// the same ID) and follows it to its end. The room the target reserved
// under the move's ID is let go then: the Migration's job has its own.
func (k *kubeAgents) Migrate(ctx context.Context, h follow.Host, req api.Request) (api.Report, error) {
	target, ok := k.peers[req.To]
	if !ok {
		return api.Report{}, fmt.Errorf("no node's agent is %s", req.To)
	}
	key := types.NamespacedName{Namespace: k.policy.Namespace, Name: FollowMigrationName(k.policy.Name, req.ID)}
	var m v1.Migration
	err := k.r.Client.Get(ctx, key, &m)
	if apierrors.IsNotFound(err) {
		pod, perr := followedPod(ctx, k.r.Client, k.policy)
		if perr != nil {
			return api.Report{}, perr
		}
		m = v1.Migration{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{LabelFollowPolicy: k.policy.Name},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1.GroupVersion.String(), Kind: "FollowPolicy", Name: k.policy.Name, UID: k.policy.UID}}},
			Spec: v1.MigrationSpec{PodName: pod.Name, TargetNode: target, Mode: req.Mode},
		}
		if req.Precopy.MaxDowntime > 0 {
			m.Spec.MaxDowntime = &metav1.Duration{Duration: req.Precopy.MaxDowntime}
		}
		err = k.r.Client.Create(ctx, &m)
	}
	if err != nil {
		return api.Report{}, fmt.Errorf("the move's Migration %s: %w", key.Name, err)
	}
	defer func() {
		if ep, err := k.endpoint(context.Background(), target); err == nil {
			_, _ = agentclient.Reserve(context.Background(), ep, api.Reservation{ID: req.ID, Container: req.Container, Release: true})
		}
	}()
	for !v1.Final(m.Status.Phase) {
		select {
		case <-ctx.Done():
			return api.Report{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if err := k.r.Client.Get(ctx, key, &m); err != nil {
			return api.Report{}, fmt.Errorf("the move's Migration %s: %w", key.Name, err)
		}
	}
	rep := api.Report{ID: req.ID, OK: m.Status.Phase == v1.PhaseSucceeded, Container: m.Status.TargetPod, Mode: req.Mode}
	if r := m.Status.Report; r != nil {
		rep.Mode, rep.DowntimeMs, rep.TotalMs, rep.FrozenMs, rep.BytesSent = r.Mode, r.DowntimeMs, r.TotalMs, r.FrozenMs, r.BytesSent
	}
	if !rep.OK {
		rep.Error, rep.FailedAt = m.Status.Message, m.Status.Phase
	}
	return rep, nil
}

// LabelFollowPolicy on a Migration names the FollowPolicy that made it.
const LabelFollowPolicy = "ferry.dev/follow-policy"

// event puts what the loop did into the policy's status and events: each
// sample's latency at most every 10 s, decisions and moves at once.
func (k *kubeAgents) event(e follow.Event) {
	ctx := context.Background()
	key := client.ObjectKeyFromObject(k.policy)
	switch e.Kind {
	case "sample":
		if time.Since(k.lastSample) < 10*time.Second {
			return
		}
		k.lastSample = time.Now()
		k.r.patchStatus(ctx, key, func(s *v1.FollowPolicyStatus) { s.LatencyMs = e.LatencyMs })
		return
	case "decision":
		k.r.patchStatus(ctx, key, func(s *v1.FollowPolicyStatus) { s.LatencyMs, s.Decision, s.Message = e.LatencyMs, e.Message, "decided" })
	default:
		k.r.patchStatus(ctx, key, func(s *v1.FollowPolicyStatus) { s.Message = e.Kind + ": " + e.Message })
	}
	if k.r.Recorder != nil && e.Kind != "reserve" {
		kind := corev1.EventTypeNormal
		if e.Kind == "failed" || e.Kind == "error" {
			kind = corev1.EventTypeWarning
		}
		k.r.Recorder.Eventf(k.policy, nil, kind, "Follow"+strings.ToUpper(e.Kind[:1])+e.Kind[1:], "Follow", "%s", truncate(e.Message, 1000))
	}
}

// statusStore keeps a loop's state in its policy's status.
type statusStore struct {
	r   *FollowReconciler
	key types.NamespacedName
	// at is the node the pod runs on now, which a state with no move
	// pending gives way to (the pod was moved by someone else).
	at string
}

func (s *statusStore) String() string { return "FollowPolicy " + s.key.String() + "'s status" }

func (s *statusStore) Load() (follow.State, bool, error) {
	var p v1.FollowPolicy
	if err := s.r.Client.Get(context.Background(), s.key, &p); err != nil {
		return follow.State{}, false, err
	}
	st := p.Status
	if st.Node == "" {
		return follow.State{}, false, nil
	}
	out := follow.State{Container: s.key.String(), Host: st.Node, Moves: st.Moves}
	if st.LastMove != nil {
		out.LastMove = st.LastMove.Time
	}
	if pd := st.Pending; pd != nil {
		out.Pending = &follow.Pending{ID: pd.ID, From: pd.From, To: pd.To, Mode: pd.Mode, At: pd.At.Time}
	} else if s.at != "" {
		out.Host = s.at
	}
	return out, true, nil
}

func (s *statusStore) Save(st follow.State) error {
	var pod string
	var p v1.FollowPolicy
	if err := s.r.Client.Get(context.Background(), s.key, &p); err == nil {
		if fp, err := followedPod(context.Background(), s.r.Client, &p); err == nil {
			pod = fp.Name
		}
	}
	return s.r.patchStatusErr(context.Background(), s.key, func(out *v1.FollowPolicyStatus) {
		out.Node, out.Moves, out.Pending = st.Host, st.Moves, nil
		if pod != "" {
			out.Pod = pod
		}
		out.LastMove = nil
		if !st.LastMove.IsZero() {
			t := metav1.NewTime(st.LastMove)
			out.LastMove = &t
		}
		if pd := st.Pending; pd != nil {
			out.Pending = &v1.FollowPending{ID: pd.ID, From: pd.From, To: pd.To, Mode: pd.Mode, At: metav1.NewTime(pd.At),
				Migration: FollowMigrationName(s.key.Name, pd.ID)}
		}
	})
}

func (r *FollowReconciler) setMessage(ctx context.Context, key types.NamespacedName, msg string) {
	r.patchStatus(ctx, key, func(s *v1.FollowPolicyStatus) { s.Message = truncate(msg, 1000) })
}

func (r *FollowReconciler) patchStatus(ctx context.Context, key types.NamespacedName, change func(*v1.FollowPolicyStatus)) {
	if err := r.patchStatusErr(ctx, key, change); err != nil && !apierrors.IsNotFound(err) {
		log.FromContext(ctx).Error(err, "update FollowPolicy status", "policy", key)
	}
}

// patchStatusErr changes key's status, again on a conflict.
func (r *FollowReconciler) patchStatusErr(ctx context.Context, key types.NamespacedName, change func(*v1.FollowPolicyStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p v1.FollowPolicy
		if err := r.Client.Get(ctx, key, &p); err != nil {
			return err
		}
		change(&p.Status)
		return r.Client.Status().Update(ctx, &p)
	})
}

package kubedrain

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
)

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

// pod is a ReplicaSet's pod of one container asking memory, on nodeName.
func pod(name, nodeName, memory string, mods ...func(*corev1.Pod)) *corev1.Pod {
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "i",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func hostPath(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv"}}}}
}

func ownedBy(kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.OwnerReferences[0].Kind = kind }
}

// cluster is a fake API server with a fake ferry-controller: it moves a
// Migration's pod to n2 (the source deleted, a replacement running there),
// or fails the Migrations of the pods named in fail, and records the
// order in which Migrations came.
type cluster struct {
	client.Client
	fail  map[string]bool
	mu    sync.Mutex
	order []string
	stop  chan struct{}
	done  chan struct{}
	// gate holds the controller back until opened (by default at once).
	gate chan struct{}
	open func()
}

func newCluster(t *testing.T, fail []string, objs ...client.Object) *cluster {
	t.Helper()
	c := newClusterWith(t, fail, interceptor.Funcs{}, objs...)
	c.open()
	return c
}

func newClusterWith(t *testing.T, fail []string, fns interceptor.Funcs, objs ...client.Object) *cluster {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&v1.Migration{}).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
		WithInterceptorFuncs(fns).Build()
	cl := &cluster{Client: c, fail: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, f := range fail {
		cl.fail[f] = true
	}
	cl.gate = make(chan struct{})
	cl.open = sync.OnceFunc(func() { close(cl.gate) })
	go cl.control()
	t.Cleanup(func() { close(cl.stop); <-cl.done })
	return cl
}

func (c *cluster) control() {
	defer close(c.done)
	select {
	case <-c.gate:
	case <-c.stop:
		return
	}
	ctx := context.Background()
	seen := map[string]bool{}
	for {
		select {
		case <-c.stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		var ms v1.MigrationList
		if err := c.List(ctx, &ms); err != nil {
			continue
		}
		for i := range ms.Items {
			m := &ms.Items[i]
			if !seen[m.Name] {
				seen[m.Name] = true
				c.mu.Lock()
				c.order = append(c.order, m.Spec.PodName)
				c.mu.Unlock()
			}
			if v1.Final(m.Status.Phase) {
				continue
			}
			var src corev1.Pod
			if err := c.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.PodName}, &src); err != nil {
				continue
			}
			if c.fail[src.Name] {
				m.Status.Phase, m.Status.Message = v1.PhaseFailed, "the target agent refused: no room"
				_ = c.Status().Update(ctx, m)
				continue
			}
			target := m.Spec.TargetNode
			if target == "" {
				target = "n2"
			}
			rp := src.DeepCopy()
			rp.ResourceVersion, rp.UID = "", types.UID("uid-"+src.Name+"-r")
			rp.Name, rp.Spec.NodeName = src.Name+"-r", target
			if err := c.Create(ctx, rp); err != nil {
				continue
			}
			_ = c.Delete(ctx, &src)
			m.Status.Phase, m.Status.TargetNode, m.Status.TargetPod = v1.PhaseSucceeded, target, rp.Name
			m.Status.Report = &v1.Report{Mode: m.Spec.Mode, DowntimeMs: 42}
			_ = c.Status().Update(ctx, m)
		}
	}
}

func (c *cluster) migrations(t *testing.T) []v1.Migration {
	t.Helper()
	var ms v1.MigrationList
	if err := c.List(context.Background(), &ms); err != nil {
		t.Fatal(err)
	}
	return ms.Items
}

func outcomes(res Result) map[string]Pod {
	out := map[string]Pod{}
	for _, p := range res.Pods {
		out[p.Name] = p
	}
	return out
}

// A node's pods: the movable ones moved by Migrations, the smallest
// first; a hostPath pod and one whose Migration failed evicted, each with
// its reason; a DaemonSet's and a static pod skipped; the node cordoned;
// another node's pod untouched.
func TestDrainMovesEvictsAndSkips(t *testing.T) {
	static := pod("static", "n1", "10Mi", func(p *corev1.Pod) {
		p.OwnerReferences = nil
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
	})
	c := newCluster(t, []string{"refused"},
		node("n1"), node("n2"),
		pod("big", "n1", "512Mi"), pod("small", "n1", "64Mi"), pod("mid", "n1", "128Mi"),
		pod("disk", "n1", "32Mi", hostPath), pod("refused", "n1", "256Mi"),
		pod("agent", "n1", "16Mi", ownedBy("DaemonSet")), static,
		pod("other", "n2", "64Mi"))
	var started []string
	res, err := Run(context.Background(), Options{Client: c, Node: "n1", Mode: "precopy", MaxDowntime: 300 * time.Millisecond,
		poll: time.Millisecond, retry: time.Millisecond, Started: func(p Pod) { started = append(started, p.Name) }})
	if err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	if err := c.Get(context.Background(), types.NamespacedName{Name: "n1"}, &n); err != nil || !n.Spec.Unschedulable {
		t.Fatalf("node n1 not cordoned (%v)", err)
	}
	got := outcomes(res)
	want := map[string]string{"small": Moved, "mid": Moved, "big": Moved, "disk": Evicted, "refused": Evicted, "agent": Skipped, "static": Skipped}
	for name, outcome := range want {
		if got[name].Outcome != outcome {
			t.Errorf("%s: %s (%s), want %s", name, got[name].Outcome, got[name].Reason, outcome)
		}
	}
	if _, ok := got["other"]; ok || len(got) != len(want) {
		t.Errorf("pods handled: %v", got)
	}
	if !res.OK {
		t.Error("a drain that moved or evicted every pod is not OK")
	}
	if r := got["disk"].Reason; !strings.Contains(r, "hostPath") || got["disk"].Migration != "" {
		t.Errorf("the hostPath pod's reason %q, Migration %q", r, got["disk"].Migration)
	}
	if r := got["refused"].Reason; !strings.Contains(r, "no room") || !strings.Contains(r, "Failed") {
		t.Errorf("the refused pod's reason %q", r)
	}
	if p := got["mid"]; p.TargetNode != "n2" || p.TargetPod != "mid-r" || p.Report == nil || p.Report.DowntimeMs != 42 {
		t.Errorf("moved pod %+v", p)
	}
	c.mu.Lock()
	order := slices.Clone(c.order)
	c.mu.Unlock()
	if !slices.Equal(order, []string{"small", "mid", "refused", "big"}) {
		t.Errorf("Migrations made in the order %v, want the smallest first", order)
	}
	if !slices.Equal(started, []string{"small", "mid", "refused", "big", "disk"}) {
		t.Errorf("started %v", started)
	}
	for _, m := range c.migrations(t) {
		if m.Spec.Mode != "precopy" || m.Spec.MaxDowntime == nil || m.Spec.MaxDowntime.Duration != 300*time.Millisecond || m.Annotations[AnnotationDrain] != "n1" {
			t.Errorf("Migration %s: spec %+v, annotations %v", m.Name, m.Spec, m.Annotations)
		}
	}
	var left corev1.PodList
	if err := c.List(context.Background(), &left, client.MatchingFields{"spec.nodeName": "n1"}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range left.Items {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"agent", "static"}) {
		t.Errorf("left on n1: %v", names)
	}
}

// A drain run again after an interruption follows the Migration the first
// run made for a pod (same name, from the pod's UID) instead of making a
// second one.
func TestDrainFollowsTheMigrationARunBeforeMade(t *testing.T) {
	p := pod("web", "n1", "64Mi")
	earlier := &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: MigrationName(p), Namespace: "default"},
		Spec: v1.MigrationSpec{PodName: "web", Mode: "hybrid"}}
	// The controller goes on with the earlier Migration only once the
	// drain has listed the node's pods, as after an interrupted run.
	var c *cluster
	listed := interceptor.Funcs{List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		err := cl.List(ctx, list, opts...)
		if _, ok := list.(*corev1.PodList); ok {
			c.open()
		}
		return err
	}}
	c = newClusterWith(t, nil, listed, node("n1"), node("n2"), p, earlier)
	res, err := Run(context.Background(), Options{Client: c, Node: "n1", Mode: "precopy", poll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(res)["web"]; got.Outcome != Moved || got.Migration != earlier.Name {
		t.Fatalf("web: %+v", got)
	}
	if ms := c.migrations(t); len(ms) != 1 || ms[0].Spec.Mode != "hybrid" {
		t.Fatalf("Migrations %+v: a second one made", ms)
	}
}

// A disruption budget that refuses an eviction is asked again until it
// allows it; --no-evict leaves an unmovable pod running and the drain not
// OK; a target node that is the drained one is refused before anything.
func TestDrainEvictionRetriesAndNoEvict(t *testing.T) {
	refusals := 2
	fns := interceptor.Funcs{SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj client.Object, subObj client.Object, opts ...client.SubResourceCreateOption) error {
		if sub == "eviction" && refusals > 0 {
			refusals--
			return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 1)
		}
		return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
	}}
	c := newClusterWith(t, nil, fns, node("n1"), node("n2"), pod("disk", "n1", "32Mi", hostPath))
	c.open()
	res, err := Run(context.Background(), Options{Client: c, Node: "n1", poll: time.Millisecond, retry: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(res)["disk"]; got.Outcome != Evicted || refusals != 0 || !res.OK {
		t.Fatalf("disk: %+v after %d refusals left", got, refusals)
	}

	c = newCluster(t, nil, node("n1"), node("n2"), pod("disk", "n1", "32Mi", hostPath))
	res, err = Run(context.Background(), Options{Client: c, Node: "n1", NoEvict: true, poll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(res)["disk"]; got.Outcome != Failed || !strings.Contains(got.Reason, "--no-evict") || res.OK {
		t.Fatalf("disk with --no-evict: %+v, ok %v", got, res.OK)
	}
	var p corev1.Pod
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "disk"}, &p); err != nil {
		t.Fatalf("the pod left running is gone: %v", err)
	}

	if _, err := Run(context.Background(), Options{Client: c, Node: "n1", TargetNode: "n1"}); err == nil {
		t.Fatal("a target node that is the drained node was accepted")
	}
	if _, err := Run(context.Background(), Options{Client: c, Node: "n9"}); err == nil || !apierrors.IsNotFound(errors.Unwrap(err)) {
		t.Fatalf("a missing node: %v", err)
	}
}

package kubecontroller

import (
	"context"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/ferry-migrate/ferry/api"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/api/restoreshim"
)

const (
	testNS      = "default"
	testPod     = "web-7c9d8-x2x4p"
	testHash    = "7c9d8"
	testUID     = types.UID("0b5c1f4e-6d7a-4e0f-9a3b-2c1d0e9f8a7b")
	sourceNode  = "node-a"
	targetNode  = "node-b"
	saTokenVol  = "kube-api-access-x7k2p"
	migrationNm = "mv"
)

// testContainerID is a containerd ID as the pod's status gives it, without
// "containerd://".
var testContainerID = strings.Repeat("ab12", 16)

func newScheme(t *testing.T) *k8sruntime.Scheme {
	t.Helper()
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func newClient(t *testing.T, fns *interceptor.Funcs, objs ...client.Object) client.Client {
	t.Helper()
	b := fake.NewClientBuilder().WithScheme(newScheme(t)).WithStatusSubresource(&v1.Migration{}).WithObjects(objs...)
	if fns != nil {
		b = b.WithInterceptorFuncs(*fns)
	}
	return b.Build()
}

// node is a Ready, schedulable node with that allocatable memory and
// InternalIP; mods change it.
func node(name, mem, ip string, mods ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
			},
		},
	}
	if mem != "" {
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(mem)}
	}
	if ip != "" {
		n.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: name},
			{Type: corev1.NodeInternalIP, Address: ip},
		}
	}
	for _, m := range mods {
		m(n)
	}
	return n
}

func cordoned(n *corev1.Node) { n.Spec.Unschedulable = true }

func notReady(n *corev1.Node) {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = corev1.ConditionUnknown
		}
	}
}

func noReadyCondition(n *corev1.Node) { n.Status.Conditions = nil }

func ownedBy(kind, name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: kind, Name: name, UID: "owner-uid", Controller: new(true),
		}}
	}
}

// rsPod is a running pod of a Deployment's ReplicaSet on sourceNode, as
// the API server has it: the service account token's volume, an
// emptyDir, a kubectl annotation.
func rsPod(mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: testPod, Namespace: testNS, UID: "src-pod-uid",
			Labels: map[string]string{"app": "web", "pod-template-hash": testHash},
			Annotations: map[string]string{
				"kubectl.kubernetes.io/restartedAt":              "2024-05-01T10:00:00Z",
				"kubectl.kubernetes.io/default-container":        "web",
				"prometheus.io/scrape":                           "true",
				"controller.kubernetes.io/pod-deletion-cost":     "10",
				restoreshim.Annotation:                           "stale",
				"kubernetes.io/config.seen":                      "2024-05-01T10:00:00Z",
				"cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
			},
		},
		Spec: corev1.PodSpec{
			NodeName:           sourceNode,
			ServiceAccountName: "default",
			Containers: []corev1.Container{{
				Name: "web", Image: "nginx:1.27",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "data", MountPath: "/data"},
					{Name: "conf", MountPath: "/etc/web"},
					{Name: saTokenVol, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web"}}}},
				{Name: saTokenVol, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "web", ContainerID: "containerd://" + testContainerID,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			}},
		},
	}
	ownedBy("ReplicaSet", "web-"+testHash)(p)
	for _, m := range mods {
		m(p)
	}
	return p
}

func ferryRuntimeClass() *nodev1.RuntimeClass {
	return &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: RuntimeClass}, Handler: "ferry"}
}

func migration(mods ...func(*v1.Migration)) *v1.Migration {
	m := &v1.Migration{
		ObjectMeta: metav1.ObjectMeta{Name: migrationNm, Namespace: testNS, UID: testUID},
		Spec:       v1.MigrationSpec{PodName: testPod},
	}
	for _, f := range mods {
		f(m)
	}
	return m
}

// world is a cluster with the source and a target node, the ferry
// RuntimeClass, the pod, and the objects given (a Migration, others).
func world(t *testing.T, objs ...client.Object) (client.Client, *Reconciler) {
	t.Helper()
	base := []client.Object{
		node(sourceNode, "8Gi", "10.0.0.1"),
		node(targetNode, "8Gi", "10.0.0.2"),
		ferryRuntimeClass(),
		rsPod(),
	}
	c := newClient(t, nil, append(base, objs...)...)
	return c, &Reconciler{Client: c, Agents: Agents{Port: 7070}}
}

func reconcile(t *testing.T, r *Reconciler, name string) {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: testNS, Name: name}}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
}

func getMigration(t *testing.T, c client.Client, name string) *v1.Migration {
	t.Helper()
	var m v1.Migration
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: name}, &m); err != nil {
		t.Fatalf("get migration %s: %v", name, err)
	}
	return &m
}

// replacements are the pods labelled as migration name's replacement.
func replacements(t *testing.T, c client.Client, name string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := c.List(context.Background(), &pods, client.InNamespace(testNS), client.MatchingLabels{LabelMigration: name}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func podExists(t *testing.T, c client.Client, name string) bool {
	t.Helper()
	err := c.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: name}, &corev1.Pod{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func wantContains(t *testing.T, what, got string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(got, s) {
			t.Errorf("%s = %q, want it to contain %q", what, got, s)
		}
	}
}

func TestJobID(t *testing.T) {
	hex12 := regexp.MustCompile(`^[0-9a-f]{12}$`)
	uids := []types.UID{testUID, "0b5c1f4e-6d7a-4e0f-9a3b-2c1d0e9f8a7c", "x", ""}
	seen := map[string]types.UID{}
	for _, uid := range uids {
		id := JobID(uid)
		if !hex12.MatchString(id) {
			t.Errorf("JobID(%q) = %q, want 12 lowercase hex digits", uid, id)
		}
		if again := JobID(uid); again != id {
			t.Errorf("JobID(%q) = %q then %q: not deterministic", uid, id, again)
		}
		if other, ok := seen[id]; ok {
			t.Errorf("JobID(%q) = JobID(%q) = %q", uid, other, id)
		}
		seen[id] = uid
	}
}

func TestReplacementName(t *testing.T) {
	m := migration()
	suffix := "-" + JobID(testUID)[:6]
	if got := replacementName(rsPod(), m); got != testPod+suffix {
		t.Errorf("replacementName = %q, want %q", got, testPod+suffix)
	}
	long := rsPod(func(p *corev1.Pod) { p.Name = strings.Repeat("a", 60) })
	if got, want := replacementName(long, m), strings.Repeat("a", 50)+suffix; got != want {
		t.Errorf("replacementName of a 60-character name = %q, want %q", got, want)
	}
}

func TestMovable(t *testing.T) {
	vol := func(name string, src corev1.VolumeSource) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: src})
		}
	}
	bare := func(p *corev1.Pod) { p.OwnerReferences = nil }
	tests := []struct {
		name string
		mods []func(*corev1.Pod)
		want []string // substrings of the error; none: accepted
	}{
		{name: "bare pod", mods: []func(*corev1.Pod){bare}},
		{name: "ReplicaSet pod"},
		{name: "non-controller owner", mods: []func(*corev1.Pod){func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u"}}
		}}},
		{name: "StatefulSet pod", mods: []func(*corev1.Pod){ownedBy("StatefulSet", "db")}, want: []string{"StatefulSet db"}},
		{name: "DaemonSet pod", mods: []func(*corev1.Pod){ownedBy("DaemonSet", "agent")}, want: []string{"DaemonSet agent"}},
		{name: "Job pod", mods: []func(*corev1.Pod){ownedBy("Job", "backup")}, want: []string{"Job backup"}},
		{name: "init containers", mods: []func(*corev1.Pod){func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
		}}, want: []string{"init containers"}},
		{name: "host network", mods: []func(*corev1.Pod){func(p *corev1.Pod) { p.Spec.HostNetwork = true }}, want: []string{"host's network"}},
		{name: "emptyDir configMap secret projected downwardAPI", mods: []func(*corev1.Pod){
			vol("scratch", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}),
			vol("tls", corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls"}}),
			vol("info", corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{}}),
		}},
		{name: "hostPath", mods: []func(*corev1.Pod){
			vol("logs", corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/log"}}),
		}, want: []string{`volume "logs"`, "hostPath /var/log"}},
		// Checked against the target once it is known (TestSharedVolumes).
		{name: "persistentVolumeClaim", mods: []func(*corev1.Pod){
			vol("db", corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "db-0"}}),
		}},
		{name: "nfs", mods: []func(*corev1.Pod){
			vol("share", corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs", Path: "/x"}}),
		}, want: []string{`volume "share"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Movable(rsPod(tt.mods...))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("movable: %v, want accepted", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("movable accepted it, want an error containing %q", tt.want)
			}
			wantContains(t, "error", err.Error(), tt.want...)
		})
	}
}

func TestContainerID(t *testing.T) {
	status := func(name, id string, running bool) corev1.ContainerStatus {
		cs := corev1.ContainerStatus{Name: name, ContainerID: id}
		if running {
			cs.State.Running = &corev1.ContainerStateRunning{}
		} else {
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1}
		}
		return cs
	}
	two := func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar", Image: "envoy"})
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, status("sidecar", "containerd://ffff", true))
	}
	tests := []struct {
		name      string
		container string
		mods      []func(*corev1.Pod)
		want      string
		wantErr   []string
	}{
		{name: "the only container by default", want: testContainerID},
		{name: "named", container: "web", want: testContainerID},
		{name: "named, absent", container: "nope", wantErr: []string{`no container "nope"`}},
		{name: "not running", mods: []func(*corev1.Pod){func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{status("web", "containerd://"+testContainerID, false)}
		}}, wantErr: []string{"container web is not a running containerd container"}},
		{name: "not containerd", mods: []func(*corev1.Pod){func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{status("web", "cri-o://"+testContainerID, true)}
		}}, wantErr: []string{"not a running containerd container", "cri-o://"}},
		{name: "no status yet", mods: []func(*corev1.Pod){func(p *corev1.Pod) { p.Status.ContainerStatuses = nil }}, wantErr: []string{`no container "web"`}},
		{name: "several, none named", mods: []func(*corev1.Pod){two}, wantErr: []string{"has 2 containers"}},
		{name: "several, one named", container: "web", mods: []func(*corev1.Pod){two}, wantErr: []string{"has 2 containers"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := containerID(rsPod(tt.mods...), tt.container)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("containerID = %q, want an error containing %q", got, tt.wantErr)
				}
				wantContains(t, "error", err.Error(), tt.wantErr...)
				return
			}
			if err != nil {
				t.Fatalf("containerID: %v", err)
			}
			if got != tt.want {
				t.Errorf("containerID = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestReplacement(t *testing.T) {
	src := rsPod()
	m := migration(func(m *v1.Migration) {
		m.Status = v1.MigrationStatus{SourcePod: testPod, SourceNode: sourceNode, TargetNode: targetNode, TargetPod: "web-copy", ContainerID: testContainerID}
	})
	p := replacement(src, m)

	if p.Name != "web-copy" || p.Namespace != testNS {
		t.Errorf("replacement is %s/%s, want %s/web-copy", p.Namespace, p.Name, testNS)
	}
	if p.Spec.NodeName != targetNode {
		t.Errorf("nodeName = %q, want %q", p.Spec.NodeName, targetNode)
	}
	if p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != "ferry" {
		t.Errorf("runtimeClassName = %v, want ferry", p.Spec.RuntimeClassName)
	}
	if len(p.OwnerReferences) != 0 {
		t.Errorf("owner references = %v, want none", p.OwnerReferences)
	}
	wantLabels := map[string]string{"app": "web", LabelMigration: migrationNm}
	if !reflect.DeepEqual(p.Labels, wantLabels) {
		t.Errorf("labels = %v, want %v", p.Labels, wantLabels)
	}
	wantAnn := map[string]string{
		restoreshim.Annotation:                           testContainerID,
		"prometheus.io/scrape":                           "true",
		"kubernetes.io/config.seen":                      "2024-05-01T10:00:00Z",
		"cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
	}
	if !reflect.DeepEqual(p.Annotations, wantAnn) {
		t.Errorf("annotations = %v, want %v", p.Annotations, wantAnn)
	}
	var vols []string
	for _, v := range p.Spec.Volumes {
		vols = append(vols, v.Name)
	}
	if want := []string{"data", "conf"}; !reflect.DeepEqual(vols, want) {
		t.Errorf("volumes = %v, want %v", vols, want)
	}
	var mounts []string
	for _, vm := range p.Spec.Containers[0].VolumeMounts {
		mounts = append(mounts, vm.Name+":"+vm.MountPath)
	}
	if want := []string{"data:/data", "conf:/etc/web"}; !reflect.DeepEqual(mounts, want) {
		t.Errorf("volume mounts = %v, want %v", mounts, want)
	}
	if p.Spec.Containers[0].Image != "nginx:1.27" || p.Spec.ServiceAccountName != "default" {
		t.Errorf("the container or service account changed: %+v", p.Spec)
	}
	if p.Status.Phase != "" || len(p.Status.ContainerStatuses) != 0 {
		t.Errorf("the replacement carries the source's status: %+v", p.Status)
	}

	// The source is not changed.
	if src.Labels[labelTemplateHash] != testHash || len(src.Spec.Volumes) != 3 || src.Spec.NodeName != sourceNode ||
		src.Spec.RuntimeClassName != nil || len(src.Spec.Containers[0].VolumeMounts) != 3 {
		t.Errorf("replacement changed the source pod: %+v", src)
	}
}

func TestReplacementOfPodWithoutLabelsOrAnnotations(t *testing.T) {
	src := rsPod(func(p *corev1.Pod) { p.Labels, p.Annotations = nil, nil })
	m := migration(func(m *v1.Migration) { m.Status.TargetPod, m.Status.ContainerID = "web-copy", testContainerID })
	p := replacement(src, m)
	if !reflect.DeepEqual(p.Labels, map[string]string{LabelMigration: migrationNm}) {
		t.Errorf("labels = %v", p.Labels)
	}
	if !reflect.DeepEqual(p.Annotations, map[string]string{restoreshim.Annotation: testContainerID}) {
		t.Errorf("annotations = %v", p.Annotations)
	}
}

func TestReplacementDropsEphemeralContainers(t *testing.T) {
	src := rsPod(func(p *corev1.Pod) {
		p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox"}}}
	})
	m := migration(func(m *v1.Migration) { m.Status.TargetPod, m.Status.TargetNode = "web-copy", targetNode })
	if p := replacement(src, m); len(p.Spec.EphemeralContainers) != 0 {
		t.Errorf("the replacement has ephemeral containers %v: the API server refuses to create it", p.Spec.EphemeralContainers)
	}
}

func TestPickTarget(t *testing.T) {
	podOn := func(name, nodeName, mem string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "other"},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{
				{Name: "a", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(mem)}}},
				{Name: "b"}, // no request
			}},
			Status: corev1.PodStatus{Phase: phase},
		}
	}
	// b has the most allocatable memory but its pods request most of it;
	// c has the most left; d and e would have more but are cordoned, not
	// Ready; f has no Ready condition.
	cluster := []client.Object{
		node("a", "64Gi", "10.0.0.1"),
		node("b", "16Gi", "10.0.0.2"),
		node("c", "8Gi", "10.0.0.3"),
		node("d", "32Gi", "10.0.0.4", cordoned),
		node("e", "32Gi", "10.0.0.5", notReady),
		node("f", "32Gi", "10.0.0.6", noReadyCondition),
		podOn("big", "b", "10Gi", corev1.PodRunning),
		podOn("pending-here", "c", "1Gi", corev1.PodPending), // counts: it is bound to c
		podOn("done", "c", "6Gi", corev1.PodSucceeded),       // does not count
		podOn("failed", "c", "6Gi", corev1.PodFailed),        // does not count
		podOn("unbound", "", "6Gi", corev1.PodPending),       // does not count
	}
	source := rsPod(func(p *corev1.Pod) { p.Spec.NodeName = "a" })
	tests := []struct {
		name    string
		objs    []client.Object
		want    string // the target given
		got     string
		wantErr []string
	}{
		{name: "picks the most free memory", objs: cluster, got: "c"},
		{name: "given", objs: cluster, want: "b", got: "b"},
		{name: "given: the source", objs: cluster, want: "a", wantErr: []string{"target node a is the pod's own node"}},
		{name: "given: missing", objs: cluster, want: "zz", wantErr: []string{`no node "zz"`}},
		{name: "given: cordoned", objs: cluster, want: "d", wantErr: []string{"target node d is cordoned"}},
		{name: "given: not Ready", objs: cluster, want: "e", wantErr: []string{"target node e is not Ready"}},
		{name: "given: no Ready condition", objs: cluster, want: "f", wantErr: []string{"target node f has no Ready condition"}},
		{name: "equal free memory: by name", objs: []client.Object{
			node("a", "8Gi", ""), node("y", "4Gi", ""), node("x", "4Gi", ""), node("w", "2Gi", ""),
		}, got: "x"},
		{name: "none fit", objs: []client.Object{
			node("a", "64Gi", ""), node("d", "32Gi", "", cordoned), node("e", "32Gi", "", notReady),
		}, wantErr: []string{"no node to move pod " + testPod, "d is cordoned", "e is not Ready", "the source a excluded"}},
		{name: "the source alone", objs: []client.Object{node("a", "64Gi", "")}, wantErr: []string{"no node to move pod", "the source a excluded"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, nil, tt.objs...)
			r := &Reconciler{Client: c}
			got, why, err := r.pickTarget(context.Background(), source, tt.want, testContainerID, 0)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("pickTarget = %q, want an error containing %q", got, tt.wantErr)
				}
				wantContains(t, "error", err.Error(), tt.wantErr...)
				return
			}
			if err != nil {
				t.Fatalf("pickTarget: %v", err)
			}
			if got != tt.got {
				t.Errorf("pickTarget = %q, want %q", got, tt.got)
			}
			// No agent answers here: the pick by memory says so.
			if tt.want == "" && !strings.Contains(why, "could not weigh the nodes") {
				t.Errorf("pickTarget's reason %q does not say the policy could not weigh the nodes", why)
			}
		})
	}
}

func TestPickTargetOvercommittedNode(t *testing.T) {
	over := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hog", Namespace: "other"},
		Spec: corev1.PodSpec{NodeName: "b", Containers: []corev1.Container{{Name: "hog",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	c := newClient(t, nil, node("a", "8Gi", ""), node("b", "1Gi", ""), over)
	r := &Reconciler{Client: c}
	got, _, err := r.pickTarget(context.Background(), rsPod(func(p *corev1.Pod) { p.Spec.NodeName = "a" }), "", testContainerID, 0)
	if err == nil {
		if got != "b" {
			t.Errorf("pickTarget = %q, want b, the only candidate", got)
		}
		return
	}
	if msg := err.Error(); !strings.Contains(msg, "(b ") && !strings.Contains(msg, "; b ") {
		t.Errorf("pickTarget: %v: node b, Ready and schedulable, is neither picked nor said why not", err)
	}
}

func TestAgentsOf(t *testing.T) {
	tests := []struct {
		name     string
		node     *corev1.Node
		addr     string
		certName string
		wantErr  string
	}{
		{name: "InternalIP", node: node("n1", "", "10.0.0.7"), addr: "10.0.0.7:7070", certName: "n1"},
		{name: "IPv6 InternalIP", node: node("n1", "", "fd00::7"), addr: "[fd00::7]:7070", certName: "n1"},
		{name: "annotations", node: node("n1", "", "10.0.0.7", func(n *corev1.Node) {
			n.Annotations = map[string]string{AnnotationAgent: "agent.example:9000", AnnotationAgentName: "agent.example"}
		}), addr: "agent.example:9000", certName: "agent.example"},
		{name: "no address", node: node("n1", "", ""), wantErr: "node n1 has no InternalIP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, nil, tt.node)
			ep, err := Agents{Port: 7070}.Of(context.Background(), c, "n1")
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Of = %+v, want an error", ep)
				}
				wantContains(t, "error", err.Error(), tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ep.Addr != tt.addr || ep.Name != tt.certName || ep.Operator != nil {
				t.Errorf("Of = %+v, want address %s, name %s", ep, tt.addr, tt.certName)
			}
		})
	}
	if _, err := (Agents{Port: 7070}).Of(context.Background(), newClient(t, nil), "gone"); err == nil || !apierrors.IsNotFound(err) {
		t.Errorf("Of a missing node: %v, want a not-found error", err)
	}
}

func TestReconcileMissingMigration(t *testing.T) {
	_, r := world(t)
	reconcile(t, r, "nothing-here")
}

func TestReconcilePlans(t *testing.T) {
	c, r := world(t, migration())
	reconcile(t, r, migrationNm)

	m := getMigration(t, c, migrationNm)
	want := v1.MigrationStatus{
		Phase: v1.PhaseTargetPod, SourceNode: sourceNode, SourcePod: testPod, TargetNode: targetNode,
		TargetPod: testPod + "-" + JobID(testUID)[:6], ContainerID: testContainerID, JobID: JobID(testUID),
	}
	got := m.Status
	got.Message, got.TargetReason = "", ""
	if !reflect.DeepEqual(got, want) {
		t.Errorf("status = %+v\nwant     %+v", got, want)
	}
	wantContains(t, "message", m.Status.Message, testPod, testContainerID, sourceNode, targetNode)
	// No agent answers in this world: the node is picked by memory, and
	// the status says why.
	wantContains(t, "target reason", m.Status.TargetReason, "most memory not requested", "could not weigh the nodes")
	if !controllerutil.ContainsFinalizer(m, v1.Finalizer) {
		t.Errorf("finalizers = %v, want %s", m.Finalizers, v1.Finalizer)
	}
	if reps := replacements(t, c, migrationNm); len(reps) != 0 {
		t.Errorf("a replacement pod was made while checking: %v", reps[0].Name)
	}
}

func TestReconcileRefuses(t *testing.T) {
	tests := []struct {
		name string
		m    func(*v1.Migration)
		objs []client.Object // instead of world's
		want []string
	}{
		{name: "no pod", m: func(m *v1.Migration) { m.Spec.PodName = "x" }, want: []string{`no pod "x"`}},
		{name: "bad mode", m: func(m *v1.Migration) { m.Spec.Mode = "teleport" }, want: []string{`mode "teleport"`}},
		{name: "target is the source", m: func(m *v1.Migration) { m.Spec.TargetNode = sourceNode }, want: []string{"is the pod's own node"}},
		{name: "no RuntimeClass", objs: []client.Object{
			node(sourceNode, "8Gi", "10.0.0.1"), node(targetNode, "8Gi", "10.0.0.2"), rsPod(),
		}, want: []string{"RuntimeClass ferry"}},
		{name: "pod not running", objs: []client.Object{
			node(sourceNode, "8Gi", "10.0.0.1"), node(targetNode, "8Gi", "10.0.0.2"), ferryRuntimeClass(),
			rsPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
		}, want: []string{"is Pending, not running"}},
		{name: "StatefulSet pod", objs: []client.Object{
			node(sourceNode, "8Gi", "10.0.0.1"), node(targetNode, "8Gi", "10.0.0.2"), ferryRuntimeClass(),
			rsPod(ownedBy("StatefulSet", "db")),
		}, want: []string{"StatefulSet db"}},
		{name: "target's agent not found", objs: []client.Object{
			node(sourceNode, "8Gi", "10.0.0.1"), node(targetNode, "8Gi", ""), ferryRuntimeClass(), rsPod(),
		}, want: []string{"the target node's agent", "node-b has no InternalIP"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := migration()
			if tt.m != nil {
				tt.m(m)
			}
			var c client.Client
			var r *Reconciler
			if tt.objs != nil {
				c = newClient(t, nil, append(tt.objs, m)...)
				r = &Reconciler{Client: c, Agents: Agents{Port: 7070}}
			} else {
				c, r = world(t, m)
			}
			reconcile(t, r, migrationNm)
			got := getMigration(t, c, migrationNm)
			if got.Status.Phase != v1.PhaseFailed {
				t.Fatalf("phase = %q (%s), want Failed", got.Status.Phase, got.Status.Message)
			}
			wantContains(t, "message", got.Status.Message, tt.want...)
			if got.Status.TargetPod != "" || got.Status.JobID != "" {
				t.Errorf("a refused Migration has target pod %q, job %q", got.Status.TargetPod, got.Status.JobID)
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, "Ready")
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1.PhaseFailed {
				t.Errorf("Ready condition = %+v, want False, reason Failed", cond)
			}
			if pods := replacements(t, c, migrationNm); len(pods) != 0 {
				t.Errorf("a refused Migration made pod %s", pods[0].Name)
			}
			// Final: the next reconcile lets it go.
			reconcile(t, r, migrationNm)
			if got := getMigration(t, c, migrationNm); controllerutil.ContainsFinalizer(got, v1.Finalizer) || got.Status.Phase != v1.PhaseFailed {
				t.Errorf("after a final phase: finalizers %v, phase %s; want none, Failed", got.Finalizers, got.Status.Phase)
			}
		})
	}
}

func TestReconcileHold(t *testing.T) {
	c, r := world(t, migration(func(m *v1.Migration) { m.Spec.Hold = true }))
	reconcile(t, r, migrationNm) // checked: TargetPod
	for i := range 2 {
		reconcile(t, r, migrationNm) // the replacement, once
		m := getMigration(t, c, migrationNm)
		if m.Status.Phase != v1.PhaseTargetPod || !strings.HasPrefix(m.Status.Message, "held") {
			t.Fatalf("reconcile %d: phase %s, message %q; want TargetPod, held", i+2, m.Status.Phase, m.Status.Message)
		}
		reps := replacements(t, c, migrationNm)
		if len(reps) != 1 {
			t.Fatalf("reconcile %d: %d replacement pods, want 1", i+2, len(reps))
		}
		p := reps[0]
		if p.Name != m.Status.TargetPod || p.Spec.NodeName != targetNode || p.Annotations[restoreshim.Annotation] != testContainerID ||
			p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != RuntimeClass {
			t.Errorf("replacement %s on %s, restore %q, runtime class %v; want %s on %s, restore %s, ferry",
				p.Name, p.Spec.NodeName, p.Annotations[restoreshim.Annotation], p.Spec.RuntimeClassName, m.Status.TargetPod, targetNode, testContainerID)
		}
		wantContains(t, "message", m.Status.Message, p.Name, targetNode)
	}
	if !podExists(t, c, testPod) {
		t.Error("the source pod is gone while held")
	}
}

// held is a world whose Migration holds at TargetPod, its replacement
// made.
func held(t *testing.T) (client.Client, *Reconciler, *v1.Migration) {
	t.Helper()
	c, r := world(t, migration(func(m *v1.Migration) { m.Spec.Hold = true }))
	reconcile(t, r, migrationNm)
	reconcile(t, r, migrationNm)
	m := getMigration(t, c, migrationNm)
	if m.Status.Phase != v1.PhaseTargetPod || !podExists(t, c, m.Status.TargetPod) {
		t.Fatalf("phase %s (%s), replacement %s: want TargetPod and the replacement made", m.Status.Phase, m.Status.Message, m.Status.TargetPod)
	}
	return c, r, m
}

func TestReconcileCancelAtTargetPod(t *testing.T) {
	c, r, m := held(t)
	m.Spec.Cancel = true
	if err := c.Update(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	reconcile(t, r, migrationNm)
	got := getMigration(t, c, migrationNm)
	if got.Status.Phase != v1.PhaseAborted {
		t.Fatalf("phase = %s (%s), want Aborted", got.Status.Phase, got.Status.Message)
	}
	wantContains(t, "message", got.Status.Message, "cancelled")
	if podExists(t, c, m.Status.TargetPod) {
		t.Error("the replacement pod is left after the cancel")
	}
	if !podExists(t, c, testPod) {
		t.Error("the source pod is gone after the cancel")
	}
	reconcile(t, r, migrationNm)
	if got := getMigration(t, c, migrationNm); controllerutil.ContainsFinalizer(got, v1.Finalizer) {
		t.Errorf("finalizers = %v after Aborted, want none", got.Finalizers)
	}
}

func TestReconcileCancelledFromTheStart(t *testing.T) {
	c, r := world(t, migration(func(m *v1.Migration) { m.Spec.Cancel = true }))
	reconcile(t, r, migrationNm)
	reconcile(t, r, migrationNm)
	got := getMigration(t, c, migrationNm)
	if got.Status.Phase != v1.PhaseAborted {
		t.Fatalf("phase = %s (%s), want Aborted", got.Status.Phase, got.Status.Message)
	}
	if pods := replacements(t, c, migrationNm); len(pods) != 0 {
		t.Errorf("a cancelled Migration made pod %s", pods[0].Name)
	}
}

func TestReconcileDeletedAtTargetPod(t *testing.T) {
	c, r, m := held(t)
	if err := c.Delete(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if getMigration(t, c, migrationNm).DeletionTimestamp.IsZero() {
		t.Fatal("the finalizer did not hold the Migration")
	}
	reconcile(t, r, migrationNm)
	if podExists(t, c, m.Status.TargetPod) {
		t.Error("the replacement pod is left after the Migration's deletion")
	}
	if !podExists(t, c, testPod) {
		t.Error("the source pod is gone after the Migration's deletion")
	}
	err := c.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: migrationNm}, &v1.Migration{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the Migration is still there (%v): its finalizer was not removed", err)
	}
}

func TestReconcileReplacementFailed(t *testing.T) {
	c, r, m := held(t)
	var p corev1.Pod
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: m.Status.TargetPod}, &p); err != nil {
		t.Fatal(err)
	}
	p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "OutOfmemory", "Node didn't have enough resource"
	if err := c.Status().Update(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
	reconcile(t, r, migrationNm)
	got := getMigration(t, c, migrationNm)
	if got.Status.Phase != v1.PhaseFailed {
		t.Fatalf("phase = %s (%s), want Failed", got.Status.Phase, got.Status.Message)
	}
	wantContains(t, "message", got.Status.Message, "making the replacement pod", "OutOfmemory")
	if podExists(t, c, m.Status.TargetPod) {
		t.Error("the failed replacement pod is left")
	}
}

// switchWorld has a source pod, a replacement, and the Migration's status
// naming them; deletes records the source's annotations as it was deleted.
func switchWorld(t *testing.T, src, dst *corev1.Pod) (*Reconciler, *v1.Migration, *[]map[string]string) {
	t.Helper()
	var deletes []map[string]string
	fns := interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		if _, ok := obj.(*corev1.Pod); ok && obj.GetName() == src.Name {
			var cur corev1.Pod
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &cur); err == nil {
				deletes = append(deletes, cur.Annotations)
			}
		}
		return c.Delete(ctx, obj, opts...)
	}}
	c := newClient(t, &fns, src, dst)
	m := migration(func(m *v1.Migration) {
		m.Status = v1.MigrationStatus{Phase: v1.PhaseSwitching, SourcePod: src.Name, TargetPod: dst.Name, SourceNode: sourceNode, TargetNode: targetNode}
	})
	return &Reconciler{Client: c}, m, &deletes
}

func readyReplacement(ready bool) *corev1.Pod {
	p := replacement(rsPod(), migration(func(m *v1.Migration) {
		m.Status.TargetPod, m.Status.TargetNode, m.Status.ContainerID = "web-copy", targetNode, testContainerID
	}))
	p.Status.Phase = corev1.PodRunning
	if ready {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	return p
}

func TestSwitchOverReplicaSetPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, m, deletes := switchWorld(t, rsPod(), readyReplacement(true))
	if err := r.switchOver(ctx, m); err != nil {
		t.Fatalf("switchOver: %v", err)
	}
	var dst corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "web-copy"}, &dst); err != nil {
		t.Fatal(err)
	}
	if dst.Labels[labelTemplateHash] != testHash || dst.Labels["app"] != "web" {
		t.Errorf("replacement labels = %v, want %s=%s and app=web", dst.Labels, labelTemplateHash, testHash)
	}
	if podExists(t, r.Client, testPod) {
		t.Error("the source pod is still there")
	}
	if len(*deletes) != 1 {
		t.Fatalf("the source pod was deleted %d times, want once", len(*deletes))
	}
	if got := (*deletes)[0][annotationDelCost]; got != "-2147483648" {
		t.Errorf("the source's %s was %q when it was deleted, want -2147483648", annotationDelCost, got)
	}

	// Again (a retry, a restarted controller): nothing left to do.
	if err := r.switchOver(ctx, m); err != nil {
		t.Errorf("a second switchOver: %v", err)
	}
	if len(*deletes) != 1 {
		t.Errorf("a second switchOver deleted again")
	}
}

// A ReplicaSet's pod is handed over only to a Ready replacement: until
// then (here, until the context ends) nothing changes.
func TestSwitchOverWaitsForReadyReplacement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	r, m, deletes := switchWorld(t, rsPod(), readyReplacement(false))
	if err := r.switchOver(ctx, m); err == nil {
		t.Fatal("switchOver to a replacement that is not Ready succeeded")
	}
	var src, dst corev1.Pod
	bg := context.Background()
	if err := r.Client.Get(bg, types.NamespacedName{Namespace: testNS, Name: testPod}, &src); err != nil {
		t.Fatalf("the source pod: %v", err)
	}
	if err := r.Client.Get(bg, types.NamespacedName{Namespace: testNS, Name: "web-copy"}, &dst); err != nil {
		t.Fatal(err)
	}
	if len(*deletes) != 0 || src.Annotations[annotationDelCost] == lowestDeletionCost || dst.Labels[labelTemplateHash] != "" {
		t.Errorf("switchOver went on without a Ready replacement: deleted %d times, source cost %q, replacement labels %v",
			len(*deletes), src.Annotations[annotationDelCost], dst.Labels)
	}
}

func TestSwitchOverBarePod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bare := rsPod(func(p *corev1.Pod) {
		p.OwnerReferences = nil
		delete(p.Labels, labelTemplateHash)
		delete(p.Annotations, annotationDelCost)
	})
	// Not Ready: a bare pod's switch does not wait for it.
	r, m, deletes := switchWorld(t, bare, readyReplacement(false))
	if err := r.switchOver(ctx, m); err != nil {
		t.Fatalf("switchOver: %v", err)
	}
	if podExists(t, r.Client, testPod) || len(*deletes) != 1 {
		t.Errorf("the source pod is there (deleted %d times), want it deleted", len(*deletes))
	}
	if _, ok := (*deletes)[0][annotationDelCost]; ok {
		t.Errorf("a bare pod got %s", annotationDelCost)
	}
	var dst corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "web-copy"}, &dst); err != nil {
		t.Fatal(err)
	}
	if _, ok := dst.Labels[labelTemplateHash]; ok {
		t.Errorf("the replacement of a bare pod got %s: %v", labelTemplateHash, dst.Labels)
	}
}

func TestSwitchOverWithoutReplacement(t *testing.T) {
	c := newClient(t, nil, rsPod())
	r := &Reconciler{Client: c}
	m := migration(func(m *v1.Migration) { m.Status.SourcePod, m.Status.TargetPod = testPod, "web-copy" })
	err := r.switchOver(context.Background(), m)
	if err == nil {
		t.Fatal("switchOver without a replacement pod succeeded")
	}
	wantContains(t, "error", err.Error(), "the replacement pod")
	if !podExists(t, c, testPod) {
		t.Error("the source pod was deleted though no replacement runs")
	}
}

func TestSummary(t *testing.T) {
	tests := []struct {
		name string
		rep  api.Report
		want v1.Report
	}{
		{name: "empty", rep: api.Report{}, want: v1.Report{}},
		{
			name: "precopy",
			rep: api.Report{
				ID: "abc", Mode: api.ModePrecopy, OK: true, DowntimeMs: 87.5, TotalMs: 2400, FrozenMs: 12,
				BytesSent: 1 << 30, MemoryBytes: 512 << 20, RestoreMs: 40, SourceState: "removed",
				Rounds: []api.Round{{Index: 0}, {Index: 1}, {Index: 2}},
				Networks: []api.NetworkMove{
					{Network: api.Network{Name: "first"}, Outcome: "address kept"},
					{Network: api.Network{Name: "pod network"}, Outcome: "new address 10.1.2.3; 2 connections closed"},
				},
				Error: "after the commit: cleanup slow",
			},
			want: v1.Report{
				Mode: api.ModePrecopy, DowntimeMs: 87.5, TotalMs: 2400, FrozenMs: 12, BytesSent: 1 << 30, MemoryBytes: 512 << 20,
				Rounds: 3, SourceState: "removed", Network: "new address 10.1.2.3; 2 connections closed", Error: "after the commit: cleanup slow",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := summary(tt.rep)
			if got == nil || !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("summary = %+v\nwant      %+v", got, tt.want)
			}
		})
	}
}

func TestMovableRefusesAnEmptyDirsSubPath(t *testing.T) {
	p := &corev1.Pod{Spec: corev1.PodSpec{
		Volumes:    []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/d", SubPath: "x"}}}},
	}}
	if err := Movable(p); err == nil || !strings.Contains(err.Error(), `"data"`) || !strings.Contains(err.Error(), "subPath") {
		t.Errorf("movable with an emptyDir's subPath: %v", err)
	}
	p.Spec.Containers[0].VolumeMounts[0].SubPath = ""
	if err := Movable(p); err != nil {
		t.Errorf("movable with the emptyDir mounted whole: %v", err)
	}
}

// A liveness probe bounds how long the source may stay frozen: a probe
// begun at the freeze fails after its timeout, the kubelet restarting the
// container at the failureThreshold-th failure, as many periods later.
func TestLivenessTolerance(t *testing.T) {
	probe := func(timeout, period, failures int32) *corev1.Probe {
		return &corev1.Probe{TimeoutSeconds: timeout, PeriodSeconds: period, FailureThreshold: failures}
	}
	pod := func(cs ...corev1.Container) *corev1.Pod { return &corev1.Pod{Spec: corev1.PodSpec{Containers: cs}} }
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		ctr  string
		want time.Duration
	}{
		{"no probe", pod(corev1.Container{Name: "a"}), "", 0},
		{"the API's defaults", pod(corev1.Container{Name: "a", LivenessProbe: probe(0, 0, 0)}), "", 21 * time.Second},
		{"tight", pod(corev1.Container{Name: "a", LivenessProbe: probe(1, 1, 2)}), "", 2 * time.Second},
		{"the named container's", pod(corev1.Container{Name: "a", LivenessProbe: probe(1, 1, 1)}, corev1.Container{Name: "b", LivenessProbe: probe(5, 10, 3)}), "b", 25 * time.Second},
	} {
		if got := livenessTolerance(c.pod, c.ctr); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A persistent volume moves with its pod only as storage the target node
// shares at the same host path, mountable from two nodes at once; the
// reason names the volume otherwise.
func TestSharedVolumes(t *testing.T) {
	claim := func(name, pv string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv}, Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
	}
	hostPV := func(name string, modes []corev1.PersistentVolumeAccessMode, mods ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			AccessModes:            modes,
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/shared/" + name}}}}
		for _, m := range mods {
			m(pv)
		}
		return pv
	}
	rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	onlyNode := func(n string) func(*corev1.PersistentVolume) {
		return func(pv *corev1.PersistentVolume) {
			pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}}}}}
		}
	}
	labelled := func(n *corev1.Node) { n.Labels = map[string]string{"kubernetes.io/hostname": n.Name} }
	pod := rsPod(func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "db", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "db-0"}}})
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "db", MountPath: "/var/lib/db"})
	})
	for _, c := range []struct {
		name string
		objs []client.Object
		want []string // error substrings; none: shared at /var/lib/db
	}{
		{"a hostPath ReadWriteMany volume", []client.Object{claim("db-0", "pv-a", corev1.ClaimBound), hostPV("pv-a", rwx)}, nil},
		{"its affinity admits the target", []client.Object{claim("db-0", "pv-a", corev1.ClaimBound), hostPV("pv-a", rwx, onlyNode("node-b"))}, nil},
		{"its affinity is the source's", []client.Object{claim("db-0", "pv-a", corev1.ClaimBound), hostPV("pv-a", rwx, onlyNode("node-a"))},
			[]string{`volume "db"`, "pv-a", "does not admit the target node node-b"}},
		{"ReadWriteOnce", []client.Object{claim("db-0", "pv-a", corev1.ClaimBound), hostPV("pv-a", []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce})},
			[]string{`volume "db"`, "ReadWriteMany"}},
		{"another kind", []client.Object{claim("db-0", "pv-a", corev1.ClaimBound), hostPV("pv-a", rwx, func(pv *corev1.PersistentVolume) {
			pv.Spec.HostPath, pv.Spec.NFS = nil, &corev1.NFSVolumeSource{Server: "nfs", Path: "/x"}
		})}, []string{`volume "db"`, "another kind"}},
		{"a claim not bound", []client.Object{claim("db-0", "", corev1.ClaimPending)}, []string{`volume "db"`, "not bound"}},
		{"no claim", nil, []string{`volume "db"`, "db-0"}},
	} {
		objs := append([]client.Object{node("node-a", "8Gi", "10.0.0.1", labelled), node("node-b", "8Gi", "10.0.0.2", labelled)}, c.objs...)
		got, err := sharedVolumes(context.Background(), newClient(t, nil, objs...), pod, "", "node-b")
		if c.want == nil {
			if err != nil || len(got) != 1 || got[0].Path != "/var/lib/db" || got[0].PV != "pv-a" {
				t.Errorf("%s: %+v, %v; want shared at /var/lib/db", c.name, got, err)
			}
			continue
		}
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want an error containing %q", c.name, err, w)
			}
		}
	}
}

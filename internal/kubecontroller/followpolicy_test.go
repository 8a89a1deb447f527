package kubecontroller

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/follow"
)

func followClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(newScheme(t)).WithStatusSubresource(&v1.Migration{}, &v1.FollowPolicy{}).WithObjects(objs...).Build()
}

func policy() *v1.FollowPolicy {
	return &v1.FollowPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: testNS, UID: "policy-uid"},
		Spec: v1.FollowPolicySpec{Selector: map[string]string{"app": "web"}}}
}

// The loop's state lives in the policy's status: saved with a move
// pending (its Migration named), loaded back as it was; with no move
// pending, a pod found elsewhere than the status says wins.
func TestFollowStateInTheStatus(t *testing.T) {
	p := policy()
	c := followClient(t, p, rsPod())
	r := &FollowReconciler{Client: c}
	key := client.ObjectKeyFromObject(p)
	s := &statusStore{r: r, key: key, at: "n1"}
	if _, ok, err := s.Load(); ok || err != nil {
		t.Fatalf("a new policy has state (%v, %v)", ok, err)
	}
	at := time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC)
	want := follow.State{Container: key.String(), Host: "n1", Moves: 2, LastMove: at,
		Pending: &follow.Pending{ID: "0123456789ab", From: "n1", To: "n2", Mode: "precopy", At: at}}
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Load()
	if err != nil || !ok || got.Host != "n1" || got.Moves != 2 || !got.LastMove.Equal(at) || got.Pending == nil ||
		got.Pending.ID != want.Pending.ID || got.Pending.To != "n2" || got.Pending.Mode != "precopy" || !got.Pending.At.Equal(at) {
		t.Fatalf("loaded %+v (%v, %v), saved %+v", got, ok, err, want)
	}
	if err := c.Get(context.Background(), key, p); err != nil {
		t.Fatal(err)
	}
	if p.Status.Pending.Migration != FollowMigrationName("web", "0123456789ab") || p.Status.Pod != testPod {
		t.Errorf("status %+v", p.Status)
	}
	want.Pending = nil
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	s.at = "n3"
	if got, _, _ := s.Load(); got.Host != "n3" || got.Pending != nil {
		t.Errorf("with no move pending and the pod on n3: %+v", got)
	}
}

// A policy whose selector matches no pod, or several, says so in its
// status and is looked at again; a suspended one runs no loop.
func TestFollowPolicyNeedsOnePod(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		pods []client.Object
		want string
	}{
		{"none", nil, "no running pod matches"},
		{"two", []client.Object{rsPod(), rsPod(func(p *corev1.Pod) { p.Name, p.UID = "web-2", "uid-2" })}, "2 running pods match"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := policy()
			cl := followClient(t, append(c.pods, p, node("n1", "8Gi", "10.0.0.1"))...)
			r := &FollowReconciler{Client: cl, Agents: Agents{Port: 7070}}
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)})
			if err != nil || res.RequeueAfter == 0 {
				t.Fatalf("reconcile: %+v, %v", res, err)
			}
			if err := cl.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(p.Status.Message, c.want) {
				t.Errorf("status message %q, want %q", p.Status.Message, c.want)
			}
			if len(r.loops) != 0 {
				t.Error("a loop runs without its pod")
			}
		})
	}
	p := policy()
	p.Spec.Suspend = true
	r := &FollowReconciler{Client: followClient(t, p, rsPod())}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil || len(r.loops) != 0 {
		t.Fatalf("a suspended policy: %v, %d loops", err, len(r.loops))
	}
}

func TestFollowMigrationName(t *testing.T) {
	if n := FollowMigrationName("web", "0123456789ab"); n != "follow-web-0123456789ab" {
		t.Errorf("name %q", n)
	}
	long := strings.Repeat("x", 300)
	if n := FollowMigrationName(long, "0123456789ab"); len(n) > 253 || !strings.HasSuffix(n, "-0123456789ab") {
		t.Errorf("long name %q (%d)", n, len(n))
	}
}

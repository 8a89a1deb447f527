package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/kubecontroller"
	"github.com/ferry-migrate/ferry/internal/kubeworld"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// TestKubernetesFollowPolicy: a Deployment's pod with a FollowPolicy
// follows its client. The client (h3, measured by a probe from each
// node) is far from the pod's node (60 ms behind its delay line) and near
// the other (2 ms); after the dwell the controller moves the pod there by
// a Migration the policy owns, its memhog's state whole, the status
// saying where it runs; near its client, it stays.
func TestKubernetesFollowPolicy(t *testing.T) {
	w := upKubeWorldWith(t, lab.Options{DelayLines: true})
	ctx := context.Background()
	src := w.memhogDeployment(t, "follower", "32M")
	far, near := src.Spec.NodeName, "h1"
	if far == "h1" {
		near = "h2"
	}
	if err := w.Lab.SetRTT(far, 60*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := w.Lab.SetRTT(near, 2*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	dwell, interval := metav1.Duration{Duration: 2 * time.Second}, metav1.Duration{Duration: 500 * time.Millisecond}
	p := &v1.FollowPolicy{ObjectMeta: metav1.ObjectMeta{Name: "follower", Namespace: kubeworld.Namespace},
		Spec: v1.FollowPolicySpec{Selector: map[string]string{"app": "follower"}, Probe: w.Lab.Hosts[2].Addr, Dwell: &dwell, Interval: &interval}}
	if err := w.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Client.Delete(ctx, p) })
	var got v1.FollowPolicy
	waitFor(t, 3*time.Minute, "the pod moved near its client", func() (bool, error) {
		if err := w.Client.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
			return false, err
		}
		return got.Status.Moves == 1 && got.Status.Node == near && got.Status.Pending == nil,
			fmt.Errorf("status %+v", got.Status)
	})
	pods := w.pods(t, "follower")
	if len(pods) != 1 || pods[0].Spec.NodeName != near || pods[0].Name != got.Status.Pod {
		t.Fatalf("pods after the move: %v, status pod %s", kubeworld.PodNames(pods), got.Status.Pod)
	}
	var ms v1.MigrationList
	if err := w.Client.List(ctx, &ms, client.InNamespace(kubeworld.Namespace), client.MatchingLabels{kubecontroller.LabelFollowPolicy: p.Name}); err != nil {
		t.Fatal(err)
	}
	if len(ms.Items) != 1 || ms.Items[0].Status.Phase != v1.PhaseSucceeded || ms.Items[0].Status.TargetNode != near ||
		len(ms.Items[0].OwnerReferences) != 1 || ms.Items[0].OwnerReferences[0].UID != got.UID {
		t.Fatalf("the policy's Migrations: %+v", ms.Items)
	}
	if got.Status.Decision == "" {
		t.Error("no decision recorded in the status")
	}
	pr, _, err := bench.StartProbe(ctx, &w.Lab.Hosts[2], w.bin, []string{pods[0].Status.PodIP + ":" + memhogPort}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := pr.Stop(); err != nil || !st.StateOK || st.Answers == 0 {
		t.Errorf("the moved memhog: %+v %v", st, err)
	}
	t.Logf("moved %s -> %s: %s", far, near, got.Status.Decision)
	// Near its client now: no second move.
	time.Sleep(5 * time.Second)
	if err := w.Client.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Moves != 1 || got.Status.Node != near {
		t.Errorf("after settling near its client: %+v", got.Status)
	}
}

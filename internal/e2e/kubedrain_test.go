package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/kubedrain"
	"github.com/ferry-migrate/ferry/internal/kubeworld"
)

// TestKubernetesDrain: `ferry drain --kubernetes` empties a node: it is
// cordoned, its two Deployment pods move live to the other node (their
// memhogs' state whole there, their ReplicaSets owning the replacements),
// the smallest first, and a pod ferry cannot move (hostPath) is evicted
// with the reason; run again, it finds nothing to do and makes no second
// Migration.
func TestKubernetesDrain(t *testing.T) {
	w := upKubeWorld(t)
	ctx := context.Background()
	setUnschedulable := func(node string, on bool) {
		t.Helper()
		if err := kubedrain.Cordon(ctx, w.Client, node, on); err != nil {
			t.Fatal(err)
		}
	}
	// Everything starts on h1: h2 is cordoned meanwhile.
	setUnschedulable("h2", true)
	t.Cleanup(func() { setUnschedulable("h1", false); setUnschedulable("h2", false) })
	big := w.memhogDeployment(t, "drain-big", "64M")
	small := w.memhogDeployment(t, "drain-small", "32M")
	disk := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "drain-disk", Namespace: kubeworld.Namespace}, Spec: corev1.PodSpec{
		NodeName: "h1", TerminationGracePeriodSeconds: new(int64),
		Volumes: []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp"}}}},
		Containers: []corev1.Container{{Name: "memhog", Image: kubeworld.MemhogImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/memhog", "--memory", "4M"}, VolumeMounts: []corev1.VolumeMount{{Name: "h", MountPath: "/h"}}}}}}
	if _, err := w.Clientset.CoreV1().Pods(kubeworld.Namespace).Create(ctx, disk, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Clientset.CoreV1().Pods(kubeworld.Namespace).Delete(ctx, disk.Name, metav1.DeleteOptions{})
	})
	waitFor(t, time.Minute, "the hostPath pod running", func() (bool, error) {
		p, err := w.Clientset.CoreV1().Pods(kubeworld.Namespace).Get(ctx, disk.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})
	if big.Spec.NodeName != "h1" || small.Spec.NodeName != "h1" {
		t.Fatalf("the Deployments' pods run on %s and %s, not h1", big.Spec.NodeName, small.Spec.NodeName)
	}
	setUnschedulable("h2", false)

	drain := func() (kubedrain.Result, string) {
		t.Helper()
		// From the control plane's host: the API server's address is the
		// lab's. The target is named: weighing the nodes by their load
		// (TestKubernetesDeploymentPodMoves) is not this test's subject.
		cmd := w.Lab.Hosts[2].Command(ctx, w.bin, "drain", "--kubernetes", "h1", "--kubeconfig", w.Lab.Kubeconfig, "--mode", "precopy", "--target-node", "h2", "--json")
		out, err := cmd.Output()
		var stderr string
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		if err != nil {
			t.Fatalf("ferry drain --kubernetes: %v\n%s\n%s", err, out, stderr)
		}
		var res kubedrain.Result
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("ferry drain's JSON: %v\n%s", err, out)
		}
		return res, stderr
	}
	res, _ := drain()
	if !res.OK || len(res.Pods) != 3 {
		t.Fatalf("drain: %+v", res)
	}
	var n corev1.Node
	if err := w.Client.Get(ctx, client.ObjectKey{Name: "h1"}, &n); err != nil || !n.Spec.Unschedulable {
		t.Fatalf("h1 is not cordoned after the drain (%v)", err)
	}
	// The smallest first, then the bigger, then the eviction.
	for i, want := range []struct{ name, outcome string }{{small.Name, kubedrain.Moved}, {big.Name, kubedrain.Moved}, {disk.Name, kubedrain.Evicted}} {
		if p := res.Pods[i]; p.Name != want.name || p.Outcome != want.outcome {
			t.Errorf("pod %d: %s %s (%s), want %s %s", i, p.Name, p.Outcome, p.Reason, want.name, want.outcome)
		}
	}
	if r := res.Pods[2].Reason; !strings.Contains(r, "hostPath") {
		t.Errorf("the hostPath pod's reason: %q", r)
	}
	for _, p := range res.Pods[:2] {
		if p.TargetNode != "h2" || p.Report == nil || p.Report.Mode != "precopy" || p.Report.SourceState != "removed" {
			t.Errorf("%s moved: %+v (report %+v)", p.Name, p, p.Report)
			continue
		}
		app := map[string]string{big.Name: "drain-big", small.Name: "drain-small"}[p.Name]
		pods := w.pods(t, app)
		if len(pods) != 1 || pods[0].Name != p.TargetPod || pods[0].Spec.NodeName != "h2" {
			t.Fatalf("%s after the drain: %v", app, kubeworld.PodNames(pods))
		}
		if ref := metav1.GetControllerOf(&pods[0]); ref == nil || ref.Kind != "ReplicaSet" {
			t.Errorf("%s: the replacement's controller is %v, want its ReplicaSet", app, ref)
		}
		pr, _, err := bench.StartProbe(ctx, &w.Lab.Hosts[2], w.bin, []string{pods[0].Status.PodIP + ":" + memhogPort}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := pr.Stop(); err != nil || !st.StateOK || st.Answers == 0 {
			t.Errorf("%s's memhog on h2: %+v %v", app, st, err)
		}
		t.Logf("%s -> %s: downtime %.0f ms, total %.0f ms", p.Name, p.TargetPod, p.Report.DowntimeMs, p.Report.TotalMs)
	}
	if _, err := w.Clientset.CoreV1().Pods(kubeworld.Namespace).Get(ctx, disk.Name, metav1.GetOptions{}); err == nil {
		t.Error("the evicted hostPath pod is still there")
	}

	// Again: nothing left to do, and no second Migration.
	res, _ = drain()
	if !res.OK || len(res.Pods) != 0 {
		t.Errorf("the second drain: %+v", res)
	}
	var ms v1.MigrationList
	if err := w.Client.List(ctx, &ms, client.InNamespace(kubeworld.Namespace)); err != nil {
		t.Fatal(err)
	}
	if len(ms.Items) != 2 {
		t.Errorf("%d Migrations after two drains, want 2", len(ms.Items))
	}
}

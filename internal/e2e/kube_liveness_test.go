package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/kubeworld"
)

// TestKubernetesLivenessBoundsTheFreeze: a pod whose liveness probe
// restarts its container after 2 s of silence is not frozen longer. Cold,
// predicted to hold 384 MiB frozen for longer, is refused before the
// freeze, the reason naming the bound and the modes that fit, and the
// pod runs on untouched; pre-copy, whose switchover fits, moves it, and
// the moved container is not restarted by its probe.
func TestKubernetesLivenessBoundsTheFreeze(t *testing.T) {
	w := upKubeWorld(t)
	ctx := context.Background()
	const name, echo = "memhog-probed", 7001
	d := kubeworld.MemhogDeployment(name, "384M", 200, memhogPortNum)
	c := &d.Spec.Template.Spec.Containers[0]
	c.Command = append(c.Command, "--echo-port", "7001")
	c.LivenessProbe = &corev1.Probe{
		ProbeHandler:   corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(echo)}},
		TimeoutSeconds: 1, PeriodSeconds: 1, FailureThreshold: 2,
	}
	src, err := w.Run(ctx, d)
	t.Cleanup(func() { _ = w.DeleteDeployment(context.Background(), name) })
	if err != nil {
		t.Fatal(err)
	}

	m := w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "probed-cold"}, Spec: v1.MigrationSpec{PodName: src.Name, Mode: "cold", TargetNode: other(src.Spec.NodeName)}}, nil)
	if m.Status.MaxFrozenMs != 2000 {
		t.Errorf("status.maxFrozenMs %d, want 2000 (timeout 1 s + 1 period of 1 s)", m.Status.MaxFrozenMs)
	}
	if m.Status.Phase != v1.PhaseFailed || !strings.Contains(m.Status.Message, "longer than the 2s it may stay frozen") ||
		!strings.Contains(m.Status.Message, "precopy") || !strings.Contains(m.Status.Message, "never frozen") {
		t.Fatalf("cold: %s: %s; want Failed, the 2 s bound named and pre-copy offered", m.Status.Phase, m.Status.Message)
	}
	t.Logf("cold refused: %s", m.Status.Message)
	w.checkUntouched(t, src)

	m = w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "probed-precopy"}, Spec: v1.MigrationSpec{PodName: src.Name, Mode: "precopy", TargetNode: other(src.Spec.NodeName)}}, nil)
	if m.Status.Phase != v1.PhaseSucceeded {
		t.Fatalf("precopy: %s: %s", m.Status.Phase, m.Status.Message)
	}
	// The moved container answers its probe: a few periods later it has
	// not been restarted.
	time.Sleep(5 * time.Second)
	pods := w.pods(t, name)
	if len(pods) != 1 || pods[0].Name != m.Status.TargetPod {
		t.Fatalf("pods after the move: %v", kubeworld.PodNames(pods))
	}
	if st := pods[0].Status.ContainerStatuses; len(st) != 1 || st[0].RestartCount != 0 || st[0].State.Running == nil {
		t.Fatalf("the moved container: %+v", st)
	}
	rep := m.Status.Report
	t.Logf("precopy within the bound: downtime %.0f ms, total %.0f ms", rep.DowntimeMs, rep.TotalMs)
}

// other is the lab cluster's other node (named, so that the move does not
// depend on the machine's load: the cost model's idle cores).
func other(node string) string {
	if node == "h1" {
		return "h2"
	}
	return "h1"
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/bench"
)

// TestKubernetesInstalledFromManifests: ferry installed as a cluster
// operator installs it, from deploy/kubernetes's kustomization (the
// agents' DaemonSet, the controller's Deployment) with the ConfigMap and
// Secrets its docs ask for, in place of the lab's processes. Each node's
// agent runs in its pod but works in the node's mount namespace, outside
// the pod's cgroups; the controller, in its pod, reaches the API server
// through Service kubernetes and the agents at the nodes' addresses; a
// Deployment's pod moves pre-copy through them, its state whole; and
// deleting the DaemonSet ends the agents.
func TestKubernetesInstalledFromManifests(t *testing.T) {
	w := upKubeWorld(t)
	ctx := context.Background()
	d, err := w.Deploy(ctx, w.bin)
	if d != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(d.Logs(40))
			}
			if err := d.Remove(ctx); err != nil {
				t.Errorf("remove the deployed ferry: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	ourMnt, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range w.Lab.Hosts[:2] {
		pid := d.AgentPIDs[h.Name]
		if mnt, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); mnt != ourMnt {
			t.Errorf("%s: agent %d in mount namespace %s, not the node's (%s)", h.Name, pid, mnt, ourMnt)
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		want := "/" + filepath.Join(h.CgroupParent, "ferry-agent")
		for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
			if !strings.HasSuffix(line, ":"+want) {
				t.Errorf("%s: agent %d still in its pod's cgroup: %s", h.Name, pid, line)
			}
		}
		args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !strings.Contains(string(args), "--in-pod") {
			t.Errorf("%s: the control socket's server (pid %d) is not the pod's agent: %q", h.Name, pid, args)
		}
	}

	src := w.memhogDeployment(t, "memhog-installed", "64M")
	m := w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "installed"}, Spec: v1.MigrationSpec{PodName: src.Name, Mode: "precopy"}}, nil)
	if m.Status.Phase != v1.PhaseSucceeded {
		t.Fatalf("Migration ended %s: %s", m.Status.Phase, m.Status.Message)
	}
	pods := w.pods(t, "memhog-installed")
	if len(pods) != 1 || pods[0].Name != m.Status.TargetPod || pods[0].Spec.NodeName == src.Spec.NodeName || pods[0].Status.PodIP == "" {
		t.Fatalf("pods after the move: %v", pods)
	}
	p, _, err := bench.StartProbe(ctx, &w.Lab.Hosts[2], w.bin, []string{pods[0].Status.PodIP + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	res, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if !res.StateOK || res.Answers == 0 {
		t.Errorf("probe %+v: the moved memhog's state is not whole", res)
	}
	rep := m.Status.Report
	t.Logf("installed from the manifests: pod %s (%s) -> %s (%s): downtime %.0f ms, total %.0f ms",
		src.Name, src.Spec.NodeName, m.Status.TargetPod, m.Status.TargetNode, rep.DowntimeMs, rep.TotalMs)
}

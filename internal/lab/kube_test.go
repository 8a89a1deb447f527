package lab

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ferry-migrate/ferry/internal/kubelab"
)

// TestLabWithKubernetes: a lab brought up with Kubernetes has h1 and h2 as
// Ready nodes and the admin's kubeconfig recorded; Down takes the cluster
// with it, no process of its binaries left. (The cluster itself, pods
// across nodes and a crash of its caller, is internal/kubelab's test.)
func TestLabWithKubernetes(t *testing.T) {
	needLabHost(t)
	if err := kubelab.CheckCache(kubelab.Config{}); err != nil {
		t.Skipf("the Kubernetes lab's binaries are not built (scripts/kube-build.sh, run by make test's setup): %v", err)
	}
	if _, err := Up(context.Background(), Options{Hosts: 2, Kubernetes: true, NoAgents: true}); err == nil || !strings.Contains(err.Error(), "3 hosts at least") {
		t.Fatalf("a 2-host lab with Kubernetes: %v", err)
	}
	l := upLab(t, Options{Hosts: 3, Kubernetes: true, NoAgents: true})
	if saved, err := Load(); err != nil || saved.Kubeconfig != l.Kubeconfig || l.Kubeconfig == "" {
		t.Fatalf("kubeconfig %q, saved %+v %v", l.Kubeconfig, saved, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// The apiserver listens in h3's namespace, at h3's address.
	cfg.Dial = kubelab.Dialer(l.Hosts[2].NetNS)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ready []string
	nodes, err := cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err == nil {
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready = append(ready, n.Name)
				}
			}
		}
	}
	slices.Sort(ready)
	if err != nil || !slices.Equal(ready, []string{"h1", "h2"}) {
		t.Fatalf("ready nodes %v, %v; want h1 and h2", ready, err)
	}
	if err := Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(KubeDir); err == nil {
		t.Errorf("%s left", KubeDir)
	}
	// By executable, not name: the machine's own containerd may run.
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && strings.HasPrefix(exe, kubelab.DefaultCache+"/") {
			t.Errorf("process %s (%s) still runs", e.Name(), exe)
		}
	}
}

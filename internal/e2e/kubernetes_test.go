package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/kubecontroller"
	"github.com/ferry-migrate/ferry/internal/kubelab"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/pki"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
	kuberuntime "github.com/ferry-migrate/ferry/internal/runtime/kubernetes"
)

// kubeWorld is the lab's cluster with ferry installed: the CRD, the
// controller (in h3's namespace, beside the control plane), memhog's
// image on both nodes, the agents of h1 and h2 serving the kubelets'
// containerds.
type kubeWorld struct {
	l      *lab.Lab
	cs     kubernetes.Interface
	c      client.Client
	bin    string // ferry
	ctlLog string
	// The controller's binary, its operator certificate's directory and
	// its process.
	ctlBin, tls string
	ctl         procs.Started
}

const memhogImage = "localhost/memhog:1"

func upKubeWorld(t *testing.T) *kubeWorld {
	t.Helper()
	requireLab(t)
	if err := kubelab.CheckCache(kubelab.Config{}); err != nil {
		t.Skipf("the Kubernetes lab's binaries are not built (scripts/kube-build.sh, run by make test's setup): %v", err)
	}
	bin := ferryBin(t)
	ctlBin := filepath.Join(filepath.Dir(bin), "ferry-controller")
	build := exec.Command("go", "build", "-o", ctlBin, "./cmd/ferry-controller")
	build.Dir, build.Env = "../..", append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build ferry-controller: %v\n%s", err, out)
	}
	l := upLabWith(t, lab.Options{Hosts: 3, FerryBin: bin, Kubernetes: true})
	cl, err := l.Kubernetes()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := cl.ImportBinary(ctx, memhogImage, filepath.Join(filepath.Dir(bin), "memhog")); err != nil {
		t.Fatal(err)
	}
	installCRD(t, cl)
	ctrllog.SetLogger(logr.Discard())
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1.AddToScheme(scheme)
	c, err := client.New(cl.RESTConfig(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	tls := t.TempDir()
	if err := pki.IssueOperator(lab.PKIDir, tls, "ferry-controller", time.Hour); err != nil {
		t.Fatal(err)
	}
	w := &kubeWorld{l: l, cs: cl.Client(), c: c, bin: bin, ctlLog: filepath.Join(t.TempDir(), "controller.log"), ctlBin: ctlBin, tls: tls}
	w.startController(t)
	t.Cleanup(func() {
		w.stopController()
		if t.Failed() {
			b, _ := os.ReadFile(w.ctlLog)
			t.Logf("controller log:\n%s", tailLines(string(b), 60))
			for _, h := range w.l.Hosts[:2] {
				b, _ := os.ReadFile(filepath.Join(h.StateDir, "agent.log"))
				t.Logf("agent %s log:\n%s", h.Name, tailLines(string(b), 30))
			}
		}
	})
	return w
}

// installCRD applies deploy/kubernetes/crd.yaml as a user would and waits
// until it is served.
func installCRD(t *testing.T, cl *kubelab.Cluster) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatalf("crd.yaml: %v", err)
	}
	ax, err := apiextclient.NewForConfig(cl.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := ax.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the Migration CRD established", func() (bool, error) {
		got, err := ax.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// startController runs ferry-controller in h3's namespace (killed by
// PID when the test ends; its log shown if the test failed).
func (w *kubeWorld) startController(t *testing.T) {
	t.Helper()
	p, err := procs.StartDetached([]string{w.ctlBin, "--kubeconfig", w.l.Kubeconfig, "--tls-dir", w.tls, "--operator", "ferry-controller"},
		w.l.Hosts[2].NetNS, w.ctlLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.ctl = p
}

// stopController kills the controller, as a crash would.
func (w *kubeWorld) stopController() {
	if w.ctl.PID > 0 {
		_ = syscall.Kill(w.ctl.PID, syscall.SIGKILL)
		<-w.ctl.Exited
		w.ctl = procs.Started{}
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		done, err := ok()
		if done {
			return
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("waiting %v for %s: %v", d, what, last)
}

// memhogDeployment runs one memhog pod and returns it once Running.
func (w *kubeWorld) memhogDeployment(t *testing.T, name, memory string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	one, never, noToken := int32(1), corev1.PullNever, false
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken:  &noToken,
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "memhog", Image: memhogImage, ImagePullPolicy: never,
						Command: []string{"/memhog", "--memory", memory, "--dirty-rate", "200", "--port", memhogPort},
					}},
				},
			},
		},
	}
	if _, err := w.cs.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.cs.AppsV1().Deployments("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	var pod *corev1.Pod
	waitFor(t, 2*time.Minute, "the Deployment's pod running", func() (bool, error) {
		pods := w.pods(t, name)
		if len(pods) == 1 && pods[0].Status.Phase == corev1.PodRunning && pods[0].Status.PodIP != "" {
			pod = &pods[0]
			return true, nil
		}
		return false, fmt.Errorf("%d pods", len(pods))
	})
	return pod
}

// pods lists app's pods that are not being deleted.
func (w *kubeWorld) pods(t *testing.T, app string) []corev1.Pod {
	t.Helper()
	list, err := w.cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// migrate makes a Migration and waits for its end.
func (w *kubeWorld) migrate(t *testing.T, m *v1.Migration, watch func(*v1.Migration)) *v1.Migration {
	t.Helper()
	ctx := context.Background()
	m.Namespace = "default"
	if err := w.c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	var got v1.Migration
	waitFor(t, 4*time.Minute, "Migration "+m.Name+" to end", func() (bool, error) {
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(m), &got); err != nil {
			return false, err
		}
		if watch != nil {
			watch(&got)
		}
		return v1.Final(got.Status.Phase), fmt.Errorf("phase %q: %s", got.Status.Phase, got.Status.Message)
	})
	return &got
}

// TestKubernetesDeploymentPodMoves: a Deployment's memhog pod moves to
// the other node, driven by a Migration through ferry's controller, in
// each mode: its state checked whole, the client's downtime measured
// through the pod network, the ReplicaSet owning the replacement and never
// more or fewer pods than asked.
func TestKubernetesDeploymentPodMoves(t *testing.T) {
	w := upKubeWorld(t)
	for i, mode := range []string{"precopy", "cold", "postcopy", "hybrid"} {
		name := fmt.Sprintf("memhog-%s", mode)
		src := w.memhogDeployment(t, name, "64M")
		var p *bench.ProbeProc
		// Held until the replacement has an address: the probe polls both
		// before anything is frozen.
		m := w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("m%d", i)}, Spec: v1.MigrationSpec{PodName: src.Name, Mode: mode, Hold: true}},
			func(m *v1.Migration) {
				if p != nil || !strings.HasPrefix(m.Status.Message, "held") {
					return
				}
				ip := w.sandboxAddress(t, m.Status.TargetNode, m.Status.TargetPod)
				var err error
				p, _, err = bench.StartProbe(context.Background(), &w.l.Hosts[2], w.bin,
					[]string{src.Status.PodIP + ":" + memhogPort, ip + ":" + memhogPort}, time.Minute)
				if err != nil {
					t.Fatalf("probe: %v", err)
				}
				time.Sleep(300 * time.Millisecond) // answers before the freeze
				w.release(t, m)
			})
		if m.Status.Phase != v1.PhaseSucceeded {
			t.Fatalf("%s: Migration ended %s: %s", mode, m.Status.Phase, m.Status.Message)
		}
		if p == nil {
			t.Fatalf("%s: the replacement pod never had an address", mode)
		}
		res, err := p.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if !res.StateOK || res.Answers == 0 {
			t.Errorf("%s: probe %+v: the moved memhog's state is not whole", mode, res)
		}
		rep := m.Status.Report
		if rep == nil || rep.Mode != mode || rep.DowntimeMs <= 0 || rep.SourceState != "removed" {
			t.Errorf("%s: report %+v", mode, rep)
		}
		// The ReplicaSet owns the replacement, and keeps one pod.
		time.Sleep(3 * time.Second)
		pods := w.pods(t, name)
		if len(pods) != 1 || pods[0].Name != m.Status.TargetPod || pods[0].Spec.NodeName != m.Status.TargetNode || pods[0].Spec.NodeName == src.Spec.NodeName {
			t.Fatalf("%s: pods after the move: %v", mode, podNames(pods))
		}
		if ref := metav1.GetControllerOf(&pods[0]); ref == nil || ref.Kind != "ReplicaSet" {
			t.Errorf("%s: the replacement's controller is %v, want its ReplicaSet", mode, ref)
		}
		t.Logf("%s: pod %s (%s) -> %s (%s): client downtime %.0f ms, ferry's downtime %.0f ms, total %.0f ms, %s",
			mode, src.Name, src.Spec.NodeName, m.Status.TargetPod, m.Status.TargetNode, res.ClientDowntimeMs, rep.DowntimeMs, rep.TotalMs, rep.Network)
		if err := w.cs.AppsV1().Deployments("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// sandboxAddress waits for pod's sandbox on node to have an address and
// returns it (the kubelet reports it only once the container started).
func (w *kubeWorld) sandboxAddress(t *testing.T, node, pod string) string {
	t.Helper()
	cd := &containerd.Runtime{Address: kubelab.NodeSocket(lab.KubeDir, node)}
	defer cd.Close()
	var ip string
	waitFor(t, time.Minute, "pod "+pod+"'s sandbox address", func() (bool, error) {
		var err error
		ip, err = kuberuntime.SandboxAddress(context.Background(), cd, "default", pod)
		return err == nil, err
	})
	return ip
}

// release sets a held Migration going.
func (w *kubeWorld) release(t *testing.T, m *v1.Migration) {
	t.Helper()
	patch := client.MergeFrom(m.DeepCopy())
	m.Spec.Hold = false
	if err := w.c.Patch(context.Background(), m, patch); err != nil {
		t.Fatal(err)
	}
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name+"@"+p.Spec.NodeName)
	}
	return out
}

// TestKubernetesMigrationFailures: bad input ends a Migration Failed with
// its reason before anything is frozen; a Migration cancelled during
// pre-copy's rounds leaves the source pod running, whole, and no
// replacement; a controller killed mid-migration and started again
// finishes it once; the target's agent killed at the restore leaves the
// source pod running and the Migration Failed.
func TestKubernetesMigrationFailures(t *testing.T) {
	w := upKubeWorld(t)
	ctx := context.Background()
	src := w.memhogDeployment(t, "memhog", "64M")
	other := "h1"
	if src.Spec.NodeName == "h1" {
		other = "h2"
	}

	t.Run("bad input", func(t *testing.T) {
		hostPath := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hostpath", Namespace: "default"}, Spec: corev1.PodSpec{
			NodeName: src.Spec.NodeName, TerminationGracePeriodSeconds: new(int64),
			Volumes: []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp"}}}},
			Containers: []corev1.Container{{Name: "memhog", Image: memhogImage, ImagePullPolicy: corev1.PullNever, Command: []string{"/memhog", "--memory", "4M"},
				VolumeMounts: []corev1.VolumeMount{{Name: "h", MountPath: "/h"}}}}}}
		if _, err := w.cs.CoreV1().Pods("default").Create(ctx, hostPath, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.cs.CoreV1().Pods("default").Delete(ctx, "hostpath", metav1.DeleteOptions{}) }()
		waitFor(t, time.Minute, "the hostPath pod running", func() (bool, error) {
			p, err := w.cs.CoreV1().Pods("default").Get(ctx, "hostpath", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning, err
		})
		for i, c := range []struct {
			spec v1.MigrationSpec
			want string
		}{
			{v1.MigrationSpec{PodName: "nosuchpod"}, `no pod "nosuchpod"`},
			{v1.MigrationSpec{PodName: src.Name, TargetNode: "h9"}, `no node "h9"`},
			{v1.MigrationSpec{PodName: src.Name, TargetNode: src.Spec.NodeName}, "is the pod's own node"},
			{v1.MigrationSpec{PodName: "hostpath"}, "hostPath"},
			{v1.MigrationSpec{PodName: src.Name, Container: "nosuch"}, `no container "nosuch"`},
		} {
			m := w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bad%d", i)}, Spec: c.spec}, nil)
			if m.Status.Phase != v1.PhaseFailed || !strings.Contains(m.Status.Message, c.want) {
				t.Errorf("%+v: %s %q, want Failed saying %q", c.spec, m.Status.Phase, m.Status.Message, c.want)
			}
			if m.Status.TargetPod != "" || m.Status.JobID != "" {
				t.Errorf("%+v: went as far as %+v", c.spec, m.Status)
			}
		}
		// Without the RuntimeClass, no replacement can be restored.
		if err := w.cs.NodeV1().RuntimeClasses().Delete(ctx, "ferry", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		m := w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "bad-rc"}, Spec: v1.MigrationSpec{PodName: src.Name}}, nil)
		if m.Status.Phase != v1.PhaseFailed || !strings.Contains(m.Status.Message, "RuntimeClass ferry") {
			t.Errorf("without the RuntimeClass: %s %q", m.Status.Phase, m.Status.Message)
		}
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "ferry"}, Handler: "ferry"}
		if _, err := w.cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		w.checkUntouched(t, src)
	})

	t.Run("cancelled during the rounds", func(t *testing.T) {
		// A budget no round meets keeps pre-copy's rounds going.
		m := &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "cancelled"},
			Spec: v1.MigrationSpec{PodName: src.Name, Mode: "precopy", MaxDowntime: &metav1.Duration{Duration: time.Microsecond}}}
		cancelled := false
		m = w.migrate(t, m, func(m *v1.Migration) {
			if m.Status.Phase == v1.PhaseMigrating && !cancelled {
				time.Sleep(700 * time.Millisecond)
				patch := client.MergeFrom(m.DeepCopy())
				m.Spec.Cancel = true
				if err := w.c.Patch(ctx, m, patch); err != nil {
					t.Fatal(err)
				}
				cancelled = true
			}
		})
		if m.Status.Phase != v1.PhaseAborted || m.Status.Report == nil || (m.Status.Report.SourceState != "resumed" && m.Status.Report.SourceState != "") {
			t.Fatalf("cancelled: %s %q, report %+v", m.Status.Phase, m.Status.Message, m.Status.Report)
		}
		w.checkUntouched(t, src)
	})

	t.Run("controller restarted mid-migration", func(t *testing.T) {
		m := &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "restarted"}, Spec: v1.MigrationSpec{PodName: src.Name, Mode: "precopy"}}
		killed := false
		m = w.migrate(t, m, func(m *v1.Migration) {
			if m.Status.Phase == v1.PhaseMigrating && !killed {
				w.stopController()
				killed = true
				time.Sleep(2 * time.Second)
				w.startController(t)
			}
		})
		if !killed || m.Status.Phase != v1.PhaseSucceeded {
			t.Fatalf("killed %v; ended %s %q", killed, m.Status.Phase, m.Status.Message)
		}
		jobs, err := agentclient.Jobs(ctx, agentclient.Socket(w.l.Hosts[hostIndex(src.Spec.NodeName)].ControlSock), true)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, j := range jobs {
			if j.Container == m.Status.ContainerID && j.Report != nil && j.Report.Error == "" {
				n++
				if j.ID != m.Status.JobID {
					t.Errorf("job %s moved the container, the Migration's is %s", j.ID, m.Status.JobID)
				}
			}
		}
		if n != 1 {
			t.Errorf("%d jobs moved container %s, want 1: %+v", n, m.Status.ContainerID, jobs)
		}
		time.Sleep(3 * time.Second)
		if pods := w.pods(t, "memhog"); len(pods) != 1 || pods[0].Name != m.Status.TargetPod || pods[0].Spec.NodeName != other {
			t.Fatalf("pods after the move: %v", podNames(pods))
		}
		moved, err := w.cs.CoreV1().Pods("default").Get(ctx, m.Status.TargetPod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		src = moved
	})

	t.Run("target agent killed at the restore", func(t *testing.T) {
		m := &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "target-killed", Annotations: map[string]string{kubecontroller.AnnotationFaults: "kill-destination@restore"}},
			Spec: v1.MigrationSpec{PodName: src.Name, Mode: "cold"}}
		restarted := false
		m = w.migrate(t, m, func(m *v1.Migration) {
			if !restarted && strings.HasPrefix(m.Status.Message, "in doubt") {
				if err := w.l.RestartAgent(ctx, m.Status.TargetNode); err != nil {
					t.Fatal(err)
				}
				restarted = true
			}
		})
		if m.Status.Phase != v1.PhaseFailed {
			t.Fatalf("ended %s %q", m.Status.Phase, m.Status.Message)
		}
		t.Logf("target agent killed at the restore: %s (restarted: %v)", m.Status.Message, restarted)
		w.checkUntouched(t, src)
	})
}

func hostIndex(node string) int { return int(node[1] - '1') }

// checkUntouched checks pod p runs on as it was (same container, not
// restarted, its memhog's state whole), alone in its app with no
// replacement left.
func (w *kubeWorld) checkUntouched(t *testing.T, p *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 30*time.Second, "pod "+p.Name+" alone in its app", func() (bool, error) {
		pods := w.pods(t, p.Labels["app"])
		return len(pods) == 1 && pods[0].Name == p.Name, fmt.Errorf("pods %v", podNames(pods))
	})
	now, err := w.cs.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.Status.Phase != corev1.PodRunning || len(now.Status.ContainerStatuses) != 1 ||
		now.Status.ContainerStatuses[0].ContainerID != p.Status.ContainerStatuses[0].ContainerID || now.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("pod %s is not as it was: %s %+v", p.Name, now.Status.Phase, now.Status.ContainerStatuses)
	}
	pr, _, err := bench.StartProbe(ctx, &w.l.Hosts[2], w.bin, []string{p.Status.PodIP + ":" + memhogPort}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pr.Stop()
	if err != nil || !res.StateOK {
		t.Fatalf("pod %s's memhog: %+v %v", p.Name, res, err)
	}
}

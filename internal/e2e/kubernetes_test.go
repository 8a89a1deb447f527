package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/kubecontroller"
	"github.com/ferry-migrate/ferry/internal/kubelab"
	"github.com/ferry-migrate/ferry/internal/kubeworld"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
	kuberuntime "github.com/ferry-migrate/ferry/internal/runtime/kubernetes"
)

// upKubeWorld brings up a lab with Kubernetes and installs ferry in it
// (kubeworld.Install: the CRD, ferry-controller, memhog's image), all
// taken down when the test ends; a failed test shows the controller's and
// agents' logs.
func upKubeWorld(t *testing.T) *kubeWorld {
	t.Helper()
	return upKubeWorldWith(t, lab.Options{})
}

// upKubeWorldWith is upKubeWorld on a lab with o's options (delay lines).
func upKubeWorldWith(t *testing.T, o lab.Options) *kubeWorld {
	t.Helper()
	requireLab(t)
	if err := kubelab.CheckCache(kubelab.Config{}); err != nil {
		t.Skipf("the Kubernetes lab's binaries are not built (scripts/kube-build.sh, run by make test's setup): %v", err)
	}
	bin := ferryBin(t)
	ctlBin := filepath.Join(filepath.Dir(bin), "ferry-controller")
	if _, err := os.Stat(ctlBin); err != nil {
		build := exec.Command("go", "build", "-o", ctlBin, "./cmd/ferry-controller")
		build.Dir, build.Env = "../..", append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build ferry-controller: %v\n%s", err, out)
		}
	}
	o.Hosts, o.FerryBin, o.Kubernetes = 3, bin, true
	l := upLabWith(t, o)
	w, err := kubeworld.Install(context.Background(), l, filepath.Join(filepath.Dir(bin), "memhog"), ctlBin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		if t.Failed() {
			t.Log(w.Logs(60))
		}
	})
	return &kubeWorld{World: w, t: t, bin: bin}
}

// kubeWorld is kubeworld.World with the test's failures.
type kubeWorld struct {
	*kubeworld.World
	t   *testing.T
	bin string // ferry
}

func (w *kubeWorld) memhogDeployment(t *testing.T, name, memory string) *corev1.Pod {
	t.Helper()
	p, err := w.Memhog(context.Background(), name, memory, 200, memhogPortNum)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.DeleteDeployment(context.Background(), name) })
	return p
}

func (w *kubeWorld) pods(t *testing.T, app string) []corev1.Pod {
	t.Helper()
	pods, err := w.Pods(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

func (w *kubeWorld) migrate(t *testing.T, m *v1.Migration, watch func(*v1.Migration)) *v1.Migration {
	t.Helper()
	got, err := w.Migrate(context.Background(), m, func(m *v1.Migration) error {
		if watch != nil {
			watch(m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() (bool, error)) {
	t.Helper()
	err := kubeworld.Wait(context.Background(), d, what, func() error {
		done, err := ok()
		if done {
			return nil
		}
		if err == nil {
			err = errors.New("not yet")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
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
				ip, err := w.SandboxAddress(context.Background(), m.Status.TargetNode, m.Status.TargetPod)
				if err != nil {
					t.Fatal(err)
				}
				p, _, err = bench.StartProbe(context.Background(), &w.Lab.Hosts[2], w.bin,
					[]string{src.Status.PodIP + ":" + memhogPort, ip + ":" + memhogPort}, time.Minute)
				if err != nil {
					t.Fatalf("probe: %v", err)
				}
				time.Sleep(300 * time.Millisecond) // answers before the freeze
				if err := w.Release(context.Background(), m); err != nil {
					t.Fatal(err)
				}
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
			t.Fatalf("%s: pods after the move: %v", mode, kubeworld.PodNames(pods))
		}
		checkInItsPod(t, &pods[0])
		// No target node named: the source node's agent weighed the nodes.
		if !strings.Contains(m.Status.TargetReason, "the cheapest feasible host") {
			t.Errorf("%s: target reason %q: the nodes were not weighed by the policy", mode, m.Status.TargetReason)
		}
		if ref := metav1.GetControllerOf(&pods[0]); ref == nil || ref.Kind != "ReplicaSet" {
			t.Errorf("%s: the replacement's controller is %v, want its ReplicaSet", mode, ref)
		}
		t.Logf("%s: pod %s (%s) -> %s (%s): client downtime %.0f ms, ferry's downtime %.0f ms, total %.0f ms, %s",
			mode, src.Name, src.Spec.NodeName, m.Status.TargetPod, m.Status.TargetNode, res.ClientDowntimeMs, rep.DowntimeMs, rep.TotalMs, rep.Network)
		if err := w.DeleteDeployment(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
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
			Containers: []corev1.Container{{Name: "memhog", Image: kubeworld.MemhogImage, ImagePullPolicy: corev1.PullNever, Command: []string{"/memhog", "--memory", "4M"},
				VolumeMounts: []corev1.VolumeMount{{Name: "h", MountPath: "/h"}}}}}}
		if _, err := w.Clientset.CoreV1().Pods("default").Create(ctx, hostPath, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.Clientset.CoreV1().Pods("default").Delete(ctx, "hostpath", metav1.DeleteOptions{}) }()
		waitFor(t, time.Minute, "the hostPath pod running", func() (bool, error) {
			p, err := w.Clientset.CoreV1().Pods("default").Get(ctx, "hostpath", metav1.GetOptions{})
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
		if err := w.Clientset.NodeV1().RuntimeClasses().Delete(ctx, "ferry", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		m := w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "bad-rc"}, Spec: v1.MigrationSpec{PodName: src.Name}}, nil)
		if m.Status.Phase != v1.PhaseFailed || !strings.Contains(m.Status.Message, "RuntimeClass ferry") {
			t.Errorf("without the RuntimeClass: %s %q", m.Status.Phase, m.Status.Message)
		}
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "ferry"}, Handler: "ferry"}
		if _, err := w.Clientset.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
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
				// Once the source's agent is in a round.
				ep := agentclient.Socket(w.Lab.Hosts[hostIndex(m.Status.SourceNode)].ControlSock)
				waitFor(t, 30*time.Second, "a pre-copy round", func() (bool, error) {
					jobs, err := agentclient.Jobs(ctx, ep, false)
					for _, j := range jobs {
						if j.ID == m.Status.JobID && strings.HasPrefix(j.Progress.Phase, "round-") {
							return true, nil
						}
					}
					return false, err
				})
				patch := client.MergeFrom(m.DeepCopy())
				m.Spec.Cancel = true
				if err := w.Client.Patch(ctx, m, patch); err != nil {
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
				w.StopController()
				killed = true
				time.Sleep(2 * time.Second)
				if err := w.StartController(); err != nil {
					t.Fatal(err)
				}
			}
		})
		if !killed || m.Status.Phase != v1.PhaseSucceeded {
			t.Fatalf("killed %v; ended %s %q", killed, m.Status.Phase, m.Status.Message)
		}
		jobs, err := agentclient.Jobs(ctx, agentclient.Socket(w.Lab.Hosts[hostIndex(src.Spec.NodeName)].ControlSock), true)
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
			t.Fatalf("pods after the move: %v", kubeworld.PodNames(pods))
		}
		moved, err := w.Clientset.CoreV1().Pods("default").Get(ctx, m.Status.TargetPod, metav1.GetOptions{})
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
				if err := w.Lab.RestartAgent(ctx, m.Status.TargetNode); err != nil {
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
		return len(pods) == 1 && pods[0].Name == p.Name, fmt.Errorf("pods %v", kubeworld.PodNames(pods))
	})
	now, err := w.Clientset.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.Status.Phase != corev1.PodRunning || len(now.Status.ContainerStatuses) != 1 ||
		now.Status.ContainerStatuses[0].ContainerID != p.Status.ContainerStatuses[0].ContainerID || now.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("pod %s is not as it was: %s %+v", p.Name, now.Status.Phase, now.Status.ContainerStatuses)
	}
	pr, _, err := bench.StartProbe(ctx, &w.Lab.Hosts[2], w.bin, []string{p.Status.PodIP + ":" + memhogPort}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pr.Stop()
	if err != nil || !res.StateOK {
		t.Fatalf("pod %s's memhog: %+v %v", p.Name, res, err)
	}
}

// checkInItsPod checks that pod's restored container shares its own
// pod's sandbox namespaces (network, IPC, UTS: the pod's address and
// hostname), not the source pod's, and sees its own pod's files.
func checkInItsPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), kuberuntime.Namespace)
	cd := &containerd.Runtime{Address: kubelab.NodeSocket(lab.KubeDir, pod.Spec.NodeName)}
	defer cd.Close()
	cl, err := cd.Connect()
	if err != nil {
		t.Fatal(err)
	}
	pidOf := func(filter string) int {
		ctrs, err := cl.Containers(ctx, filter)
		if err != nil || len(ctrs) != 1 {
			t.Fatalf("containers %s: %d, %v", filter, len(ctrs), err)
		}
		task, err := ctrs[0].Task(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return int(task.Pid())
	}
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	ctr := pidOf(fmt.Sprintf(`id==%s`, id))
	pause := pidOf(fmt.Sprintf(`labels."%s"==%s,labels."io.cri-containerd.kind"==sandbox`, kuberuntime.LabelPodName, pod.Name))
	for _, ns := range []string{"net", "ipc", "uts"} {
		a, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", ctr, ns))
		b, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pause, ns))
		if a == "" || a != b {
			t.Errorf("pod %s: the restored container's %s namespace is %q, its sandbox's %q", pod.Name, ns, a, b)
		}
	}
	if host, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/etc/hostname", ctr)); err != nil || strings.TrimSpace(string(host)) != pod.Name {
		t.Errorf("pod %s: the restored container's /etc/hostname is %q (%v)", pod.Name, host, err)
	}
}

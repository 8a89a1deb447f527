package kubelab_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/kubelab"
	"github.com/ferry-migrate/ferry/internal/testroot"
)

// The test's own network: a switch namespace holding a bridge, and a
// control-plane namespace and two node namespaces, each on the bridge by
// a veth, in 10.91.0.0/24. Every name starts with testPrefix.
const (
	testPrefix = "ferry-kt-"
	switchNS   = testPrefix + "sw"
	switchBr   = testPrefix + "br"
	controlNS  = testPrefix + "cp"
	controlIP  = "10.91.0.1"
	netnsDir   = "/run/netns"
	echoImage  = "ferry.test/echo:v1"
	echoPort   = 7777
)

type testNode struct {
	name, ns, ip, podCIDR string
}

var testNodes = []testNode{
	{"n1", testPrefix + "n1", "10.91.0.11", "10.92.1.0/24"},
	{"n2", testPrefix + "n2", "10.91.0.12", "10.92.2.0/24"},
}

func nsPath(name string) string { return filepath.Join(netnsDir, name) }

// testConfig is the test's cluster in dir, on the test's network.
func testConfig(dir string) kubelab.Config {
	cfg := kubelab.Config{Dir: dir, Name: strings.TrimSuffix(testPrefix, "-"), ControlNetNS: nsPath(controlNS), ControlIP: controlIP}
	for _, n := range testNodes {
		cfg.Nodes = append(cfg.Nodes, kubelab.Node{Name: n.name, NetNS: nsPath(n.ns), IP: n.ip, PodCIDR: n.podCIDR})
	}
	return cfg
}

// machinePaths are the machine's own places for containerd, the kubelet
// and CNI. A lab cluster must leave them as it found them: absent, or
// unchanged (a directory's modification time moves when an entry is added
// or removed).
var machinePaths = []string{
	"/run/containerd", "/var/lib/containerd", "/etc/containerd", "/opt/containerd",
	"/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/etc/kubernetes", "/var/run/kubernetes", "/usr/libexec/kubernetes",
	"/etc/cni/net.d", "/opt/cni", "/var/lib/cni/networks",
}

// snapshotMachinePaths maps each of machinePaths to its modification time
// ("" when absent).
func snapshotMachinePaths() map[string]string {
	snap := map[string]string{}
	for _, p := range machinePaths {
		if fi, err := os.Stat(p); err == nil {
			snap[p] = fi.ModTime().String()
		} else {
			snap[p] = ""
		}
	}
	return snap
}

// setup readies what a cluster test needs: root, the cache, no leftovers
// of an earlier run, the echo binary, the test's network and a cluster
// directory that Down removes at cleanup. It returns the configuration
// and the echo binary.
func setup(t *testing.T) (kubelab.Config, string) {
	testroot.Require(t, "kubelab starts containerd, kubelets and a control plane in network namespaces: needs root")
	requireCache(t, testConfig(""))
	removeLeftovers(t)
	echoBin := buildEcho(t)
	before := snapshotMachinePaths()
	t.Cleanup(func() {
		after := snapshotMachinePaths()
		for _, p := range machinePaths {
			if before[p] != after[p] {
				t.Errorf("%s changed: was %q, now %q (\"\" means absent)", p, before[p], after[p])
			}
		}
	})
	setupNetwork(t)
	dir, err := os.MkdirTemp("/tmp", testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kubelab.Down(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	// Runs before Down: a failed test leaves its logs behind.
	t.Cleanup(func() {
		if t.Failed() {
			keepLogs(t, dir)
		}
	})
	return testConfig(dir), echoBin
}

func TestClusterRunsPodsAcrossNodes(t *testing.T) {
	cfg, echoBin := setup(t)
	dir := cfg.Dir

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	cl, err := kubelab.Up(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Up took %s (two nodes Ready, default service account made)", time.Since(start).Round(time.Millisecond))
	client := cl.Client()
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(testNodes) {
		t.Errorf("%d nodes registered, want %d", len(nodes.Items), len(testNodes))
	}
	for _, n := range nodes.Items {
		info := n.Status.NodeInfo
		if info.KubeletVersion != kubelab.KubeVersion || info.ContainerRuntimeVersion != "containerd://2.4.2" {
			t.Errorf("node %s runs kubelet %q on %q", n.Name, info.KubeletVersion, info.ContainerRuntimeVersion)
		}
	}

	start = time.Now()
	if err := cl.ImportBinary(ctx, echoImage, echoBin, fmt.Sprintf("-listen=:%d", echoPort)); err != nil {
		t.Fatal(err)
	}
	t.Logf("echo image imported into both nodes in %s", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	pods := runEchoDeployment(ctx, t, client)
	t.Logf("Deployment of 2: both pods Running and Ready in %s: %s on %s (%s), %s on %s (%s)",
		time.Since(start).Round(time.Millisecond), pods[0].Name, pods[0].Spec.NodeName, pods[0].Status.PodIP,
		pods[1].Name, pods[1].Spec.NodeName, pods[1].Status.PodIP)

	from, to := pods[0], pods[1]
	if from.Spec.NodeName != "n1" {
		from, to = to, from
	}
	msg := "ferry kubelab " + time.Now().Format(time.RFC3339Nano)
	reply, err := echoFromPod(cl, from, net.JoinHostPort(to.Status.PodIP, strconv.Itoa(echoPort)), msg)
	if err != nil {
		t.Fatalf("pod %s on n1 -> pod %s on n2 (%s): %v", from.Name, to.Name, to.Status.PodIP, err)
	}
	if reply != msg {
		t.Fatalf("echo from %s: got %q, want %q", to.Name, reply, msg)
	}
	t.Logf("pod %s (n1, %s) reached pod %s (n2, %s) and got its echo", from.Name, from.Status.PodIP, to.Name, to.Status.PodIP)

	start = time.Now()
	runStatefulSet(ctx, t, client)
	t.Logf("StatefulSet of 1: web-0 Running in %s", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	deleteWorkloads(ctx, t, client)
	t.Logf("Deployment and StatefulSet deleted, their pods gone, in %s", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	if err := kubelab.Down(dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("Down took %s", time.Since(start).Round(time.Millisecond))
	checkNothingLeft(t, cfg)
}

// crashDirEnv tells the test binary, run again by
// TestDownAfterCallerCrash, to be the crashing caller: bring a cluster up
// in that directory, run pods, say so and wait to be killed.
const (
	crashDirEnv  = "FERRY_KT_CRASH_DIR"
	crashEchoEnv = "FERRY_KT_CRASH_ECHO"
	crashReady   = "FERRY-KT-CLUSTER-READY"
)

func TestDownAfterCallerCrash(t *testing.T) {
	cfg, echoBin := setup(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashingCaller$", "-test.v", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+cfg.Dir, crashEchoEnv+"="+echoBin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), crashReady) {
				ready <- nil
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
		ready <- errors.New("the caller ended before its cluster was up")
	}()
	select {
	case err = <-ready:
	case <-time.After(6 * time.Minute):
		err = errors.New("timed out")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		t.Fatalf("crashing caller: %v\n%s%s", err, out.String(), stderr.String())
	}
	t.Logf("the caller brought a cluster up, ran two pods and was killed (SIGKILL)")

	alive := 0
	procDirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procDirs {
		if cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline")); bytes.Contains(cmdline, []byte(cfg.Dir)) {
			alive++
		}
	}
	if alive == 0 {
		t.Fatal("nothing of the cluster outlived its caller: the test proves nothing")
	}
	start := time.Now()
	if err := kubelab.Down(cfg.Dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("Down after the crash, from another process, took %s (%d processes of the cluster were left running)", time.Since(start).Round(time.Millisecond), alive)
	checkNothingLeft(t, cfg)
}

// TestCrashingCaller is TestDownAfterCallerCrash's caller, run as a
// process of its own; run directly, it skips.
func TestCrashingCaller(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("a helper of TestDownAfterCallerCrash, which runs it in a process of its own")
	}
	ctx := context.Background()
	cl, err := kubelab.Up(ctx, testConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ImportBinary(ctx, echoImage, os.Getenv(crashEchoEnv), fmt.Sprintf("-listen=:%d", echoPort)); err != nil {
		t.Fatal(err)
	}
	runEchoDeployment(ctx, t, cl.Client())
	fmt.Println(crashReady)
	time.Sleep(10 * time.Minute) // until killed
}

// requireCache skips the test unless the cache holds the cluster's
// binaries; with FERRY_KUBE_BUILD=1 it builds them first.
func requireCache(t *testing.T, cfg kubelab.Config) {
	err := kubelab.CheckCache(cfg)
	if err == nil {
		return
	}
	if os.Getenv("FERRY_KUBE_BUILD") != "1" {
		t.Skipf("kubelab cache incomplete: %v; run scripts/kube-build.sh (or set FERRY_KUBE_BUILD=1)", err)
	}
	cmd := exec.Command("bash", "../../scripts/kube-build.sh")
	out, err := cmd.CombinedOutput()
	t.Logf("scripts/kube-build.sh:\n%s", out)
	if err != nil {
		t.Fatalf("scripts/kube-build.sh: %v", err)
	}
	if err := kubelab.CheckCache(cfg); err != nil {
		t.Fatal(err)
	}
}

// removeLeftovers takes down what a crashed earlier run of this test left:
// its clusters (by their state in /tmp/ferry-kt-*) and its namespaces.
func removeLeftovers(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join("/tmp", testPrefix+"*", "state.json"))
	for _, st := range dirs {
		t.Logf("taking down a cluster an earlier run left in %s", filepath.Dir(st))
		if err := kubelab.Down(filepath.Dir(st)); err != nil {
			t.Fatal(err)
		}
	}
	deleteNetwork(t)
}

// buildEcho builds testdata/echo static.
func buildEcho(t *testing.T) string {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	out := filepath.Join(t.TempDir(), "echo")
	cmd := exec.Command(goBin, "build", "-o", out, "./testdata/echo")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build testdata/echo: %v\n%s", err, b)
	}
	return out
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// setupNetwork makes the test's namespaces, bridge and veths, removed
// again at cleanup (after the cluster: cleanups run last-in first-out).
func setupNetwork(t *testing.T) {
	t.Cleanup(func() { deleteNetwork(t) })
	ip(t, "netns", "add", switchNS)
	ip(t, "-n", switchNS, "link", "add", switchBr, "type", "bridge")
	ip(t, "-n", switchNS, "link", "set", switchBr, "up")
	attach := func(ns, addr string) {
		ip(t, "netns", "add", ns)
		ip(t, "-n", ns, "link", "set", "lo", "up")
		// ns's end is named ns, the switch's end ns-s.
		ip(t, "-n", switchNS, "link", "add", ns+"-s", "type", "veth", "peer", "name", ns, "netns", ns)
		ip(t, "-n", switchNS, "link", "set", ns+"-s", "master", switchBr, "up")
		ip(t, "-n", ns, "addr", "add", addr+"/24", "dev", ns)
		ip(t, "-n", ns, "link", "set", ns, "up")
	}
	attach(controlNS, controlIP)
	for _, n := range testNodes {
		attach(n.ns, n.ip)
	}
}

func deleteNetwork(t *testing.T) {
	for _, ns := range append([]string{controlNS, switchNS}, testNodes[0].ns, testNodes[1].ns) {
		if _, err := os.Stat(nsPath(ns)); err == nil {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		}
	}
}

// runEchoDeployment runs two echo pods, one per node (required
// anti-affinity: the scheduler must place them apart), and returns them
// once both are Running and Ready.
func runEchoDeployment(ctx context.Context, t *testing.T, client kubernetes.Interface) []corev1.Pod {
	labels := map[string]string{"app": "ferry-kt-echo"}
	replicas := int32(2)
	grace := int64(2)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: metav1.NamespaceDefault},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
							TopologyKey:   corev1.LabelHostname,
						}},
					}},
					Containers: []corev1.Container{echoContainer()},
				},
			},
		},
	}
	if _, err := client.AppsV1().Deployments(metav1.NamespaceDefault).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	err := poll(ctx, 3*time.Minute, func(ctx context.Context) error {
		list, err := client.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "app=ferry-kt-echo"})
		if err != nil {
			return err
		}
		pods = nil
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		if len(pods) != 2 {
			return fmt.Errorf("%d pods", len(pods))
		}
		for _, p := range pods {
			if err := runningAndReady(p); err != nil {
				return err
			}
		}
		if pods[0].Spec.NodeName == pods[1].Spec.NodeName {
			return fmt.Errorf("both pods on %s", pods[0].Spec.NodeName)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("echo Deployment: %v%s", err, podEvents(ctx, client))
	}
	for _, p := range pods {
		for _, n := range testNodes {
			_, podNet, _ := net.ParseCIDR(n.podCIDR)
			if p.Spec.NodeName == n.name && !podNet.Contains(net.ParseIP(p.Status.PodIP)) {
				t.Errorf("pod %s on %s has IP %s, outside the node's %s", p.Name, n.name, p.Status.PodIP, n.podCIDR)
			}
		}
	}
	return pods
}

func echoContainer() corev1.Container {
	return corev1.Container{
		Name:            "echo",
		Image:           echoImage,
		ImagePullPolicy: corev1.PullNever,
		Ports:           []corev1.ContainerPort{{ContainerPort: echoPort}},
		// The kubelet probes from the node's namespace, over the CNI bridge.
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(echoPort)}},
			PeriodSeconds: 1,
		},
	}
}

func runningAndReady(p corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("pod %s: %s", p.Name, p.Status.Phase)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("pod %s: Running, not Ready", p.Name)
}

// runStatefulSet checks the StatefulSet controller: web-0 must run.
func runStatefulSet(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	labels := map[string]string{"app": "ferry-kt-web"}
	replicas := int32(1)
	grace := int64(2)
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: metav1.NamespaceDefault},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &replicas,
			ServiceName: "web",
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{echoContainer()}},
			},
		},
	}
	if _, err := client.AppsV1().StatefulSets(metav1.NamespaceDefault).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		p, err := client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "web-0", metav1.GetOptions{})
		if err != nil {
			return err
		}
		return runningAndReady(*p)
	})
	if err != nil {
		t.Fatalf("StatefulSet web: %v%s", err, podEvents(ctx, client))
	}
}

// deleteWorkloads deletes both workloads (the garbage collector removes
// their pods) and waits until no pod is left.
func deleteWorkloads(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	fg := metav1.DeletePropagationForeground
	opts := metav1.DeleteOptions{PropagationPolicy: &fg}
	if err := client.AppsV1().Deployments(metav1.NamespaceDefault).Delete(ctx, "echo", opts); err != nil {
		t.Fatal(err)
	}
	if err := client.AppsV1().StatefulSets(metav1.NamespaceDefault).Delete(ctx, "web", opts); err != nil {
		t.Fatal(err)
	}
	err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		list, err := client.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d pods left, e.g. %s (%s)", len(list.Items), list.Items[0].Name, list.Items[0].Status.Phase)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("deleting the workloads: %v", err)
	}
}

// poll retries check every half second until it succeeds or d passes.
func poll(ctx context.Context, d time.Duration, check func(context.Context) error) error {
	deadline := time.Now().Add(d)
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", d, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// podEvents lists the default namespace's events, to say why pods did
// not come up.
func podEvents(ctx context.Context, client kubernetes.Interface) string {
	events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "\n(events: " + err.Error() + ")"
	}
	var b strings.Builder
	for _, e := range events.Items {
		fmt.Fprintf(&b, "\n  %s %s/%s: %s: %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
	return b.String()
}

// echoFromPod connects to addr from inside pod's network namespace (that
// of one of its processes, found in its cgroup under its node's cgroup
// root), sends msg and returns what comes back.
func echoFromPod(cl *kubelab.Cluster, pod corev1.Pod, addr, msg string) (string, error) {
	pid, err := podProcess(cl, pod)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := kubelab.Dialer(fmt.Sprintf("/proc/%d/ns/net", pid))(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

// podProcess is a process of pod (its sandbox's pause or its container),
// found in the pids hierarchy below the node's cgroup root, where the
// kubelet names the pod's cgroup podUID.
func podProcess(cl *kubelab.Cluster, pod corev1.Pod) (int, error) {
	root := filepath.Join(cgroups.Root, "pids", cl.CgroupRoot(pod.Spec.NodeName))
	want := "pod" + string(pod.UID)
	pid := 0
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || pid != 0 || !e.IsDir() || !strings.Contains(p, "/"+want+"/") {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if f := strings.Fields(string(b)); len(f) > 0 {
			pid, _ = strconv.Atoi(f[0])
		}
		return nil
	})
	if err == nil && pid == 0 {
		err = fmt.Errorf("no process of pod %s (%s) under %s", pod.Name, want, root)
	}
	return pid, err
}

// keepLogs copies the cluster's logs to the test's artifact directory
// (kept with go test -artifacts) and prints their last lines.
func keepLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	art := t.ArtifactDir()
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		_ = os.WriteFile(filepath.Join(art, filepath.Base(l)), b, 0o644)
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("--- last lines of %s:\n%s", filepath.Base(l), strings.Join(lines[max(0, len(lines)-25):], "\n"))
	}
	t.Logf("logs copied to %s", art)
}

// checkNothingLeft looks for anything of the cluster after Down:
// processes, mounts, cgroups, links and routes in the test's namespaces,
// iptables chains, CNI cache entries, log links, files.
func checkNothingLeft(t *testing.T, cfg kubelab.Config) {
	if _, err := os.Stat(cfg.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still exists (%v)", cfg.Dir, err)
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, cfg.Dir) {
				t.Errorf("still mounted: %s", line)
			}
		}
	}
	var nsInodes = map[uint64]string{}
	for _, ns := range []string{controlNS, testNodes[0].ns, testNodes[1].ns} {
		if fi, err := os.Stat(nsPath(ns)); err == nil {
			nsInodes[inode(fi)] = ns
		}
	}
	procDirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procDirs {
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		cwd, _ := os.Readlink(filepath.Join(p, "cwd"))
		if bytes.Contains(cmdline, []byte(cfg.Dir)) || strings.HasPrefix(cwd, cfg.Dir) {
			t.Errorf("process %s left: %s", filepath.Base(p), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
		if fi, err := os.Stat(filepath.Join(p, "ns", "net")); err == nil && nsInodes[inode(fi)] != "" {
			t.Errorf("process %s left in namespace %s: %s", filepath.Base(p), nsInodes[inode(fi)], bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	for _, h := range cgroups.Hierarchies(cgroups.Root) {
		if _, err := os.Stat(filepath.Join(h, cfg.Name)); err == nil {
			t.Errorf("cgroup %s left", filepath.Join(h, cfg.Name))
		}
	}
	for _, ns := range []string{controlNS, testNodes[0].ns, testNodes[1].ns} {
		var links []struct {
			Name string `json:"ifname"`
		}
		if err := json.Unmarshal([]byte(ipOut(t, "-n", ns, "-j", "link", "show")), &links); err != nil {
			t.Errorf("links of %s: %v", ns, err)
		}
		for _, l := range links {
			// Only lo and the test's own veth, named after the namespace.
			if l.Name != "lo" && l.Name != ns {
				t.Errorf("link %s left in %s", l.Name, ns)
			}
		}
		if routes := ipOut(t, "-n", ns, "route", "show"); strings.Contains(routes, "10.92.") {
			t.Errorf("pod routes left in %s:\n%s", ns, routes)
		}
		if out, err := exec.Command("nsenter", "--net="+nsPath(ns), "--", "iptables-save").CombinedOutput(); err == nil && bytes.Contains(out, []byte("KUBE-")) {
			t.Errorf("kubelet iptables chains left in %s:\n%s", ns, out)
		}
	}
	if ents, err := os.ReadDir("/var/lib/cni/results"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), cfg.Name+"-") {
				t.Errorf("CNI cache entry /var/lib/cni/results/%s left", e.Name())
			}
		}
	}
	if ents, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, e := range ents {
			if target, _ := os.Readlink(filepath.Join("/var/log/containers", e.Name())); strings.HasPrefix(target, cfg.Dir) {
				t.Errorf("log link /var/log/containers/%s left", e.Name())
			}
		}
	}
}

func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

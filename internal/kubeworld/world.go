// Package kubeworld is ferry installed in the lab's Kubernetes cluster,
// for the end-to-end tests and `ferry-lab bench migrate --runtime
// kubernetes`: the Migration CRD from deploy/kubernetes, ferry-controller
// running in the control plane's namespace with an operator's
// certificate, memhog's image on every node; memhog Deployments and
// Migrations of their pods, each followed to its end.
package kubeworld

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	deploy "github.com/ferry-migrate/ferry/deploy/kubernetes"
	"github.com/ferry-migrate/ferry/internal/kubelab"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/pki"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
	kuberuntime "github.com/ferry-migrate/ferry/internal/runtime/kubernetes"
)

// MemhogImage is memhog's image on the nodes (pods pull it Never).
const MemhogImage = "localhost/memhog:1"

// Namespace is where the world's Deployments and Migrations live.
const Namespace = "default"

// World is ferry installed in lab l's cluster.
type World struct {
	Lab       *lab.Lab
	Clientset kubernetes.Interface
	Client    client.Client
	// ControllerLog is the controller's output.
	ControllerLog string

	ctlBin, tls, kubeconfig string
	ctl                     procs.Started
}

// Install installs ferry in l's cluster (up with Kubernetes): memhog's
// image (the binary at memhog), the CRD, an operator's certificate in
// dir and the controller (ctlBin), started. Close stops the controller.
func Install(ctx context.Context, l *lab.Lab, memhog, ctlBin, dir string) (*World, error) {
	cl, err := l.Kubernetes()
	if err != nil {
		return nil, err
	}
	if err := cl.ImportBinary(ctx, MemhogImage, memhog); err != nil {
		return nil, err
	}
	if err := installCRD(ctx, cl); err != nil {
		return nil, err
	}
	ctrllog.SetLogger(logr.Discard()) // the client's own; the controller logs to its file
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cl.RESTConfig(), client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	// RuntimeClass ferry is the lab cluster's own, from the same
	// manifest (kubelab).
	if err := apply(ctx, c, scheme, deploy.RBAC); err != nil {
		return nil, err
	}
	tls := filepath.Join(dir, "tls")
	if err := pki.IssueOperator(lab.PKIDir, tls, "ferry-controller", 24*time.Hour); err != nil {
		return nil, err
	}
	// The controller runs as its ServiceAccount, with the manifest's
	// permissions only.
	kubeconfig := filepath.Join(dir, "controller.kubeconfig")
	if err := accountKubeconfig(ctx, cl, kubeconfig); err != nil {
		return nil, err
	}
	w := &World{Lab: l, Clientset: cl.Client(), Client: c, ControllerLog: filepath.Join(dir, "controller.log"), ctlBin: ctlBin, tls: tls, kubeconfig: kubeconfig}
	return w, w.StartController()
}

// installCRD applies the CRDs' manifests and waits until they are served.
func installCRD(ctx context.Context, cl *kubelab.Cluster) error {
	ax, err := apiextclient.NewForConfig(cl.RESTConfig())
	if err != nil {
		return err
	}
	for _, file := range []string{deploy.CRD, deploy.FollowCRD} {
		b, err := deploy.Manifests.ReadFile(file)
		if err != nil {
			return err
		}
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if _, err := ax.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		err = Wait(ctx, 30*time.Second, "the CRD "+crd.Name+" established", func() error {
			got, err := ax.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
					return nil
				}
			}
			return errors.New("not established")
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// apply creates every object of a manifest (one that exists is left).
func apply(ctx context.Context, c client.Client, scheme *runtime.Scheme, file string) error {
	b, err := deploy.Manifests.ReadFile(file)
	if err != nil {
		return err
	}
	decode := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode
	for _, doc := range strings.Split(string(b), "\n---\n") {
		obj, _, err := decode([]byte(doc), nil, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		co, ok := obj.(client.Object)
		if !ok {
			return fmt.Errorf("%s: a %T", file, obj)
		}
		if err := c.Create(ctx, co); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
	return nil
}

// accountKubeconfig writes a kubeconfig for the controller's
// ServiceAccount: a token the API issues, the cluster's CA.
func accountKubeconfig(ctx context.Context, cl *kubelab.Cluster, path string) error {
	secs := int64(24 * 3600)
	tr, err := cl.Client().CoreV1().ServiceAccounts(deploy.ControllerNamespace).CreateToken(ctx, deploy.ControllerAccount,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("a token for %s/%s: %w", deploy.ControllerNamespace, deploy.ControllerAccount, err)
	}
	rc := cl.RESTConfig()
	ca := rc.CAData
	if len(ca) == 0 && rc.CAFile != "" {
		if ca, err = os.ReadFile(rc.CAFile); err != nil {
			return err
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: ca}
	cfg.AuthInfos["ferry-controller"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "ferry-controller"}
	cfg.CurrentContext = "lab"
	return clientcmd.WriteToFile(*cfg, path)
}

// StartController runs ferry-controller in the control plane's namespace
// (the lab's third host).
func (w *World) StartController() error {
	p, err := procs.StartDetached([]string{w.ctlBin, "--kubeconfig", w.kubeconfig, "--tls-dir", w.tls, "--operator", "ferry-controller"},
		w.Lab.Hosts[2].NetNS, w.ControllerLog, nil)
	if err != nil {
		return fmt.Errorf("start ferry-controller: %w", err)
	}
	w.ctl = p
	return nil
}

// StopController kills the controller, as a crash would.
func (w *World) StopController() {
	if w.ctl.PID > 0 {
		_ = syscall.Kill(w.ctl.PID, syscall.SIGKILL)
		<-w.ctl.Exited
		w.ctl = procs.Started{}
	}
}

// Close stops the controller (the cluster goes with the lab).
func (w *World) Close() { w.StopController() }

// Wait polls ok every 100 ms until it returns nil, for at most d.
func Wait(ctx context.Context, d time.Duration, what string, ok func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := ok()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting %v for %s: %w", d, what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Memhog runs a Deployment of one memhog pod (memory, dirty rate in
// pages per second, answering on port) and returns the pod once it runs.
func (w *World) Memhog(ctx context.Context, name, memory string, dirtyRate, port int) (*corev1.Pod, error) {
	return w.Run(ctx, MemhogDeployment(name, memory, dirtyRate, port))
}

// MemhogDeployment is Memhog's Deployment, for a caller to change first.
func MemhogDeployment(name, memory string, dirtyRate, port int) *appsv1.Deployment {
	one, noToken := int32(1), false
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken:  &noToken,
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "memhog", Image: MemhogImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/memhog", "--memory", memory, "--dirty-rate", fmt.Sprint(dirtyRate), "--port", fmt.Sprint(port)},
						// What it holds, as a user would ask (ferry drain's order).
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}},
					}},
				},
			},
		},
	}
}

// Run creates Deployment d of one pod (labelled app=NAME, in Namespace)
// and returns the pod once it runs.
func (w *World) Run(ctx context.Context, d *appsv1.Deployment) (*corev1.Pod, error) {
	name := d.Name
	if _, err := w.Clientset.AppsV1().Deployments(Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var pod *corev1.Pod
	err := Wait(ctx, 2*time.Minute, "Deployment "+name+"'s pod running", func() error {
		pods, err := w.Pods(ctx, name)
		if err != nil {
			return err
		}
		if len(pods) == 1 && pods[0].Status.Phase == corev1.PodRunning && pods[0].Status.PodIP != "" {
			pod = &pods[0]
			return nil
		}
		return fmt.Errorf("pods %v", PodNames(pods))
	})
	return pod, err
}

// DeleteDeployment removes a Deployment and its pods.
func (w *World) DeleteDeployment(ctx context.Context, name string) error {
	fg := metav1.DeletePropagationForeground
	err := w.Clientset.AppsV1().Deployments(Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg})
	if err != nil {
		return err
	}
	return Wait(ctx, time.Minute, "Deployment "+name+"'s pods gone", func() error {
		list, err := w.Clientset.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err == nil && len(list.Items) > 0 {
			err = fmt.Errorf("%d pods left", len(list.Items))
		}
		return err
	})
}

// Pods lists app's pods that are not being deleted.
func (w *World) Pods(ctx context.Context, app string) ([]corev1.Pod, error) {
	list, err := w.Clientset.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// PodNames names pods with their nodes, for messages.
func PodNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name+"@"+p.Spec.NodeName)
	}
	return out
}

// Migrate creates m and follows it to its end (at most 4 minutes),
// calling watch with each state seen.
func (w *World) Migrate(ctx context.Context, m *v1.Migration, watch func(*v1.Migration) error) (*v1.Migration, error) {
	m.Namespace = Namespace
	if err := w.Client.Create(ctx, m); err != nil {
		return nil, err
	}
	var got v1.Migration
	var werr error
	err := Wait(ctx, 4*time.Minute, "Migration "+m.Name+" to end", func() error {
		if err := w.Client.Get(ctx, client.ObjectKeyFromObject(m), &got); err != nil {
			return err
		}
		if watch != nil && werr == nil {
			werr = watch(&got)
		}
		if werr != nil || v1.Final(got.Status.Phase) {
			return nil
		}
		return fmt.Errorf("phase %q: %s", got.Status.Phase, got.Status.Message)
	})
	return &got, errors.Join(err, werr)
}

// Held says whether m waits, held, with its replacement pod made.
func Held(m *v1.Migration) bool { return strings.HasPrefix(m.Status.Message, "held") }

// Release sets a held Migration going.
func (w *World) Release(ctx context.Context, m *v1.Migration) error {
	patch := client.MergeFrom(m.DeepCopy())
	m.Spec.Hold = false
	return w.Client.Patch(ctx, m, patch)
}

// SandboxAddress waits for pod's sandbox on node to have an address (the
// kubelet reports a replacement's only once its container started).
func (w *World) SandboxAddress(ctx context.Context, node, pod string) (string, error) {
	cd := &containerd.Runtime{Address: kubelab.NodeSocket(lab.KubeDir, node)}
	defer cd.Close()
	var ip string
	err := Wait(ctx, time.Minute, "pod "+pod+"'s sandbox address", func() error {
		var err error
		ip, err = kuberuntime.SandboxAddress(ctx, cd, Namespace, pod)
		return err
	})
	return ip, err
}

// Logs is the tail of the controller's and the nodes' agents' logs.
func (w *World) Logs(lines int) string {
	var b strings.Builder
	out, _ := os.ReadFile(w.ControllerLog)
	fmt.Fprintf(&b, "controller log:\n%s\n", tail(string(out), lines))
	for _, h := range w.Lab.Hosts[:2] {
		out, _ := os.ReadFile(h.AgentLog())
		fmt.Fprintf(&b, "agent %s log:\n%s\n", h.Name, tail(string(out), lines/2))
	}
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

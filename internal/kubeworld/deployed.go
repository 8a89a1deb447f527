package kubeworld

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	deploy "github.com/ferry-migrate/ferry/deploy/kubernetes"
	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// What agent.yaml and controller.yaml name, which the operator makes.
const (
	agentConfigMap  = "ferry-agent-config"
	agentSecret     = "ferry-agent-tls"
	ctlSecret       = "ferry-controller-tls"
	agentDaemonSet  = "ferry-agent"
	ctlDeployment   = "ferry-controller"
	agentImage      = "localhost/ferry:latest"
	ctlImage        = "localhost/ferry-controller:latest"
	deployedTimeout = 2 * time.Minute
)

// Deployed is ferry running as deploy/kubernetes's kustomization says:
// the nodes' agents in the DaemonSet's pods, the controller in the
// Deployment's, in place of the lab's processes.
type Deployed struct {
	w *World
	// AgentPIDs are the agents serving each node's control socket, by
	// node.
	AgentPIDs map[string]int
}

// Deploy packs ferryBin and the controller as the manifests' images,
// makes what an operator makes first (the agents' ConfigMap, each lab
// node's settings as NODE.toml; the certificates' Secrets), stops the
// lab's agents on the nodes and its controller, applies the
// kustomization's resources, and returns once each node's agent serves
// its control socket and the controller's pod is ready. Remove puts the
// lab's processes back.
func (w *World) Deploy(ctx context.Context, ferryBin string) (*Deployed, error) {
	cl, err := w.Lab.Kubernetes()
	if err != nil {
		return nil, err
	}
	if err := cl.ImportBinary(ctx, agentImage, ferryBin); err != nil {
		return nil, err
	}
	if err := cl.ImportBinary(ctx, ctlImage, w.ctlBin); err != nil {
		return nil, err
	}
	nodes := w.Lab.Hosts[:2]
	config := map[string]string{}
	agentTLS := map[string][]byte{}
	for _, h := range nodes {
		b, err := w.Lab.AgentConfig(&h)
		if err != nil {
			return nil, err
		}
		config[h.Name+".toml"] = string(b)
		for _, f := range []string{"ca.crt", h.Name + ".crt", h.Name + ".key"} {
			if agentTLS[f], err = os.ReadFile(filepath.Join(h.TLSDir(), f)); err != nil {
				return nil, err
			}
		}
	}
	ctlTLS := map[string][]byte{}
	for _, f := range []string{"ca.crt", "ferry-controller.crt", "ferry-controller.key"} {
		if ctlTLS[f], err = os.ReadFile(filepath.Join(w.tls, f)); err != nil {
			return nil, err
		}
	}
	core := w.Clientset.CoreV1()
	ns := deploy.ControllerNamespace
	if _, err := core.ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: agentConfigMap, Namespace: ns}, Data: config}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	for name, data := range map[string]map[string][]byte{agentSecret: agentTLS, ctlSecret: ctlTLS} {
		if _, err := core.Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}

	w.StopController()
	for _, h := range nodes {
		if err := w.Lab.StopAgent(h.Name); err != nil {
			return nil, err
		}
	}
	d := &Deployed{w: w, AgentPIDs: map[string]int{}}
	if err := applyKustomization(ctx, w); err != nil {
		return d, err
	}
	for _, h := range nodes {
		err := Wait(ctx, deployedTimeout, "the agent pod of "+h.Name+" serving "+h.ControlSock, func() error {
			pid, err := procs.SocketServer(h.ControlSock)
			if err == nil {
				d.AgentPIDs[h.Name] = pid
			}
			return err
		})
		if err != nil {
			return d, fmt.Errorf("%w\n%s", err, w.podsReport(ctx))
		}
	}
	err = Wait(ctx, deployedTimeout, "Deployment "+ctlDeployment+" available", func() error {
		dep, err := w.Clientset.AppsV1().Deployments(ns).Get(ctx, ctlDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if dep.Status.ReadyReplicas < 1 {
			return fmt.Errorf("%d ready", dep.Status.ReadyReplicas)
		}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("%w\n%s", err, w.podsReport(ctx))
	}
	return d, nil
}

// applyKustomization creates the resources kustomization.yaml lists, in
// its order: the CRDs (which Install made) are left as they are.
func applyKustomization(ctx context.Context, w *World) error {
	b, err := deploy.Manifests.ReadFile(deploy.Kustomization)
	if err != nil {
		return err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return fmt.Errorf("%s: %w", deploy.Kustomization, err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	for _, file := range k.Resources {
		if file == deploy.CRD || file == deploy.FollowCRD {
			continue
		}
		if err := apply(ctx, w.Client, scheme, file); err != nil {
			return err
		}
	}
	return nil
}

// podsReport says where ferry's pods are, for a failed wait.
func (w *World) podsReport(ctx context.Context) string {
	list, err := w.Clientset.CoreV1().Pods(deploy.ControllerNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range list.Items {
		fmt.Fprintf(&b, "pod %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, s := range p.Status.ContainerStatuses {
			switch {
			case s.State.Waiting != nil:
				fmt.Fprintf(&b, " (waiting: %s %s)", s.State.Waiting.Reason, s.State.Waiting.Message)
			case s.State.Terminated != nil:
				fmt.Fprintf(&b, " (terminated: %s, exit %d)", s.State.Terminated.Reason, s.State.Terminated.ExitCode)
			}
			if s.LastTerminationState.Terminated != nil {
				fmt.Fprintf(&b, " (last: %s, exit %d: %s)", s.LastTerminationState.Terminated.Reason, s.LastTerminationState.Terminated.ExitCode, s.LastTerminationState.Terminated.Message)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Remove deletes the DaemonSet, the Deployment, the ConfigMap and the
// Secrets, waits until the agents it ran are gone (their pods' end
// signals them), and starts the lab's agents and controller again.
func (d *Deployed) Remove(ctx context.Context) error {
	w := d.w
	ns := deploy.ControllerNamespace
	fg := metav1.DeletePropagationForeground
	del := metav1.DeleteOptions{PropagationPolicy: &fg}
	var errs []error
	gone := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	errs = append(errs,
		gone(w.Clientset.AppsV1().DaemonSets(ns).Delete(ctx, agentDaemonSet, del)),
		gone(w.Clientset.AppsV1().Deployments(ns).Delete(ctx, ctlDeployment, del)))
	errs = append(errs, Wait(ctx, deployedTimeout, "ferry's pods gone", func() error {
		list, err := w.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) > 0 {
			err = fmt.Errorf("%d pods left", len(list.Items))
		}
		return err
	}))
	var pids []int
	for _, pid := range d.AgentPIDs {
		pids = append(pids, pid)
	}
	if left := procs.WaitGone(pids, 30*time.Second); len(left) > 0 {
		errs = append(errs, fmt.Errorf("agents %v still run after their pods' end", left))
		_ = procs.Terminate(left, time.Second)
	}
	errs = append(errs,
		gone(w.Clientset.CoreV1().ConfigMaps(ns).Delete(ctx, agentConfigMap, metav1.DeleteOptions{})),
		gone(w.Clientset.CoreV1().Secrets(ns).Delete(ctx, agentSecret, metav1.DeleteOptions{})),
		gone(w.Clientset.CoreV1().Secrets(ns).Delete(ctx, ctlSecret, metav1.DeleteOptions{})))
	for _, h := range w.Lab.Hosts[:2] {
		if err := cgroups.Remove(filepath.Join(h.CgroupParent, "ferry-agent")); err != nil {
			errs = append(errs, err)
		}
		if err := w.Lab.RestartAgent(ctx, h.Name); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, w.StartController())
	return errors.Join(errs...)
}

// Logs is the tail of each of ferry's pods' container logs, as the nodes'
// kubelets keep them.
func (d *Deployed) Logs(lines int) string {
	cl, err := d.w.Lab.Kubernetes()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, h := range d.w.Lab.Hosts[:2] {
		logs, _ := filepath.Glob(filepath.Join(cl.PodLogs(h.Name), deploy.ControllerNamespace+"_*", "*", "*.log"))
		for _, f := range logs {
			out, _ := os.ReadFile(f)
			fmt.Fprintf(&b, "%s:\n%s\n", f, tail(string(out), lines))
		}
	}
	return b.String()
}

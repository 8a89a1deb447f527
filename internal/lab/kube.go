package lab

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/ferry-migrate/ferry/internal/kubelab"
)

// KubeDir holds the lab's Kubernetes cluster (kubelab.Config.Dir): its
// certificates, configurations, data, logs and the admin's kubeconfig.
var KubeDir = filepath.Join(StateDir, "kube")

// kubeNodes are the lab hosts that are the cluster's nodes (h1, h2: the
// source and destination of a migration), each with a pod subnet of its
// own; the control plane runs in h3's namespace, beside the probe.
const kubeNodes = 2

// upKubernetes brings up the cluster (kubelab.Up): etcd and the control
// plane in h3's namespace, a containerd and a kubelet in each node's.
func (l *Lab) upKubernetes(ctx context.Context) error {
	k, err := kubelab.Up(ctx, l.kubeConfig())
	if err != nil {
		return err
	}
	l.Kubeconfig = k.Kubeconfig()
	return l.save()
}

// kubeConfig is the lab's cluster as kubelab describes it.
func (l *Lab) kubeConfig() kubelab.Config {
	c := kubelab.Config{Dir: KubeDir, Name: "ferry-lab",
		ControlNetNS: l.Hosts[kubeNodes].NetNS, ControlIP: l.Hosts[kubeNodes].Addr}
	for i := range kubeNodes {
		h := &l.Hosts[i]
		c.Nodes = append(c.Nodes, kubelab.Node{Name: h.Name, NetNS: h.NetNS, IP: h.Addr, PodCIDR: fmt.Sprintf("10.92.%d.0/24", h.Index)})
	}
	return c
}

// Kubernetes is the lab's cluster (ferry-lab lab up --kubernetes).
func (l *Lab) Kubernetes() (*kubelab.Cluster, error) {
	if l.Kubeconfig == "" {
		return nil, errors.New("the lab has no Kubernetes cluster (ferry-lab lab up --kubernetes)")
	}
	return kubelab.Attach(l.kubeConfig())
}

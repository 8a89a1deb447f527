package kubecontroller

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentclient "github.com/ferry-migrate/ferry/api/client"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// AnnotationAgent on a node overrides where its ferry agent listens
// (HOST:PORT); AnnotationAgentName the host name its certificate proves.
const (
	AnnotationAgent     = "ferry.dev/agent"
	AnnotationAgentName = "ferry.dev/agent-name"
)

// Agents finds each node's ferry agent: by default at the node's
// InternalIP and Port, proving the node's name, reached with the
// operator's certificate.
type Agents struct {
	Port     int
	Operator *transport.Security
}

// Of is node's agent.
func (a Agents) Of(ctx context.Context, c client.Client, node string) (agentclient.Endpoint, error) {
	var n corev1.Node
	if err := c.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		return agentclient.Endpoint{}, fmt.Errorf("node %s: %w", node, err)
	}
	ep := agentclient.Endpoint{Addr: n.Annotations[AnnotationAgent], Name: n.Annotations[AnnotationAgentName], Operator: a.Operator}
	if ep.Name == "" {
		ep.Name = n.Name
	}
	if ep.Addr == "" {
		for _, addr := range n.Status.Addresses {
			if addr.Type == corev1.NodeInternalIP {
				ep.Addr = net.JoinHostPort(addr.Address, strconv.Itoa(a.Port))
				break
			}
		}
	}
	if ep.Addr == "" {
		return ep, fmt.Errorf("node %s has no InternalIP and no %s annotation: where does its ferry agent listen?", node, AnnotationAgent)
	}
	return ep, nil
}

// Package deploy holds ferry's Kubernetes manifests, as a cluster
// operator applies them (kubectl apply -f deploy/kubernetes/), embedded
// so that the lab and the benchmarks install exactly these.
package deploy

import "embed"

// Manifests are the YAML files of this directory.
//
//go:embed *.yaml
var Manifests embed.FS

// The files: the Migration and FollowPolicy CustomResourceDefinitions,
// the controller's identity and permissions, the RuntimeClass of
// replacement pods.
const (
	CRD          = "crd.yaml"
	FollowCRD    = "followpolicy.yaml"
	RBAC         = "rbac.yaml"
	RuntimeClass = "runtimeclass.yaml"
	// Kustomization lists every resource a cluster operator applies
	// (kubectl apply -k), the agent's DaemonSet and the controller's
	// Deployment among them.
	Kustomization = "kustomization.yaml"
)

// ControllerAccount is the controller's ServiceAccount in RBAC.
const (
	ControllerNamespace = "ferry-system"
	ControllerAccount   = "ferry-controller"
)

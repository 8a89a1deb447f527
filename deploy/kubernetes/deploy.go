// Package deploy holds ferry's Kubernetes manifests, as a cluster
// operator applies them (kubectl apply -f deploy/kubernetes/), embedded
// so that the lab and the benchmarks install exactly these.
package deploy

import "embed"

// Manifests are the YAML files of this directory.
//
//go:embed *.yaml
var Manifests embed.FS

// CRD is the Migration CustomResourceDefinition's file.
const CRD = "crd.yaml"

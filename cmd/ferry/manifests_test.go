package main

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	deploy "github.com/ferry-migrate/ferry/deploy/kubernetes"
)

// The agents' DaemonSet runs `ferry agent` with flags this ferry has, and
// reads its settings and certificates where the pod mounts them.
func TestDaemonSetRunsThisAgent(t *testing.T) {
	b, err := deploy.Manifests.ReadFile("agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostPID || !spec.HostNetwork || len(spec.Containers) != 1 {
		t.Fatalf("hostPID %v hostNetwork %v containers %d: --in-pod needs the node's PID and network namespaces", spec.HostPID, spec.HostNetwork, len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Fatal("the agent's container is not privileged: it could not join the node's mount namespace")
	}
	if len(c.Args) == 0 || c.Args[0] != "agent" {
		t.Fatalf("args %v: want `agent ...`", c.Args)
	}
	cmd := newAgentCmd()
	// $(NODE_NAME) is the kubelet's to expand.
	args := strings.NewReplacer("$(NODE_NAME)", "n1").Replace(strings.Join(c.Args[1:], "\x00"))
	if err := cmd.Flags().Parse(strings.Split(args, "\x00")); err != nil {
		t.Fatalf("ferry agent refuses the DaemonSet's arguments %v: %v", c.Args, err)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, flag := range []string{"config", "tls-dir"} {
		if dir := cmd.Flags().Lookup(flag).Value.String(); !mounts[dir] {
			t.Errorf("--%s %s is not one of the pod's mounts %v", flag, dir, mounts)
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o077 != 0) {
			t.Errorf("Secret volume %s: the agent refuses a key that others may read (defaultMode)", v.Name)
		}
	}
}

package lab

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/runtime/all"
)

// The lab has a part for every registered runtime and none for a kind
// ferry does not register: a new runtime fails here until the lab can
// name it to its agents (and, if it runs workloads, run, remove, inspect
// them).
func TestEveryRegisteredKindHasALabRuntime(t *testing.T) {
	var kinds []string
	for _, rt := range Runtimes() {
		kinds = append(kinds, rt.Kind)
		if rt.AgentArgs == nil {
			t.Errorf("%s: no agent flags: the lab's agents would not find its instance", rt.Kind)
		}
		if rt.Run != nil && (rt.Remove == nil || rt.Inspect == nil) {
			t.Errorf("%s: runs workloads it cannot remove or inspect", rt.Kind)
		}
		if rt.ImportImage != nil && rt.Run == nil {
			t.Errorf("%s: imports an image it runs nothing from", rt.Kind)
		}
	}
	if want := all.Registry.Kinds(); !slices.Equal(kinds, want) {
		t.Errorf("the lab's runtimes %v, the registry's %v", kinds, want)
	}
	if len(runtimes) != len(kinds) {
		t.Errorf("the lab has parts for %d kinds, %d of them registered", len(runtimes), len(kinds))
	}
}

// "" is runc, the lab's own; an unknown kind is refused naming the ones
// the lab runs; kubernetes is known but runs no workload of the lab's.
func TestRuntimeOf(t *testing.T) {
	if rt, err := RuntimeOf(""); err != nil || rt.Kind != "runc" {
		t.Errorf(`RuntimeOf("") = %q, %v`, rt.Kind, err)
	}
	_, err := RuntimeOf("rkt")
	if err == nil || !strings.Contains(err.Error(), "runc, podman, lxc, containerd, docker") {
		t.Errorf("RuntimeOf(rkt): %v", err)
	}
	if got := RunnableKinds(); slices.Contains(got, "kubernetes") || !slices.Contains(got, "docker") {
		t.Errorf("runnable kinds %v", got)
	}
	err = (&Lab{}).RunIn(context.Background(), "kubernetes", "h1", "app", []string{"sleep", "1"})
	if err == nil || !strings.Contains(err.Error(), "runs no kubernetes containers") {
		t.Errorf("RunIn(kubernetes): %v", err)
	}
	if err := (&Lab{}).ImportWorkloadImage(context.Background(), "lxc", "h1"); err == nil || !strings.Contains(err.Error(), "from no image") {
		t.Errorf("an image for lxc: %v", err)
	}
}

// Podman's, containerd's and Docker's lab containers run from the
// workload image; runc's and LXC's from a root filesystem of their own.
func TestNeedsImage(t *testing.T) {
	for kind, want := range map[string]bool{"runc": false, "": false, "podman": true, "lxc": false,
		"containerd": true, "docker": true, "kubernetes": false, "rkt": false} {
		if got := NeedsImage(kind); got != want {
			t.Errorf("NeedsImage(%q) = %v", kind, got)
		}
	}
}

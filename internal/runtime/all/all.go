// Package all is the registry of every runtime ferry drives: the agent,
// ferry check, ferry plan and ferry migrate --help loop over it. A new
// runtime is its adapter package, with a Registration, and a line here.
//
// One explicit list rather than registration from each package's init:
// the order (ferry check's, the help's) is what is written here, and no
// package has to be imported for its side effects.
package all

import (
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
	"github.com/ferry-migrate/ferry/internal/runtime/docker"
	"github.com/ferry-migrate/ferry/internal/runtime/kubernetes"
	"github.com/ferry-migrate/ferry/internal/runtime/lxc"
	"github.com/ferry-migrate/ferry/internal/runtime/podman"
	"github.com/ferry-migrate/ferry/internal/runtime/runc"
)

// Registry holds every runtime kind, in the order ferry lists them.
var Registry = runtime.NewRegistry(
	runc.Registration(),
	podman.Registration(),
	lxc.Registration(),
	containerd.Registration(),
	docker.Registration(),
	kubernetes.Registration(),
)

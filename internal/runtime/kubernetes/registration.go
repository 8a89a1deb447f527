package kubernetes

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/api/restoreshim"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
)

// Registration is Kubernetes' entry in ferry's registry of runtimes. It
// has no tool of its own for ferry check: its runtime is containerd.
func Registration() runtime.Registration {
	return runtime.Registration{
		Kind: "kubernetes",
		Describe: "kubernetes (the agent's --kubernetes: a pod's container, NAME its containerd ID; the destination restores it " +
			"into a replacement pod that its kubelet made, with RuntimeClass ferry: a Migration resource and ferry's controller " +
			"drive this, see docs/KUBERNETES.md)",
		Flags: func(f *pflag.FlagSet) runtime.Maker {
			addr := f.String("kubernetes", "", "the containerd socket of this node's kubelet: its pods' containers move with --runtime kubernetes, and replacement pods (RuntimeClass ferry) are restored here through ferry's shim; empty: no Kubernetes")
			shimDir := f.String("shim-dir", "", "the rendezvous directory of this node's ferry shim (its containerd's "+restoreshim.DirEnv+"; default "+restoreshim.DefaultDir+")")
			return func(env runtime.Env) (runtime.Runtime, error) {
				if *addr == "" {
					return nil, nil // not a node
				}
				ctrd := &containerd.Runtime{Address: *addr, Lazy: env.Features.LazyPages}
				return &Runtime{Containerd: ctrd, RestoreDir: *shimDir, Admission: env.Admission}, nil
			}
		},
		Caps: func(f runtime.Features) runtime.Caps { return (&containerd.Runtime{Lazy: f.LazyPages}).Caps() },
		Options: func(r runtime.Runtime, opts map[string]string) (runtime.Runtime, error) {
			if err := runtime.CheckOptions("kubernetes", opts, api.KubernetesOptionShared); err != nil {
				return nil, err
			}
			k := *r.(*Runtime)
			if s := opts[api.KubernetesOptionShared]; s != "" {
				k.SharedMounts = strings.Split(s, ",")
			}
			return &k, nil
		},
	}
}

package containerd

import (
	"os"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Registration is containerd's entry in ferry's registry of runtimes.
func Registration() runtime.Registration {
	return runtime.Registration{
		Kind:     "containerd",
		Describe: `containerd (the agent's --containerd socket; NAME is the container's ID, in the namespace --namespace names, default "default")`,
		Tools:    []string{"containerd"},
		Flags: func(f *pflag.FlagSet) runtime.Maker {
			addr := f.String("containerd", "", "containerd's socket, whose containers this agent moves and where it restores them (default "+DefaultAddress+", used when it exists)")
			runcRoot := f.String("containerd-runc-root", "", "runc root that containers restored through containerd get (the shim's --root); empty: the one their source used")
			cni := DefaultCNI
			f.StringVar(&cni.ConfDir, "cni-conf-dir", DefaultCNI.ConfDir, "CNI network configuration lists: a containerd container labelled "+LabelCNINetwork+"=NAME is attached at the destination to the network NAME found here")
			f.StringSliceVar(&cni.BinDirs, "cni-bin-dir", DefaultCNI.BinDirs, "directories holding the CNI plugins")
			f.StringVar(&cni.CacheDir, "cni-cache-dir", "", "where CNI keeps its record of each attachment (default CNI's own, /var/lib/cni)")
			return func(env runtime.Env) (runtime.Runtime, error) {
				if *addr == "" {
					if _, err := os.Stat(DefaultAddress); err != nil {
						return nil, nil // no daemon here, and none named
					}
				}
				return &Runtime{Address: *addr, RuncRoot: *runcRoot, CgroupParent: env.CgroupParent, NetNS: env.NetNS,
					StateDir: StateDir(env.StateDir), Admission: env.Admission, Lazy: env.Features.LazyPages, CNI: cni}, nil
			}
		},
		Caps: func(f runtime.Features) runtime.Caps { return (&Runtime{Lazy: f.LazyPages}).Caps() },
	}
}

package lxc

import (
	"os/exec"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Registration is LXC's entry in ferry's registry of runtimes.
func Registration() runtime.Registration {
	return runtime.Registration{
		Kind:     "lxc",
		Describe: "lxc (under the agent's --lxc-path)",
		Tools:    []string{"lxc-start", "lxc-info"},
		Flags: func(f *pflag.FlagSet) runtime.Maker {
			path := f.String("lxc-path", "", "where LXC containers live (lxc-* -P); empty: LXC's default, /var/lib/lxc")
			return func(env runtime.Env) (runtime.Runtime, error) {
				if _, err := exec.LookPath("lxc-checkpoint"); err != nil {
					return nil, nil // not installed
				}
				lx := New(*path)
				lx.Admission, lx.ContainerNetNS, lx.Lazy = env.Admission, env.NetNS, env.Features.LazyPages
				if env.SegmentBridge != "" {
					lx.SharedBridges = []string{env.SegmentBridge}
				}
				return lx, nil
			}
		},
		Caps: func(f runtime.Features) runtime.Caps { return (&Runtime{Lazy: f.LazyPages}).Caps() },
	}
}

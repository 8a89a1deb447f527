package podman

import (
	"os/exec"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Registration is Podman's entry in ferry's registry of runtimes.
func Registration() runtime.Registration {
	return runtime.Registration{
		Kind:     "podman",
		Describe: "podman",
		Tools:    []string{"podman"},
		Flags: func(f *pflag.FlagSet) runtime.Maker {
			dir := f.String("podman-dir", "", "a Podman instance of this agent's own under this directory (storage, run, network config); empty: the machine's Podman")
			return func(env runtime.Env) (runtime.Runtime, error) {
				if _, err := exec.LookPath("podman"); err != nil {
					return nil, nil // not installed
				}
				pm := New(Host{Dir: *dir, NetNS: env.NetNS})
				pm.Lazy, pm.Admission = env.Features.LazyPages, env.Admission
				return pm, nil
			}
		},
		Caps: func(f runtime.Features) runtime.Caps { return (&Runtime{Lazy: f.LazyPages}).Caps() },
	}
}

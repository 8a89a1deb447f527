package docker

import (
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Registration is Docker's entry in ferry's registry of runtimes.
func Registration() runtime.Registration {
	return runtime.Registration{
		Kind: "docker",
		Describe: "docker (the agent's --docker; restores need dockerd --experimental, and Docker's restore copies the images twice: " +
			"all of memory in cold and pre-copy, next to nothing in post-copy and hybrid)",
		Tools: []string{"dockerd"}, // the daemon's version; a CLI may be newer
		Flags: func(f *pflag.FlagSet) runtime.Maker {
			host := f.String("docker", "", "dockerd's address (unix://PATH), whose containers this agent moves and where it restores them (default "+DefaultHost+", used when it exists; restores need dockerd --experimental)")
			execRoot := f.String("docker-exec-root", "", "dockerd's --exec-root, where runc keeps its containers (default "+DefaultExecRoot+")")
			return func(env runtime.Env) (runtime.Runtime, error) {
				if *host == "" {
					if _, err := os.Stat(strings.TrimPrefix(DefaultHost, "unix://")); err != nil {
						return nil, nil // no daemon here, and none named
					}
				}
				return &Runtime{Host: *host, ExecRoot: *execRoot, NetNS: env.NetNS, Admission: env.Admission, Lazy: env.Features.LazyPages}, nil
			}
		},
		Caps: func(f runtime.Features) runtime.Caps { return CapsFor(f.LazyPages, f.StoppedRestore) },
	}
}

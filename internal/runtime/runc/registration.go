package runc

import (
	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/api"
	driver "github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Registration is runc's entry in ferry's registry of runtimes.
func Registration() runtime.Registration {
	return runtime.Registration{
		Kind:     "runc",
		Describe: "runc (under the agent's --runc-root, default /run/runc, or --runc-root here)",
		Tools:    []string{"runc"},
		Required: true,
		Install:  "apt-get install runc (ferry is tested with runc 1.1.5)",
		Flags: func(f *pflag.FlagSet) runtime.Maker {
			root := f.String("runc-root", "/run/runc", "runc root whose containers this agent moves (runc --root), and where it restores runc containers")
			imageRoots := f.StringSlice("image-root", nil, "directories holding unpacked images (repeatable): a runc container whose root is an overlay over an image below one of them moves only its own writable layer; none: such containers are refused here")
			return func(env runtime.Env) (runtime.Runtime, error) {
				return &Runtime{Host: driver.Host{Root: *root}, BundleRoot: env.BundleRoot, Admission: env.Admission, ImageRoots: *imageRoots,
					CgroupParent: env.CgroupParent, NetNS: env.NetNS, Lazy: env.Features.LazyPages, DirtyTracking: env.Features.DirtyTracking}, nil
			}
		},
		Caps: func(f runtime.Features) runtime.Caps {
			return (&Runtime{Lazy: f.LazyPages, DirtyTracking: f.DirtyTracking}).Caps()
		},
		Options: withOptions,
	}
}

// OptionRoot is the request option naming the runc root a container
// lives under (ferry migrate --runc-root).
const OptionRoot = api.RuncOptionRoot

// withOptions is rt under another runc root.
func withOptions(rt runtime.Runtime, o map[string]string) (runtime.Runtime, error) {
	if err := runtime.CheckOptions("runc", o, OptionRoot); err != nil {
		return nil, err
	}
	rc := *rt.(*Runtime)
	if root := o[OptionRoot]; root != "" {
		rc.Root = root
	}
	return &rc, nil
}

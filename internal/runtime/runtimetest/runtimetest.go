// Package runtimetest is a kind of runtime that only tests register
// (all.Registry.With(runtimetest.Registration())): it shows that a new
// runtime is one package whose Registration the agent, ferry check, ferry
// plan and ferry migrate --help pick up with nothing else changed. It
// moves nothing: its containers are a list it is given.
package runtimetest

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Kind is the test runtime's kind.
const Kind = "toy"

// Runtime lists Containers under Dir; what a migration would ask of it
// is not implemented (the embedded nil Runtime).
type Runtime struct {
	runtime.Runtime
	// Dir is its --toy-dir, or a request's "dir" option.
	Dir        string
	Env        runtime.Env
	Containers []runtime.Container
}

// Kind is Kind.
func (r *Runtime) Kind() string { return Kind }

// Caps can do everything but pre-dumps.
func (r *Runtime) Caps() runtime.Caps {
	return runtime.Caps{Freeze: true, LazyDump: r.Env.Features.LazyPages, LazyRestore: r.Env.Features.LazyPages, RestoreStopped: true}
}

// Inspect finds a container of Containers.
func (r *Runtime) Inspect(_ context.Context, name string) (*runtime.Container, error) {
	for _, c := range r.Containers {
		if c.Name == name {
			return &c, nil
		}
	}
	return nil, runtime.ErrNotFound
}

// List is Containers.
func (r *Runtime) List(context.Context) ([]runtime.Container, error) { return r.Containers, nil }

// Registration registers the kind with a flag of its own (--toy-dir), a
// tool for ferry check (toy-tool) and an option (dir).
func Registration() runtime.Registration {
	return runtime.Registration{
		Kind:     Kind,
		Describe: "toy (a test's runtime)",
		Tools:    []string{"toy-tool"},
		Flags: func(f *pflag.FlagSet) runtime.Maker {
			dir := f.String("toy-dir", "/run/toy", "where toy containers live")
			return func(env runtime.Env) (runtime.Runtime, error) {
				return &Runtime{Dir: *dir, Env: env, Containers: []runtime.Container{{Name: "t1", ID: "t1", Status: "running"}}}, nil
			}
		},
		Caps: func(f runtime.Features) runtime.Caps { return (&Runtime{Env: runtime.Env{Features: f}}).Caps() },
		Options: func(rt runtime.Runtime, o map[string]string) (runtime.Runtime, error) {
			if err := runtime.CheckOptions(Kind, o, "dir"); err != nil {
				return nil, err
			}
			t := *rt.(*Runtime)
			t.Dir = o["dir"]
			return &t, nil
		},
	}
}

package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/internal/admission"
)

// Registration is what ferry knows of one kind of runtime, apart from the
// adapter itself: the agent's flags and how it makes the adapter, what
// ferry check asks of the host, what a plan assumes it can do, and the
// options a request may give it. Each adapter package has one; package
// all lists them, so a new runtime is its package plus a line there.
type Registration struct {
	// Kind is the adapter's Kind, the name --runtime takes.
	Kind string
	// Describe says, for ferry migrate --help, what a container's NAME is
	// in this runtime and where the agent finds it.
	Describe string
	// Flags adds the runtime's own flags to the agent's (and so to its
	// configuration file) and returns what makes the runtime from them
	// once they are parsed. Nil: the runtime has no flags and no maker,
	// and no agent offers it.
	Flags func(fs *pflag.FlagSet) Maker
	// Tools are the programs whose `--version` tells which release is
	// installed, first found first (ferry check, ferry version). None:
	// ferry check does not look for the runtime.
	Tools []string
	// Required: a host without it cannot take part in any migration;
	// Install says how to install it (ferry check's fix).
	Required bool
	Install  string
	// Caps is what the runtime can do on a host that offers f.
	Caps func(f Features) Caps
	// Options returns a copy of r with a request's options for this kind
	// applied (RequestOptions); nil: the runtime takes none.
	Options func(r Runtime, opts map[string]string) (Runtime, error)
}

// Maker makes the runtime on the agent's host; a nil Runtime and a nil
// error mean the runtime is not installed here.
type Maker func(env Env) (Runtime, error)

// Env is what an agent tells every runtime it makes about its host.
type Env struct {
	// StateDir is the agent's state directory.
	StateDir string
	// BundleRoot holds the bundles of containers restored here (OCI
	// runtimes that run from a bundle).
	BundleRoot string
	// CgroupParent is the cgroup restored containers live under.
	CgroupParent string
	// NetNS is the network namespace restored containers join when their
	// source joined one ferry does not rebuild ("": the host's).
	NetNS string
	// SegmentBridge is the host's bridge to the shared L2 segment ("": none).
	SegmentBridge string
	// Admission is what this host accepts of incoming containers.
	Admission admission.Policy
	// Features are what this host's kernel and CRIU offer.
	Features Features
}

// Features are what a host offers that runtimes' Caps depend on.
type Features struct {
	// LazyPages: CRIU's lazy dumps and restores work (uffd, pipe size).
	LazyPages bool
	// DirtyTracking: CRIU's pre-dump works (soft-dirty).
	DirtyTracking bool
	// StoppedRestore: the runtime's daemon offers ferry's runtime that
	// leaves a restored copy stopped (Docker's ferry-runc).
	StoppedRestore bool
}

// PlanFeatures are what a plan assumes of a host: lazy pages and ferry's
// stopped restore, but no pre-dump (ferry plan predicts content pre-copy).
var PlanFeatures = Features{LazyPages: true, StoppedRestore: true}

// Registry is the kinds of runtimes ferry drives, in registration order.
type Registry struct {
	mu   sync.RWMutex
	regs []Registration
}

// NewRegistry holds regs; see Register.
func NewRegistry(regs ...Registration) *Registry {
	r := &Registry{}
	for _, g := range regs {
		r.Register(g)
	}
	return r
}

// Register adds a kind. A kind registered twice, or without a name or
// Caps, is a programming error: it panics, as at start.
func (r *Registry) Register(g Registration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g.Kind == "" || g.Caps == nil {
		panic("runtime: a registration needs a Kind and Caps")
	}
	if slices.ContainsFunc(r.regs, func(o Registration) bool { return o.Kind == g.Kind }) {
		panic(fmt.Sprintf("runtime: kind %q registered twice", g.Kind))
	}
	r.regs = append(r.regs, g)
}

// With is a copy of r with regs added (tests register a kind of their own).
func (r *Registry) With(regs ...Registration) *Registry {
	return NewRegistry(append(r.All(), regs...)...)
}

// All returns the registrations, in registration order.
func (r *Registry) All() []Registration {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.regs)
}

// Get returns kind's registration.
func (r *Registry) Get(kind string) (Registration, bool) {
	for _, g := range r.All() {
		if g.Kind == kind {
			return g, true
		}
	}
	return Registration{}, false
}

// Kinds names the registered kinds, in registration order.
func (r *Registry) Kinds() []string {
	var ks []string
	for _, g := range r.All() {
		ks = append(ks, g.Kind)
	}
	return ks
}

// KindList is Kinds for a help text: "runc, podman or lxc".
func (r *Registry) KindList(last string) string { return JoinKinds(r.Kinds(), last) }

// JoinKinds names kinds for a help text: "runc, podman or lxc" with last "or".
func JoinKinds(kinds []string, last string) string {
	if len(kinds) < 2 {
		return strings.Join(kinds, "")
	}
	return strings.Join(kinds[:len(kinds)-1], ", ") + " " + last + " " + kinds[len(kinds)-1]
}

// Makers adds every kind's flags to fs and returns their makers, by kind.
func (r *Registry) Makers(fs *pflag.FlagSet) map[string]Maker {
	ms := map[string]Maker{}
	for _, g := range r.All() {
		if g.Flags != nil {
			if m := g.Flags(fs); m != nil {
				ms[g.Kind] = m
			}
		}
	}
	return ms
}

// NewSet makes, from the makers Makers returned, the runtimes present on
// this host. A runtime that fails to start is left out and its error
// returned with the others', so one broken runtime costs only its own
// containers.
func NewSet(makers map[string]Maker, env Env) (Set, error) {
	set := Set{}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(makers)) {
		rt, err := makers[k](env)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("runtime %s: %w", k, err))
		case rt != nil:
			set[k] = rt
		}
	}
	return set, errors.Join(errs...)
}

// RequestOptions are a request's options per kind (api.Request's
// RuntimeOptions): options for the runtime named, say runc's root.
type RequestOptions = map[string]map[string]string

// WithOptions returns s with each kind's options applied (a copy of the
// runtimes concerned; s itself is unchanged). Options for a kind this host
// lacks, or one that takes none, are refused.
func (s Set) WithOptions(reg *Registry, opts RequestOptions) (Set, error) {
	if len(opts) == 0 {
		return s, nil
	}
	out := maps.Clone(s)
	for kind, o := range opts {
		if len(o) == 0 {
			continue
		}
		rt, err := s.Get(kind)
		if err != nil {
			return nil, err
		}
		g, ok := reg.Get(kind)
		if !ok || g.Options == nil {
			return nil, fmt.Errorf("runtime %s takes no options (given %v)", kind, o)
		}
		if out[kind], err = g.Options(rt, o); err != nil {
			return nil, fmt.Errorf("runtime %s: %w", kind, err)
		}
	}
	return out, nil
}

// CheckOptions refuses keys that opts has and known lacks: a typo, or an
// option of a newer ferry, must not pass silently.
func CheckOptions(kind string, opts map[string]string, known ...string) error {
	for k := range opts {
		if !slices.Contains(known, k) {
			return fmt.Errorf("%s has no option %q (it has: %s)", kind, k, strings.Join(known, ", "))
		}
	}
	return nil
}

// List lists every runtime's containers (at once: each asks its own
// tool). A runtime that cannot answer is left out and its error returned
// with the others', so one stopped daemon hides only its own containers.
func (s Set) List(ctx context.Context) ([]Container, error) {
	kinds := s.sorted()
	lists := make([][]Container, len(kinds))
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, k := range kinds {
		wg.Go(func() { lists[i], errs[i] = s[k].List(ctx) })
	}
	wg.Wait()
	var out []Container
	var bad []error
	for i, k := range kinds {
		if errs[i] != nil {
			bad = append(bad, fmt.Errorf("%s: %w", k, errs[i]))
			continue
		}
		for _, c := range lists[i] {
			c.Runtime = k
			out = append(out, c)
		}
	}
	return out, errors.Join(bad...)
}

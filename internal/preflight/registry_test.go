package preflight

import (
	"context"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/runtime/runtimetest"
)

// A runtime registered (by the test only) is looked for, listed with its
// modes, and printed.
func TestRegisteredRuntime(t *testing.T) {
	p := goodHost()
	p.Registry = all.Registry.With(runtimetest.Registration())
	version := p.RuntimeVersion
	p.RuntimeVersion = func(ctx context.Context, kind string) (string, bool) {
		if kind == runtimetest.Kind {
			return "0.1", true
		}
		return version(ctx, kind)
	}
	r := p.Run(context.Background())
	if v := r.Runtimes[runtimetest.Kind]; v == nil || *v != "0.1" {
		t.Fatalf("runtimes = %v", r.Runtimes)
	}
	if m := strings.Join(r.Modes[runtimetest.Kind], ","); !strings.Contains(m, "postcopy") {
		t.Errorf("modes = %q", m)
	}
	if !strings.Contains(r.Text(), "toy              0.1  modes: ") {
		t.Errorf("text:\n%s", r.Text())
	}
}

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/runtime/docker"
	"github.com/ferry-migrate/ferry/internal/runtime/runtimetest"
)

// A plan for a runtime offers only what it can run and counts what its
// restore costs: LXC gets no lazy mode; Docker, whose restore copies the
// images, fits a 1 s budget in a live mode where it restores lazily
// (pre-copy from the destination's own images), and in none without
// ferry's runtime (cold and pre-copy then copy all of memory twice).
func TestPlanPerRuntime(t *testing.T) {
	in := model.Inputs{MemoryBytes: 256 << 20, DirtyRatePagesPerSec: 100, BandwidthBps: 125e6}
	p := model.DefaultProfile()
	for _, kind := range all.Registry.Kinds() {
		caps, err := planCaps(all.Registry, kind)
		if err != nil {
			t.Fatal(err)
		}
		out := plan(p, engine.PlanFor(in, caps), time.Second)
		lazy := 0
		for _, q := range out.Predictions {
			if q.Mode == model.ModePostcopy || q.Mode == model.ModeHybrid {
				lazy++
			}
		}
		switch kind {
		case "docker":
			if out.Recommended != model.ModePrecopy && out.Recommended != model.ModePostcopy && out.Recommended != model.ModeHybrid {
				t.Errorf("docker within 1 s: recommended %q (%s)", out.Recommended, out.Reason)
			}
		default:
			if lazy != 2 {
				t.Errorf("%s: %d lazy predictions", kind, lazy)
			}
		}
	}
	if out := plan(p, engine.PlanFor(in, docker.CapsFor(true, false)), time.Second); out.Recommended != "" {
		t.Errorf("docker without ferry-runc within 1 s: recommended %q (%s)", out.Recommended, out.Reason)
	}
	root := newRootCmd()
	root.SetArgs([]string{"plan", "--memory", "64M", "--bandwidth", "1gbit", "--runtime", "nope"})
	root.SilenceErrors, root.SilenceUsage = true, true
	if err := root.Execute(); err == nil {
		t.Error("plan --runtime nope accepted")
	}
}

// A runtime registered (by the test only) is one ferry plan plans for and
// ferry migrate --help names.
func TestPlanRegisteredRuntime(t *testing.T) {
	reg := all.Registry.With(runtimetest.Registration())
	caps, err := planCaps(reg, runtimetest.Kind)
	if err != nil || !caps.LazyRestore {
		t.Fatalf("caps %+v, %v", caps, err)
	}
	if _, err := planCaps(reg, "nothing"); err == nil || !strings.Contains(err.Error(), "docker, kubernetes or toy") {
		t.Errorf("unknown kind: %v", err)
	}
	if h := runtimesHelp(reg); !strings.Contains(strings.Join(strings.Fields(h), " "), "toy (a test's runtime)") {
		t.Errorf("help:\n%s", h)
	}
}

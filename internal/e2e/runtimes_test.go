package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// plainRunc is a container started with plain `runc run -d`, as a user
// would: its own runc root, a bundle outside ferry's state, the rootfs
// where root.path says.
type plainRunc struct {
	rc     runc.Host
	name   string
	bundle string
}

// startPlainRunc starts memhog under runc root on h1, with its bundle in a
// temp dir and its rootfs at rootPath (relative to the bundle or
// absolute); stdout is a pipe this test holds when pipe is set, else
// /dev/null.
func startPlainRunc(t *testing.T, l *lab.Lab, bin, root, name, rootPath string, pipe bool, edits ...func(*specs.Spec)) *plainRunc {
	t.Helper()
	h := &l.Hosts[0]
	bundle := t.TempDir()
	rootfsDir := rootPath
	if !filepath.IsAbs(rootPath) {
		rootfsDir = filepath.Join(bundle, rootPath)
	}
	if err := lab.BuildRootfsFrom(rootfsDir, filepath.Dir(bin)); err != nil {
		t.Fatal(err)
	}
	spec := runc.NewSpec(runc.SpecOptions{
		Args:     []string{"/bin/memhog", "--memory", "64M", "--dirty-rate", "200", "--port", memhogPort},
		Hostname: name, CgroupsPath: "/plain-runc/" + name, NetNS: h.NetNS,
	})
	spec.Root.Path = rootPath
	for _, e := range edits {
		e(spec)
	}
	if err := runc.WriteSpec(bundle, spec); err != nil {
		t.Fatal(err)
	}
	p := &plainRunc{rc: runc.Host{Root: root}, name: name, bundle: bundle}
	t.Cleanup(func() { _ = p.rc.Delete(context.Background(), name) })
	// The container inherits runc's stdio: a pipe the test reads would keep
	// runc's caller waiting as long as the container lives, so runc's own
	// messages go to --log.
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	logPath := filepath.Join(bundle, "runc.log")
	cmd := exec.Command("runc", "--root", root, "--log", logPath, "run", "--detach", "--bundle", bundle, name)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	if pipe {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		cmd.Stdout = w
		defer w.Close()
	}
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("runc run: %v: %s", err, b)
	}
	return p
}

func (p *plainRunc) status(t *testing.T) string {
	t.Helper()
	st, err := p.rc.State(context.Background(), p.name)
	if errors.Is(err, runc.ErrNotFound) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.Status
}

// TestPlainRunc moves containers that plain runc runs, under a runc root
// of their own, with bundles anywhere and root.path relative or absolute,
// stdout to /dev/null or to a pipe: found by --runtime auto and by
// --runtime runc with --runc-root, in a live mode and cold.
func TestPlainRunc(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	root := filepath.Join(t.TempDir(), "runc-root")
	cases := []struct {
		name, rootPath string
		pipe           bool
		req            engine.Request
	}{
		{"rel", "root", false, engine.Request{Mode: engine.ModePrecopy, Runtime: "runc", RuntimeOptions: runcRootOpts(root)}},
		{"abs", filepath.Join(t.TempDir(), "elsewhere"), true, engine.Request{Mode: engine.ModePostcopy, Runtime: "runc", RuntimeOptions: runcRootOpts(root)}},
		{"cold", "rootfs", false, engine.Request{Mode: engine.ModeCold, RuntimeOptions: runcRootOpts(root)}}, // --runtime auto
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startPlainRunc(t, l, bin, root, "plain-"+c.name, c.rootPath, c.pipe)
			probe, _, err := bench.StartProbe(context.Background(), &l.Hosts[2], bin,
				[]string{l.Hosts[0].Addr + ":" + memhogPort, l.Hosts[1].Addr + ":" + memhogPort}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			req := c.req
			req.Container, req.To = p.name, l.Hosts[1].AgentAddr
			rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), req, nil)
			time.Sleep(200 * time.Millisecond)
			pr, perr := probe.Stop()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Hosts[1].Runc().Delete(context.Background(), p.name) })
			if !rep.OK {
				t.Fatalf("migration failed: %s (at %s)", rep.Error, rep.FailedAt)
			}
			if rep.Runtime != "runc" || rep.SourceState != "removed" {
				t.Errorf("report: runtime %q, source %q", rep.Runtime, rep.SourceState)
			}
			if perr != nil || !pr.StateOK {
				t.Fatalf("workload state lost: %+v %v", pr, perr)
			}
			if got := p.status(t); got != "absent" {
				t.Errorf("the source's runc root still lists the container: %s", got)
			}
			if got := status(t, &l.Hosts[1], p.name); got != "running" {
				t.Errorf("destination runc lists it %s, want running", got)
			}
		})
	}
}

// TestPlainRuncBadInput: a container missing from the named runc root, an
// unknown runtime, a technique the runtime cannot do here: each refused
// before anything is frozen, with an error that says why.
func TestPlainRuncBadInput(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	root := filepath.Join(t.TempDir(), "runc-root")
	p := startPlainRunc(t, l, bin, root, "plain-bad", "rootfs", false)
	type badCase struct {
		req  engine.Request
		want string
	}
	cases := []badCase{
		{engine.Request{Container: "nobody", Mode: engine.ModeCold, Runtime: "runc", RuntimeOptions: runcRootOpts(root)}, "no container"},
		{engine.Request{Container: p.name, Mode: engine.ModeCold, Runtime: "rkt"}, `runtime "rkt" is not available`},
		{engine.Request{Container: p.name, Mode: engine.ModeCold, Runtime: "runc"}, "no container"}, // not under the agent's root
	}
	// A config.json whose hook would run as root on the destination.
	hooked := startPlainRunc(t, l, bin, root, "plain-hooked", "rootfs", false, func(s *specs.Spec) {
		s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/true"}}}           //nolint:staticcheck // runc still runs the deprecated hooks
		s.Process.Args = []string{"/bin/memhog", "--memory", "16M", "--port", "7001"} // beside plain-bad's
	})
	cases = append(cases, badCase{engine.Request{Container: hooked.name, Mode: engine.ModeCold, RuntimeOptions: runcRootOpts(root)}, "OCI hooks"})
	if !criu.ProbeFeatures(context.Background()).DirtyTracking {
		cases = append(cases, badCase{engine.Request{Container: p.name, Mode: engine.ModePrecopy, RuntimeOptions: runcRootOpts(root),
			Precopy: engine.PrecopyOptions{Engine: engine.PrecopyNative}}, "soft-dirty"})
	}
	for _, c := range cases {
		c.req.To = l.Hosts[1].AgentAddr
		rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), c.req, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Refused by the source while it prepares, or by the destination
		// on the offer: either way before anything froze.
		if rep.OK || !strings.Contains(rep.Error, c.want) ||
			!(strings.HasPrefix(rep.FailedAt, "prepare") || strings.HasPrefix(rep.FailedAt, "destination")) || rep.SourceState != "" {
			t.Errorf("%+v: ok=%v at %q, source %q: %s (want %q)", c.req, rep.OK, rep.FailedAt, rep.SourceState, rep.Error, c.want)
		}
		for _, q := range []*plainRunc{p, hooked} {
			if got := q.status(t); got != "running" {
				t.Fatalf("after a refused request %s is %s", q.name, got)
			}
		}
	}
}

// runcRootOpts is a request's options naming a runc root (--runc-root).
func runcRootOpts(root string) map[string]map[string]string {
	return map[string]map[string]string{"runc": {api.RuncOptionRoot: root}}
}

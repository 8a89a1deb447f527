package agent

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/runtime/runtimetest"
)

// A runtime registered (here only, by the test) gets its flag, is made
// with the host's settings, lists its containers in the agent's status
// and takes a request's options; nothing else knows of it.
func TestRegisteredRuntime(t *testing.T) {
	reg := all.Registry.With(runtimetest.Registration())
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	makers := reg.Makers(fs)
	if err := fs.Parse([]string{"--toy-dir", "/srv/toy", "--runc-root", "/run/other"}); err != nil {
		t.Fatal(err)
	}
	a := &Agent{Registry: reg, Runtimes: map[string]runtime.Maker{runtimetest.Kind: makers[runtimetest.Kind]},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), dst: &engine.Destination{}}
	a.Host.NetNS = "/run/netns/h1"
	a.feats.LazyPages = true
	a.set = a.newRuntimes()
	toy, ok := a.set[runtimetest.Kind].(*runtimetest.Runtime)
	if !ok || toy.Dir != "/srv/toy" || toy.Env.NetNS != "/run/netns/h1" || !toy.Caps().LazyDump {
		t.Fatalf("set = %v, toy %+v", a.set, toy)
	}
	if _, ok := makers["runc"]; !ok {
		t.Error("runc's maker is missing beside the test's kind")
	}

	st, err := a.status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Containers) != 1 || st.Containers[0].Name != "t1" || st.Containers[0].Runtime != runtimetest.Kind {
		t.Errorf("status containers = %+v", st.Containers)
	}

	set, err := a.runtimes(runtime.RequestOptions{runtimetest.Kind: {"dir": "/elsewhere"}})
	if err != nil {
		t.Fatal(err)
	}
	if d := set[runtimetest.Kind].(*runtimetest.Runtime).Dir; d != "/elsewhere" || toy.Dir != "/srv/toy" {
		t.Errorf("with options: dir %q, the agent's own %q", d, toy.Dir)
	}
	for _, bad := range []runtime.RequestOptions{
		{runtimetest.Kind: {"root": "/x"}}, // no such option
		{"podman": {"root": "/x"}},         // not on this host
	} {
		if _, err := a.runtimes(bad); err == nil {
			t.Errorf("options %v: no error", bad)
		}
	}
}

package containerd

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

func TestNames(t *testing.T) {
	for _, c := range []struct{ name, ns, id string }{
		{"web", "default", "web"},
		{"prod/web", "prod", "web"},
		{"default/web", "default", "web"},
	} {
		ns, id := SplitName(c.name)
		if ns != c.ns || id != c.id {
			t.Errorf("SplitName(%q) = %q, %q", c.name, ns, id)
		}
		if got, want := JoinName(ns, id), strings.TrimPrefix(c.name, "default/"); got != want {
			t.Errorf("JoinName(%q, %q) = %q, want %q", ns, id, got, want)
		}
	}
}

// TestInspectRefusesNamesAndAbsentDaemons: a name containerd cannot have,
// or a daemon that is not there, is "not found" (so --runtime auto looks
// on in the other runtimes), not a failure.
func TestInspectNotFoundWithoutDaemon(t *testing.T) {
	r := &Runtime{Address: t.TempDir() + "/none.sock"}
	for _, name := range []string{"web", "bad name", "a/b/c"} {
		if _, err := r.Inspect(t.Context(), name); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Inspect(%q) without a daemon: %v", name, err)
		}
	}
}

func TestRecordRoundTripsRuntimeOptions(t *testing.T) {
	anyOpts, err := typeurl.MarshalAny(&options.Options{Root: "/var/lib/x/runc", SystemdCgroup: true})
	if err != nil {
		t.Fatal(err)
	}
	rec := record{Namespace: "prod", ID: "web", Image: "docker.io/library/redis:7", ImageDigest: "sha256:00",
		Snapshotter: "overlayfs", Runtime: "io.containerd.runc.v2", OptionsType: anyOpts.GetTypeUrl(), Options: anyOpts.GetValue()}
	b, _ := json.Marshal(rec)
	got, err := parseRecord(&runtime.Container{Meta: map[string][]byte{metaRecord: b}})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := runcOptions(got.OptionsType, got.Options)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := opts.(*options.Options); !ok || o.Root != "/var/lib/x/runc" || !o.SystemdCgroup {
		t.Fatalf("options after the trip: %#v", opts)
	}
	if root := runcRoot(opts, "prod"); root != "/var/lib/x/runc/prod" {
		t.Errorf("runc root %q", root)
	}
	if root := runcRoot(nil, "default"); root != "/run/containerd/runc/default" {
		t.Errorf("default runc root %q", root)
	}
	for _, bad := range []string{`{"namespace":"../x","id":"web"}`, `{"namespace":"prod","id":"../../etc"}`, `{`} {
		if _, err := parseRecord(&runtime.Container{Meta: map[string][]byte{metaRecord: []byte(bad)}}); err == nil {
			t.Errorf("record %s accepted", bad)
		}
	}
	if _, err := parseRecord(&runtime.Container{}); err == nil {
		t.Error("a container without a record accepted")
	}
}

func TestAdaptSpecForThisHost(t *testing.T) {
	src := specs.Spec{Linux: &specs.Linux{CgroupsPath: "/default/web",
		Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace, Path: "/var/run/netns/h1"}}},
		Annotations: map[string]string{"org.criu.config": "/etc/evil.conf", "keep": "me"}}
	b, _ := json.Marshal(src)
	r := &Runtime{CgroupParent: "ferry-h2", NetNS: "/var/run/netns/h2"}
	rec := &record{Namespace: "prod", ID: "web"}
	s, err := r.adaptSpec(b, rec, "", "/state/prod/web/criu.conf")
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.CgroupsPath != "/ferry-h2/prod-web" || s.Linux.Namespaces[1].Path != "/var/run/netns/h2" {
		t.Errorf("cgroup %q, netns %q", s.Linux.CgroupsPath, s.Linux.Namespaces[1].Path)
	}
	if s.Annotations["org.criu.config"] != "/state/prod/web/criu.conf" || s.Annotations["keep"] != "me" {
		t.Errorf("annotations %v", s.Annotations)
	}
	// Without a parent the source's cgroup stays; without a namespace a
	// container that joins one is refused.
	r = &Runtime{}
	if s, err := r.adaptSpec(b, rec, "/var/run/netns/rebuilt", "c"); err != nil || s.Linux.CgroupsPath != "/default/web" || s.Linux.Namespaces[1].Path != "/var/run/netns/rebuilt" {
		t.Errorf("no parent: %+v %v", s, err)
	}
	if _, err := r.adaptSpec(b, rec, "", "c"); err == nil {
		t.Error("a destination without a netns accepted a container that joins one")
	}
}

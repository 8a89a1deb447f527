package runc

import (
	"encoding/json"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

func TestAdaptSpecRebasesForTheDestination(t *testing.T) {
	src := specs.Spec{Root: &specs.Root{Path: "/srv/app/root"}, Linux: &specs.Linux{
		CgroupsPath: "/ferry-h1/app",
		Namespaces:  []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace, Path: "/var/run/netns/h1"}},
	}, Annotations: map[string]string{"org.criu.config": "/etc/evil.conf", "keep": "me"}}
	b, _ := json.Marshal(src)
	r := &Runtime{CgroupParent: "ferry-h2", NetNS: "/var/run/netns/h2"}
	c := &runtime.Container{Name: "app", Spec: b}
	adapt := func(netns string) specs.Spec {
		t.Helper()
		out, err := r.adaptSpec(c, netns, "/b/app/criu.conf")
		if err != nil {
			t.Fatal(err)
		}
		var got specs.Spec
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := adapt("")
	if got.Root.Path != "rootfs" || got.Linux.CgroupsPath != "/ferry-h2/app" || got.Linux.Namespaces[1].Path != "/var/run/netns/h2" {
		t.Errorf("rebased spec: root %q cgroups %q netns %q", got.Root.Path, got.Linux.CgroupsPath, got.Linux.Namespaces[1].Path)
	}
	if got.Annotations["org.criu.config"] != "/b/app/criu.conf" || got.Annotations["keep"] != "me" {
		t.Errorf("annotations: %v (the source's CRIU config file must give way to ferry's)", got.Annotations)
	}
	if got := adapt("/var/run/netns/ferry-c-h2-app"); got.Linux.Namespaces[1].Path != "/var/run/netns/ferry-c-h2-app" {
		t.Errorf("the rebuilt namespace was not used: %q", got.Linux.Namespaces[1].Path)
	}
	r.NetNS = ""
	if _, err := r.adaptSpec(c, "", ""); err == nil {
		t.Error("a destination without a netns accepted a container that joins one")
	}
	if _, err := r.adaptSpec(&runtime.Container{Name: "x", Spec: []byte("{")}, "", ""); err == nil {
		t.Error("a bad config.json was accepted")
	}
}

package runc

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func nsPath(s *specs.Spec, typ specs.LinuxNamespaceType) (string, bool) {
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == typ {
			return ns.Path, true
		}
	}
	return "", false
}

func TestNewSpecContents(t *testing.T) {
	s := NewSpec(SpecOptions{
		Args:        []string{"sleep", "1000"},
		Env:         []string{"FOO=bar"},
		Hostname:    "c1",
		CgroupsPath: "/ferry-h1/c1",
		NetNS:       "/var/run/netns/ferry-h1",
	})
	if s.Version != "1.0.2" {
		t.Errorf("version %q", s.Version)
	}
	if s.Root.Path != "rootfs" || s.Root.Readonly {
		t.Errorf("root %+v", *s.Root)
	}
	p := s.Process
	if p.Terminal || p.Cwd != "/" || p.User.UID != 0 || p.User.GID != 0 {
		t.Errorf("process %+v", *p)
	}
	if !reflect.DeepEqual(p.Args, []string{"sleep", "1000"}) {
		t.Errorf("args %q", p.Args)
	}
	if !reflect.DeepEqual(p.Env, []string{DefaultPath, "FOO=bar"}) {
		t.Errorf("env %q", p.Env)
	}
	if want := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}}; !reflect.DeepEqual(p.Rlimits, want) {
		t.Errorf("rlimits %+v", p.Rlimits)
	}
	for _, c := range []string{"CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE"} {
		if !slices.Contains(p.Capabilities.Bounding, c) || !slices.Contains(p.Capabilities.Effective, c) ||
			!slices.Contains(p.Capabilities.Permitted, c) {
			t.Errorf("capability %s missing", c)
		}
	}
	if slices.Contains(p.Capabilities.Bounding, "CAP_SYS_ADMIN") {
		t.Error("CAP_SYS_ADMIN granted")
	}
	if s.Hostname != "c1" || s.Linux.CgroupsPath != "/ferry-h1/c1" {
		t.Errorf("hostname %q cgroupsPath %q", s.Hostname, s.Linux.CgroupsPath)
	}
	var dests []string
	for _, m := range s.Mounts {
		dests = append(dests, m.Destination)
		if m.Destination == "/sys" && !slices.Contains(m.Options, "ro") {
			t.Error("/sys not read-only")
		}
	}
	if want := []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys"}; !reflect.DeepEqual(dests, want) {
		t.Errorf("mounts %q", dests)
	}
	for _, typ := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace} {
		if path, ok := nsPath(s, typ); !ok || path != "" {
			t.Errorf("namespace %s: present %v path %q", typ, ok, path)
		}
	}
	if path, ok := nsPath(s, specs.NetworkNamespace); !ok || path != "/var/run/netns/ferry-h1" {
		t.Errorf("network namespace: present %v path %q", ok, path)
	}
	if len(s.Linux.Namespaces) != 5 {
		t.Errorf("namespaces %+v", s.Linux.Namespaces)
	}
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("masked %q readonly %q", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
}

func TestNewSpecPrivateNetNSAndOwnPath(t *testing.T) {
	s := NewSpec(SpecOptions{Args: []string{"sh"}, Env: []string{"PATH=/bin"}})
	if path, ok := nsPath(s, specs.NetworkNamespace); !ok || path != "" {
		t.Errorf("want a new private netns, got present %v path %q", ok, path)
	}
	if !reflect.DeepEqual(s.Process.Env, []string{"PATH=/bin"}) {
		t.Errorf("env %q", s.Process.Env)
	}
}

func TestWriteReadSpec(t *testing.T) {
	dir := t.TempDir()
	s := NewSpec(SpecOptions{Args: []string{"sleep", "1"}, CgroupsPath: "/x/y"})
	if err := WriteSpec(dir, s); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
	got, err := ReadSpec(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Errorf("round trip differs:\n got %+v\nwant %+v", got, s)
	}
	if _, err := ReadSpec(t.TempDir()); err == nil {
		t.Error("ReadSpec of an empty dir succeeded")
	}
}

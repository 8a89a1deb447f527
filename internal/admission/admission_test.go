package admission_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/runc"
)

// ordinary is what ferry's lab and `runc spec` make: admitted as it is.
func ordinary() *specs.Spec {
	return runc.NewSpec(runc.SpecOptions{Args: []string{"/bin/sh"}, NetNS: "/var/run/netns/h1"})
}

func encode(t *testing.T, s *specs.Spec) []byte {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestOrdinaryContainersAreAdmitted(t *testing.T) {
	if err := (admission.Policy{}).CheckSpec(encode(t, ordinary())); err != nil {
		t.Fatalf("runc's ordinary spec refused: %v", err)
	}
	private := ordinary()
	private.Linux.Namespaces = append(private.Linux.Namespaces[:0:0], private.Linux.Namespaces...)
	for i, ns := range private.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			private.Linux.Namespaces[i].Path = "" // a network namespace of its own
		}
	}
	if err := (admission.Policy{}).CheckSpec(encode(t, private)); err != nil {
		t.Fatalf("a private network namespace refused: %v", err)
	}
}

// Every malicious offer is refused, and says why; the operator's
// allowances admit what they name and nothing more.
func TestMaliciousSpecsAreRefused(t *testing.T) {
	hook := []specs.Hook{{Path: "/bin/sh", Args: []string{"sh", "-c", "id > /tmp/owned"}}}
	major, minor0, memMajor, minor1 := int64(8), int64(0), int64(1), int64(1)
	for _, c := range []struct {
		name   string
		edit   func(*specs.Spec)
		want   string
		allows admission.Policy // a policy under which the same spec is admitted
	}{
		{"prestart hook", func(s *specs.Spec) { s.Hooks = &specs.Hooks{Prestart: hook} }, "OCI hooks", admission.Policy{Privileged: true}}, //nolint:staticcheck // runc still runs the deprecated hooks

		{"createRuntime hook", func(s *specs.Spec) { s.Hooks = &specs.Hooks{CreateRuntime: hook} }, "OCI hooks", admission.Policy{Privileged: true}},
		{"poststop hook", func(s *specs.Spec) { s.Hooks = &specs.Hooks{Poststop: hook} }, "OCI hooks", admission.Policy{Privileged: true}},
		{"host pid namespace", func(s *specs.Spec) { s.Linux.Namespaces = without(s.Linux.Namespaces, specs.PIDNamespace) }, "pid namespace", admission.Policy{Privileged: true}},
		{"host mount namespace", func(s *specs.Spec) { s.Linux.Namespaces = without(s.Linux.Namespaces, specs.MountNamespace) }, "mount namespace", admission.Policy{Privileged: true}},
		{"joins a pid namespace", func(s *specs.Spec) {
			s.Linux.Namespaces = append(without(s.Linux.Namespaces, specs.PIDNamespace), specs.LinuxNamespace{Type: specs.PIDNamespace, Path: "/proc/1/ns/pid"})
		}, "joins the pid namespace at /proc/1/ns/pid", admission.Policy{Privileged: true}},
		{"host network", func(s *specs.Spec) { s.Linux.Namespaces = without(s.Linux.Namespaces, specs.NetworkNamespace) }, "network namespace", admission.Policy{HostNetwork: true}},
		{"bind of /", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind"}})
		}, "bind mount of host path /", admission.Policy{BindSources: []string{"/"}}},
		{"bind by option", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/x", Type: "none", Source: "/etc/shadow", Options: []string{"bind", "ro"}})
		}, "/etc/shadow", admission.Policy{BindSources: []string{"/etc"}}},
		{"bind beside an allowed dir", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/d", Type: "bind", Source: "/srv/data2"})
		}, "/srv/data2", admission.Policy{BindSources: []string{"/srv/data2"}}},
		{"bind escaping an allowed dir", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/d", Type: "bind", Source: "/srv/data/../../etc"})
		}, "/srv/data/../../etc", admission.Policy{BindSources: []string{"/etc"}}},
		{"relative bind source", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/d", Type: "bind", Source: "etc"})
		}, "host path etc", admission.Policy{Privileged: true}},
		{"a host disk", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/mnt", Type: "ext4", Source: "/dev/sda1"})
		}, "mount of host path /dev/sda1", admission.Policy{BindSources: []string{"/dev/sda1"}}},
		{"an overlay of host directories", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/mnt", Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/etc:/usr", "upperdir=/tmp/u", "workdir=/tmp/w"}})
		}, "mount of host path /etc", admission.Policy{BindSources: []string{"/etc", "/usr", "/tmp"}}},
		{"CAP_SYS_ADMIN", func(s *specs.Spec) {
			s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
		}, "CAP_SYS_ADMIN", admission.Policy{MaxCaps: append(append([]string{}, admission.DefaultCaps...), "CAP_SYS_ADMIN")}},
		{"ambient CAP_NET_ADMIN", func(s *specs.Spec) { s.Process.Capabilities.Ambient = []string{"CAP_NET_ADMIN"} }, "CAP_NET_ADMIN", admission.Policy{Privileged: true}},
		{"a host device", func(s *specs.Spec) {
			s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/sda", Type: "b", Major: 8}}
		}, "host devices", admission.Policy{Privileged: true}},
		{"every device allowed", func(s *specs.Spec) {
			s.Linux.Resources = &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}}
		}, "every device", admission.Policy{Privileged: true}},
		{"block devices by major", func(s *specs.Spec) {
			s.Linux.Resources = &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: true, Type: "b", Major: &major, Access: "rwm"}}}
		}, "every device", admission.Policy{Privileged: true}},
		{"no linux section", func(s *specs.Spec) { s.Linux = nil }, "no linux section", admission.Policy{Privileged: true}},
		// Issue 46 (c): an exact block device, with CAP_MKNOD in the default set.
		{"a host disk by major and minor", func(s *specs.Spec) {
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "b", Major: &major, Minor: &minor0, Access: "rwm"})
		}, "access to host device b 8:0 (rwm)", admission.Policy{Privileged: true}},
		{"a char device beyond the safe set", func(s *specs.Spec) {
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &memMajor, Minor: &minor1, Access: "r"})
		}, "access to host device c 1:1 (r)", admission.Policy{Privileged: true}},
		{"/proc/kcore unmasked", func(s *specs.Spec) { s.Linux.MaskedPaths = nil }, "does not mask /proc/kcore", admission.Policy{Privileged: true}},
		{"/proc/sys writable", func(s *specs.Spec) { s.Linux.ReadonlyPaths = nil }, "does not keep /proc/sys read-only", admission.Policy{Privileged: true}},
		{"sysfs writable", func(s *specs.Spec) {
			for i, m := range s.Mounts {
				if m.Type == "sysfs" {
					s.Mounts[i].Options = []string{"nosuid"}
				}
			}
		}, "mounts sysfs writable at /sys", admission.Policy{Privileged: true}},
		{"a second proc", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/hostproc", Type: "proc", Source: "proc"})
		}, "mounts proc a second time at /hostproc", admission.Policy{Privileged: true}},
		{"writable cgroupfs", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup"})
		}, "mounts cgroup writable", admission.Policy{Privileged: true}},
		{"a host kernel sysctl", func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"kernel.core_pattern": "|/tmp/x"} }, "sets host kernel sysctl kernel.core_pattern", admission.Policy{Privileged: true}},
		{"AppArmor unconfined", func(s *specs.Spec) { s.Process.ApparmorProfile = "unconfined" }, "unconfined by AppArmor", admission.Policy{Privileged: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := ordinary()
			c.edit(s)
			b := encode(t, s)
			err := (admission.Policy{}).CheckSpec(b)
			if err == nil || !admission.IsRefused(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("refusal %v, want one naming %q", err, c.want)
			}
			if err := c.allows.CheckSpec(b); err != nil {
				t.Errorf("the allowance %+v still refuses: %v", c.allows, err)
			}
		})
	}
	if err := (admission.Policy{}).CheckSpec([]byte("{")); err == nil || admission.IsRefused(err) {
		t.Errorf("a bad config.json: %v", err)
	}
}

// The devices every engine gives a container, a namespaced sysctl and
// mknod alone pass.
func TestSafeDevicesAndSysctlsAreAdmitted(t *testing.T) {
	s := ordinary()
	one, three, five, ptsMajor, zero := int64(1), int64(3), int64(5), int64(136), int64(0)
	s.Linux.Resources.Devices = append(s.Linux.Resources.Devices,
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &one, Minor: &three, Access: "rwm"},
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &five, Minor: &zero, Access: "rw"},
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &ptsMajor, Access: "rwm"},
		specs.LinuxDeviceCgroup{Allow: true, Type: "b", Access: "m"},
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Access: "m"})
	s.Linux.Sysctl = map[string]string{"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shmmax": "1000000"}
	if err := (admission.Policy{}).CheckSpec(encode(t, s)); err != nil {
		t.Fatal(err)
	}
}

func without(nss []specs.LinuxNamespace, t specs.LinuxNamespaceType) []specs.LinuxNamespace {
	var out []specs.LinuxNamespace
	for _, ns := range nss {
		if ns.Type != t {
			out = append(out, ns)
		}
	}
	return out
}

func TestOfferBounds(t *testing.T) {
	p := admission.Policy{MaxMemoryBytes: 1 << 30}
	for _, c := range []struct {
		o  admission.Offer
		ok bool
	}{
		{admission.Offer{MemoryBytes: 256 << 20, MaxRounds: 8}, true},
		{admission.Offer{MemoryBytes: 2 << 30, MaxRounds: 8}, false},
		{admission.Offer{MemoryBytes: -1}, false},
		{admission.Offer{MaxRounds: admission.DefaultMaxRounds + 1}, false},
		{admission.Offer{MaxRounds: -1}, false},
	} {
		if err := p.CheckOffer(c.o); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.o, err)
		}
	}
	if err := (admission.Policy{}).CheckOffer(admission.Offer{MemoryBytes: 1 << 40}); err != nil {
		t.Errorf("no memory bound set, yet refused: %v", err)
	}
}

func TestAddressesWithinTheSegmentsRanges(t *testing.T) {
	p := admission.Policy{Addresses: []netip.Prefix{netip.MustParsePrefix("10.79.0.0/24"), netip.MustParsePrefix("fd00:79::/64")}}
	for _, c := range []struct {
		addrs []string
		ok    bool
	}{
		{[]string{"10.79.0.12/24"}, true},
		{[]string{"10.79.0.12/24", "fd00:79::12/64"}, true},
		{[]string{"10.79.1.12/24"}, false},  // another subnet
		{[]string{"10.79.0.12/16"}, false},  // claims a wider net than the range
		{[]string{"192.168.0.1/24"}, false}, // e.g. a router's address on another segment
		{[]string{"10.79.0.12/24", "8.8.8.8/32"}, false},
		{[]string{"not-an-address"}, false},
		{nil, true},
	} {
		if err := p.CheckAddresses(c.addrs); (err == nil) != c.ok {
			t.Errorf("%v: %v", c.addrs, err)
		}
	}
	if err := (admission.Policy{}).CheckAddresses([]string{"10.79.0.12/24"}); err == nil || !strings.Contains(err.Error(), "--segment-range") {
		t.Errorf("no ranges configured: %v", err)
	}
}

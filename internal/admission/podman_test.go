package admission_test

import (
	"encoding/json"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/admission"
)

const (
	podmanID = "ce19585cde1e02d8155f6e9d4f061b387fe6491f296b7f03de24340bca9e5065"
	// The source's Podman instance (a lab host's: --root and --runroot
	// under its directory).
	podmanStorage = "/var/lib/ferry/lab/h1/podman/storage"
	podmanRun     = "/var/lib/ferry/lab/h1/podman/run"
)

// podmanSpecDump is the spec.dump of `podman run --detach --name hog
// --ulimit nofile=1024:1024 IMAGE /bin/sh -c ...` under rootful Podman 4.3
// with runc and cgroupfs, abridged (no seccomp, env): the
// bundle's config.json as libpod generates it, with its own bind mounts
// of files it made for the container under the instance's storage
// (userdata/shm) and run directory (hosts, resolv.conf, hostname,
// .containerenv), Podman's default capabilities, its deny-all device
// rule, and a network namespace of Podman's (a netavark network).
var podmanSpecDump = strings.NewReplacer("{STORAGE}", podmanStorage, "{RUN}", podmanRun, "{ID}", podmanID).Replace(`{
  "ociVersion": "1.0.2-dev",
  "process": {
    "user": {"uid": 0, "gid": 0},
    "args": ["/bin/sh", "-c", "exec /bin/memhog"],
    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container=podman", "HOSTNAME=ceb9f2c1d2a8"],
    "cwd": "/",
    "capabilities": {
      "bounding": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"],
      "effective": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"],
      "permitted": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"]
    },
    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
    "oomScoreAdj": 0
  },
  "root": {"path": "{STORAGE}/overlay/0c6f4b1b3e0e/merged"},
  "hostname": "ceb9f2c1d2a8",
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/etc/resolv.conf", "type": "bind", "source": "{RUN}/overlay-containers/{ID}/userdata/resolv.conf", "options": ["bind", "rprivate"]},
    {"destination": "/etc/hosts", "type": "bind", "source": "{RUN}/overlay-containers/{ID}/userdata/hosts", "options": ["bind", "rprivate"]},
    {"destination": "/dev/shm", "type": "bind", "source": "{STORAGE}/overlay-containers/{ID}/userdata/shm", "options": ["bind", "rprivate", "nosuid", "noexec", "nodev"]},
    {"destination": "/etc/hostname", "type": "bind", "source": "{RUN}/overlay-containers/{ID}/userdata/hostname", "options": ["bind", "rprivate"]},
    {"destination": "/run/.containerenv", "type": "bind", "source": "{RUN}/overlay-containers/{ID}/userdata/.containerenv", "options": ["bind", "rprivate"]},
    {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["rprivate", "nosuid", "noexec", "nodev", "relatime", "ro"]}
  ],
  "annotations": {"io.container.manager": "libpod", "org.opencontainers.image.stopSignal": "15"},
  "linux": {
    "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/fs/selinux", "/sys/dev/block"],
    "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    "resources": {"devices": [{"allow": false, "access": "rwm"}], "pids": {"limit": 2048}},
    "cgroupsPath": "/libpod_parent/libpod-{ID}",
    "namespaces": [
      {"type": "pid"}, {"type": "network", "path": "/run/netns/netns-5b3ac6e2-8a1c-4e5f-1b0d-2f3e4a5b6c7d"},
      {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}
    ]
  }
}`)

func podmanSpec(t *testing.T) *specs.Spec {
	t.Helper()
	var s specs.Spec
	if err := json.Unmarshal([]byte(podmanSpecDump), &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// hostNetwork is `podman run --network host`: no network namespace.
func hostNetwork(s *specs.Spec) {
	s.Linux.Namespaces = without(s.Linux.Namespaces, specs.NetworkNamespace)
}

func TestOrdinaryPodmanContainersAreAdmitted(t *testing.T) {
	if err := (admission.Policy{}).CheckPodmanSpec([]byte(podmanSpecDump), podmanID); err != nil {
		t.Fatalf("Podman's ordinary spec.dump refused: %v", err)
	}
	// The lab's containers run on the host network: admitted where that
	// is allowed (as Podman's adapter does where Podman runs in the
	// namespace this host gives containers), refused elsewhere.
	s := podmanSpec(t)
	hostNetwork(s)
	if err := (admission.Policy{HostNetwork: true}).CheckPodmanSpec(encode(t, s), podmanID); err != nil {
		t.Fatalf("a host-network Podman container refused: %v", err)
	}
	if err := (admission.Policy{}).CheckPodmanSpec(encode(t, s), podmanID); err == nil || !strings.Contains(err.Error(), "network namespace") {
		t.Fatalf("a host-network Podman container: %v", err)
	}
}

func TestMaliciousPodmanSpecsAreRefused(t *testing.T) {
	userdata := podmanRun + "/overlay-containers/" + podmanID + "/userdata"
	other := podmanRun + "/overlay-containers/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef/userdata"
	mount := func(dst, src string) func(*specs.Spec) {
		return func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind"}})
		}
	}
	setSource := func(dst, src string) func(*specs.Spec) {
		return func(s *specs.Spec) {
			for i := range s.Mounts {
				if s.Mounts[i].Destination == dst {
					s.Mounts[i].Source = src
				}
			}
		}
	}
	for _, c := range []struct {
		name   string
		edit   func(*specs.Spec)
		want   string
		allows admission.Policy
	}{
		{"prestart hook", func(s *specs.Spec) {
			s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/sh", Args: []string{"sh", "-c", "id > /tmp/owned"}}}} //nolint:staticcheck // runc still runs the deprecated hooks
		}, "OCI hooks", admission.Policy{Privileged: true}},
		{"host pid namespace", func(s *specs.Spec) { s.Linux.Namespaces = without(s.Linux.Namespaces, specs.PIDNamespace) }, "pid namespace", admission.Policy{Privileged: true}},
		{"host network", hostNetwork, "network namespace", admission.Policy{HostNetwork: true}},
		// Podman drops only the first mount at /etc/hosts: a second one
		// would be mounted as it is.
		{"a second mount at /etc/hosts", mount("/etc/hosts", "/"), "bind mount of host path /", admission.Policy{BindSources: []string{"/"}}},
		{"a user's bind over /etc/hosts", setSource("/etc/hosts", "/etc/shadow"), "bind mount of host path /etc/shadow", admission.Policy{BindSources: []string{"/etc"}}},
		{"another container's files", setSource("/etc/hosts", other+"/hosts"), "bind mount of host path " + other + "/hosts", admission.Policy{BindSources: []string{podmanRun}}},
		{"escaping the userdata directory", setSource("/dev/shm", userdata+"/../../../../../../../../etc"), "/etc", admission.Policy{Privileged: true}},
		// Podman matches destinations exactly: /etc/hosts/ is not its own.
		{"own file at another destination", mount("/etc/hosts/", userdata+"/hosts"), "bind mount of host path " + userdata + "/hosts", admission.Policy{BindSources: []string{userdata}}},
		{"own file at a destination Podman keeps", mount("/etc/passwd", userdata+"/passwd"), "bind mount of host path " + userdata + "/passwd", admission.Policy{Privileged: true}},
		{"this host's Podman storage", mount("/x", podmanStorage), "bind mount of host path " + podmanStorage, admission.Policy{BindSources: []string{podmanStorage}}},
		{"CAP_SYS_ADMIN", func(s *specs.Spec) {
			s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
		}, "CAP_SYS_ADMIN", admission.Policy{MaxCaps: append(append([]string{}, admission.DefaultCaps...), "CAP_SYS_ADMIN")}},
		{"a host device (--device)", func(s *specs.Spec) {
			s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/sda", Type: "b", Major: 8}}
		}, "host devices", admission.Policy{Privileged: true}},
		{"every device (--privileged)", func(s *specs.Spec) {
			s.Linux.Resources.Devices = []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}
		}, "every device", admission.Policy{Privileged: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := podmanSpec(t)
			c.edit(s)
			b := encode(t, s)
			err := (admission.Policy{}).CheckPodmanSpec(b, podmanID)
			if err == nil || !admission.IsRefused(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("refusal %v, want one naming %q", err, c.want)
			}
			if err := c.allows.CheckPodmanSpec(b, podmanID); err != nil {
				t.Errorf("the allowance %+v still refuses: %v", c.allows, err)
			}
		})
	}
	for _, id := range []string{"", "../x"} {
		if err := (admission.Policy{}).CheckPodmanSpec([]byte(podmanSpecDump), id); err == nil || admission.IsRefused(err) {
			t.Errorf("container ID %q: %v", id, err)
		}
	}
	if err := (admission.Policy{}).CheckPodmanSpec([]byte("{"), podmanID); err == nil || admission.IsRefused(err) {
		t.Errorf("a bad spec.dump: %v", err)
	}
}

// conmon runs config.dump's exit command as root here when the container
// exits: Podman's own cleanup passes, anything else is refused.
func TestPodmanExitCommand(t *testing.T) {
	const podman = "/usr/bin/podman"
	own := []string{podman, "--root", "/var/lib/containers/storage", "--runroot", "/run/containers/storage",
		"--log-level", "warning", "--cgroup-manager", "cgroupfs", "--tmpdir", "/run/libpod", "--network-config-dir", "",
		"--network-backend", "netavark", "--volumepath", "/var/lib/containers/storage/volumes", "--runtime", "runc",
		"--storage-driver", "overlay", "--events-backend", "file", "--syslog", "--transient-store=false",
		"container", "cleanup", "--rm", "ce19585cde1e"}
	for _, ok := range [][]string{nil, own} {
		if why := admission.CheckPodmanExitCommand(ok, podman); why != "" {
			t.Errorf("%q refused: %s", ok, why)
		}
	}
	edit := func(f func([]string) []string) []string { return f(append([]string{}, own...)) }
	for _, c := range []struct {
		cmd  []string
		want string
	}{
		{[]string{"/bin/sh", "-c", "id > /tmp/owned"}, "not this host's podman"},
		{edit(func(c []string) []string { c[0] = "/tmp/podman"; return c }), "not this host's podman"},
		{edit(func(c []string) []string {
			return append(c[:1], append([]string{"--hooks-dir", "/tmp/hooks"}, c[1:]...)...)
		}), "flag --hooks-dir"},
		{edit(func(c []string) []string { return append(c[:1], append([]string{"--conmon", "/tmp/x"}, c[1:]...)...) }), "flag --conmon"},
		{edit(func(c []string) []string {
			for i := range c {
				if c[i] == "runc" {
					c[i] = "/tmp/evil-runtime"
				}
			}
			return c
		}), "--runtime names a program by path"},
		{edit(func(c []string) []string { return append(c[:len(c)-4], "container", "rm", "-f", "other") }), "no container cleanup"},
		{edit(func(c []string) []string { return append(c[:len(c)-1], "--all", "x") }), "cleanup flag --all"},
		{edit(func(c []string) []string { return c[:len(c)-1] }), "container ID --rm"},
	} {
		if why := admission.CheckPodmanExitCommand(c.cmd, podman); !strings.Contains(why, c.want) {
			t.Errorf("%q: %q, want it to name %q", c.cmd, why, c.want)
		}
	}
	if why := admission.CheckPodmanExitCommand(own, ""); why == "" {
		t.Error("without a podman here, an exit command passed")
	}
}

package runc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SpecVersion is the OCI runtime-spec version ferry writes. runc 1.1 speaks
// 1.0.2; the Go types come from a newer module, so the version is pinned
// rather than taken from specs.Version.
const SpecVersion = "1.0.2"

// DefaultPath is the PATH a container gets when SpecOptions.Env sets none.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// SpecOptions are the few things that differ between ferry's containers.
type SpecOptions struct {
	Args        []string
	Env         []string
	Hostname    string
	CgroupsPath string
	// NetNS is the path of a network namespace to join; empty gives the
	// container a new private one.
	NetNS string
}

// defaultCaps is the capability set container engines commonly grant by
// default: enough for ordinary servers (bind low ports, change user, raw
// sockets for ping) without administrative powers.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// NewSpec returns a minimal OCI spec close to what `runc spec` generates,
// with a writable rootfs at "rootfs" and no terminal (containers run
// detached and must be checkpointable).
func NewSpec(o SpecOptions) *specs.Spec {
	env := append([]string(nil), o.Env...)
	hasPath := false
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			hasPath = true
		}
	}
	if !hasPath {
		env = append([]string{DefaultPath}, env...)
	}
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: o.NetNS}
	return &specs.Spec{
		Version: SpecVersion,
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     append([]string(nil), o.Args...),
			Env:      env,
			Cwd:      "/",
			// No ambient or inheritable capabilities: root needs neither,
			// and ambient ones without inheritable ones cannot be raised.
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  append([]string(nil), defaultCaps...),
				Effective: append([]string(nil), defaultCaps...),
				Permitted: append([]string(nil), defaultCaps...),
			},
			// Equal soft and hard limits below the machine's hard limit:
			// raising a limit above it fails with EPERM here.
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: "rootfs", Readonly: false},
		Hostname: o.Hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
				Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts",
				Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
				Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue",
				Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs",
				Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: o.CgroupsPath,
			Resources: &specs.LinuxResources{
				// Deny all devices; runc still allows its standard set
				// (null, zero, full, random, urandom, tty, ptmx).
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				netns,
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
				"/proc/sched_debug", "/sys/firmware", "/proc/scsi",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
		},
	}
}

// specFile is the bundle's config.json.
func specFile(bundle string) string { return filepath.Join(bundle, "config.json") }

// WriteSpec writes s as the bundle's config.json (mode 0600: it may carry
// secrets in the environment).
func WriteSpec(bundle string, s *specs.Spec) error {
	b, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return fmt.Errorf("encode spec: %w", err)
	}
	if err := os.WriteFile(specFile(bundle), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write spec: %w", err)
	}
	// WriteFile keeps the mode of an existing file.
	return os.Chmod(specFile(bundle), 0o600)
}

// ReadSpec reads the bundle's config.json.
func ReadSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(specFile(bundle))
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", specFile(bundle), err)
	}
	return &s, nil
}

// JoinNetNS points a spec that joins a network namespace by path (one
// ferry rebuilt, or the host's) at netns, this host's; "" refuses such a
// spec. A spec making a namespace of its own is left as it is.
func JoinNetNS(s *specs.Spec, netns string) error {
	if s.Linux == nil {
		return nil
	}
	for i, ns := range s.Linux.Namespaces {
		if ns.Type != specs.NetworkNamespace || ns.Path == "" {
			continue
		}
		if netns == "" {
			return errors.New("the container joins a network namespace at the source, but this host has none configured for it (agent --netns)")
		}
		s.Linux.Namespaces[i].Path = netns
	}
	return nil
}

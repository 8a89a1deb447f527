// Package admission decides what a destination accepts of an incoming
// container before it creates anything. A source sends the container's
// OCI config.json (runc; Podman's spec.dump, see CheckPodmanSpec) or LXC
// config (CheckLXCConfig), and the runtime runs it as root here: its
// hooks would run on this host, its host namespaces, bind mounts,
// capabilities and devices would reach into this host. By default none of
// that passes; an agent's operator allows it explicitly.
package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Policy is what an agent accepts.
type Policy struct {
	// Privileged accepts everything a config.json may ask for.
	Privileged bool
	// HostNetwork accepts a container without a network namespace of its
	// own (it would share this host's).
	HostNetwork bool
	// BindSources are the host directories bind mounts may come from
	// (each with what lies beneath it).
	BindSources []string
	// MaxCaps is the set of capabilities a container may hold; empty
	// means DefaultCaps.
	MaxCaps []string
	// MaxMemoryBytes bounds the memory an offer announces (the destination
	// prepares that much); 0: no bound.
	MaxMemoryBytes int64
	// MaxRounds bounds pre-copy rounds an offer asks for; 0: DefaultMaxRounds.
	MaxRounds int
	// Addresses are the ranges a container keeping its address may claim
	// on this host's segment (it is announced there); none: no address.
	Addresses []netip.Prefix
}

// CheckAddresses refuses an address (CIDR notation) outside the ranges
// this host lets containers claim on its segment.
func (p Policy) CheckAddresses(addrs []string) error {
	var why []string
	for _, a := range addrs {
		pfx, err := netip.ParsePrefix(a)
		if err != nil {
			why = append(why, fmt.Sprintf("bad address %q", a))
			continue
		}
		ok := false
		for _, r := range p.Addresses {
			if r.Contains(pfx.Addr()) && pfx.Bits() >= r.Bits() {
				ok = true
			}
		}
		if !ok {
			why = append(why, fmt.Sprintf("address %s is outside this segment's ranges %v (agent --segment-range)", a, p.Addresses))
		}
	}
	return refused(why)
}

// DefaultCaps are the capabilities container engines grant by default
// (runc's and Podman's defaults): no administrative powers.
var DefaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// DefaultMaxRounds bounds pre-copy rounds when the policy does not.
const DefaultMaxRounds = 64

// Refused is a container the policy does not admit, with every reason.
type Refused struct{ Reasons []string }

func (r *Refused) Error() string {
	return "refused by this host's admission policy: " + strings.Join(r.Reasons, "; ") +
		" (an agent started with --allow-privileged, --allow-host-network or --allow-bind accepts more)"
}

// Offer is the part of an incoming migration the policy bounds.
type Offer struct {
	MemoryBytes int64
	MaxRounds   int
}

// CheckOffer bounds what the source asks this host to prepare.
func (p Policy) CheckOffer(o Offer) error {
	var why []string
	if o.MemoryBytes < 0 || (p.MaxMemoryBytes > 0 && o.MemoryBytes > p.MaxMemoryBytes) {
		why = append(why, fmt.Sprintf("announced memory %d bytes exceeds %d", o.MemoryBytes, p.MaxMemoryBytes))
	}
	maxRounds := p.MaxRounds
	if maxRounds <= 0 {
		maxRounds = DefaultMaxRounds
	}
	if o.MaxRounds < 0 || o.MaxRounds > maxRounds {
		why = append(why, fmt.Sprintf("%d pre-copy rounds asked, at most %d", o.MaxRounds, maxRounds))
	}
	return refused(why)
}

// CheckSpec checks an OCI config.json.
func (p Policy) CheckSpec(b []byte) error {
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("bad config.json: %w", err)
	}
	if p.Privileged {
		return nil
	}
	var why []string
	if h := s.Hooks; h != nil && (len(h.Prestart)+ //nolint:staticcheck // runc still runs the deprecated hooks
		len(h.CreateRuntime)+len(h.CreateContainer)+
		len(h.StartContainer)+len(h.Poststart)+len(h.Poststop) > 0) {
		why = append(why, "OCI hooks (they would run as root on this host)")
	}
	if s.Linux == nil {
		return refused(append(why, "no linux section (the container would share every namespace of this host)"))
	}
	why = append(why, p.namespaces(s.Linux.Namespaces)...)
	for _, m := range s.Mounts {
		kind := "mount"
		if isBind(m) {
			kind = "bind mount"
		}
		for _, path := range hostPaths(m.Source, isBind(m), m.Options) {
			if !p.BindAllowed(path) {
				why = append(why, fmt.Sprintf("%s of host path %s", kind, path))
			}
		}
	}
	if len(s.Linux.Devices) > 0 {
		why = append(why, fmt.Sprintf("%d host devices", len(s.Linux.Devices)))
	}
	if r := s.Linux.Resources; r != nil {
		why = append(why, deviceRules(r.Devices)...)
	}
	why = append(why, confinement(&s)...)
	if pr := s.Process; pr != nil && pr.Capabilities != nil {
		maxCaps := p.MaxCaps
		if len(maxCaps) == 0 {
			maxCaps = DefaultCaps
		}
		c := pr.Capabilities
		var extra []string
		for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
			for _, cp := range set {
				if !slices.Contains(maxCaps, cp) && !slices.Contains(extra, cp) {
					extra = append(extra, cp)
				}
			}
		}
		if len(extra) > 0 {
			why = append(why, "capabilities "+strings.Join(extra, ", "))
		}
	}
	return refused(why)
}

// namespaces refuses a namespace joined by path (another container's or
// this host's) and a missing one (shared with this host). The network
// namespace's path is the destination's to rewrite (its own, or one ferry
// rebuilt), so a path there is fine; its absence is host networking.
func (p Policy) namespaces(nss []specs.LinuxNamespace) []string {
	var why []string
	have := map[specs.LinuxNamespaceType]bool{}
	for _, ns := range nss {
		have[ns.Type] = true
		if ns.Path != "" && ns.Type != specs.NetworkNamespace {
			why = append(why, fmt.Sprintf("joins the %s namespace at %s", ns.Type, ns.Path))
		}
	}
	for _, t := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.IPCNamespace, specs.UTSNamespace} {
		if !have[t] {
			why = append(why, fmt.Sprintf("shares this host's %s namespace", t))
		}
	}
	if !have[specs.NetworkNamespace] && !p.HostNetwork {
		why = append(why, "shares this host's network namespace")
	}
	return why
}

// safeDevices are the character devices (major, minor; -1 any minor) every
// container engine lets a container use: null, zero, full, random,
// urandom, tty, console, ptmx, the pseudo-terminals, tun and fuse.
var safeDevices = [][2]int64{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 1}, {5, 2}, {136, -1}, {10, 200}, {10, 229}}

// deviceRules refuses a device cgroup rule that lets the container read
// or write a device beyond safeDevices: with CAP_MKNOD (in the default
// set) it makes the node and reads the host's disk. Allowing only mknod
// ("m") is harmless: the node cannot be opened.
func deviceRules(rules []specs.LinuxDeviceCgroup) []string {
	var why []string
	for _, d := range rules {
		if !d.Allow || strings.Trim(d.Access, "m") == "" {
			continue
		}
		if d.Type == "" || d.Type == "a" || d.Major == nil {
			why = append(why, "access to every device")
			continue
		}
		safe := false
		for _, sd := range safeDevices {
			if d.Type == "c" && *d.Major == sd[0] && ((d.Minor != nil && *d.Minor == sd[1]) || (sd[1] == -1)) {
				safe = true
			}
		}
		if !safe {
			minor := "*"
			if d.Minor != nil {
				minor = fmt.Sprint(*d.Minor)
			}
			if d.Minor == nil {
				why = append(why, fmt.Sprintf("access to every device %s %d:* (%s)", d.Type, *d.Major, d.Access))
			} else {
				why = append(why, fmt.Sprintf("access to host device %s %d:%s (%s)", d.Type, *d.Major, minor, d.Access))
			}
		}
	}
	return why
}

// Paths of the kernel every engine hides from a container (masked) or
// keeps read-only: a spec without them reads the host's memory
// (/proc/kcore), keyrings or firmware, or writes the host's kernel
// settings (/proc/sys) and triggers (/proc/sysrq-trigger).
var (
	mustMask     = []string{"/proc/kcore", "/proc/keys", "/sys/firmware"}
	mustReadonly = []string{"/proc/sys", "/proc/sysrq-trigger"}
)

// namespacedSysctls are the sysctls that act in the container's own
// namespaces (Kubernetes' safe and namespaced sets); any other changes
// this host's kernel.
var namespacedSysctls = []string{"net.", "kernel.shm", "kernel.msg", "kernel.sem", "fs.mqueue.", "kernel.hostname", "kernel.domainname"}

// NamespacedSysctl says whether a sysctl acts only in the container's own
// namespaces.
func NamespacedSysctl(k string) bool {
	for _, pfx := range namespacedSysctls {
		if strings.HasPrefix(k, pfx) {
			return true
		}
	}
	return false
}

// confinement refuses what would take the container out of the
// confinement engines give it: the kernel's paths unmasked or writable,
// sysfs or cgroupfs mounted writable, proc or sysfs mounted a second time
// elsewhere (unmasked), sysctls of the host's kernel, no AppArmor.
func confinement(s *specs.Spec) []string {
	var why []string
	for _, p := range mustMask {
		if !slices.Contains(s.Linux.MaskedPaths, p) {
			why = append(why, "does not mask "+p)
		}
	}
	for _, p := range mustReadonly {
		if !slices.Contains(s.Linux.ReadonlyPaths, p) && !slices.Contains(s.Linux.MaskedPaths, p) {
			why = append(why, "does not keep "+p+" read-only")
		}
	}
	for _, m := range s.Mounts {
		switch m.Type {
		case "proc":
			if filepath.Clean(m.Destination) != "/proc" {
				why = append(why, "mounts proc a second time at "+m.Destination)
			}
		case "sysfs", "cgroup", "cgroup2":
			if m.Type == "sysfs" && filepath.Clean(m.Destination) != "/sys" {
				why = append(why, "mounts sysfs a second time at "+m.Destination)
			}
			if !slices.Contains(m.Options, "ro") {
				why = append(why, fmt.Sprintf("mounts %s writable at %s", m.Type, m.Destination))
			}
		}
	}
	for k := range s.Linux.Sysctl {
		if !NamespacedSysctl(k) {
			why = append(why, "sets host kernel sysctl "+k)
		}
	}
	if pr := s.Process; pr != nil && pr.ApparmorProfile == "unconfined" {
		why = append(why, "runs unconfined by AppArmor")
	}
	slices.Sort(why)
	return why
}

func isBind(m specs.Mount) bool {
	if m.Type == "bind" || m.Type == "rbind" {
		return true
	}
	return slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// hostPaths are the host paths a mount reaches: a bind mount's source, the
// source of any other mount when it is a path (a block device, say: a
// virtual file system names none, "proc" or "tmpfs"), and an overlay's
// directories.
func hostPaths(source string, bind bool, options []string) []string {
	var paths []string
	if bind || filepath.IsAbs(source) {
		paths = append(paths, source)
	}
	for _, o := range options {
		k, v, ok := strings.Cut(o, "=")
		if ok && (k == "lowerdir" || k == "upperdir" || k == "workdir") {
			paths = append(paths, strings.Split(v, ":")...)
		}
	}
	return paths
}

// BindAllowed says whether a bind mount's source lies under an allowed
// directory, compared as clean absolute paths (no "..", no prefix tricks:
// /srv/data2 is not under /srv/data).
func (p Policy) BindAllowed(src string) bool {
	if !filepath.IsAbs(src) {
		return false
	}
	src = filepath.Clean(src)
	for _, dir := range p.BindSources {
		dir = filepath.Clean(dir)
		if src == dir || strings.HasPrefix(src, dir+"/") || dir == "/" {
			return true
		}
	}
	return false
}

func refused(why []string) error {
	if len(why) == 0 {
		return nil
	}
	return &Refused{Reasons: why}
}

// IsRefused reports whether err is a policy refusal.
func IsRefused(err error) bool {
	var r *Refused
	return errors.As(err, &r)
}

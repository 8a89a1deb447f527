package lxc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/shareddir"
)

// An LXC configuration file is a list of "key = value" lines; "#" starts a
// comment line. Keys may repeat (lxc.mount.entry, lxc.include). liblxc
// strips one pair of double quotes around a value.

// configLine is one line of a config file: a comment or blank line keeps
// Key empty and is written back unchanged.
type configLine struct {
	Raw   string
	Key   string
	Value string
}

func parseConfig(b []byte) []configLine {
	var lines []configLine
	for _, raw := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		l := configLine{Raw: raw}
		t := strings.TrimSpace(raw)
		if t != "" && !strings.HasPrefix(t, "#") {
			if k, v, ok := strings.Cut(t, "="); ok {
				l.Key = strings.TrimSpace(k)
				v = strings.TrimSpace(v)
				if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
					v = v[1 : len(v)-1]
				}
				l.Value = v
			}
		}
		lines = append(lines, l)
	}
	return lines
}

func formatConfig(lines []configLine) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l.Raw)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// lookup returns the last value of key (liblxc keeps the last one).
func lookup(lines []configLine, key string) (string, bool) {
	v, ok := "", false
	for _, l := range lines {
		if l.Key == key {
			v, ok = l.Value, true
		}
	}
	return v, ok
}

// rootfsDir is the directory an lxc.rootfs.path value names. Only the
// "dir" backend (a plain directory) can move: ferry syncs the rootfs as a
// directory tree, and a block device, LVM, ZFS or overlay rootfs would need
// its own storage at the destination.
func rootfsDir(value string) (string, error) {
	if value == "" {
		return "", errors.New("lxc.rootfs.path is not set (the container runs in the host's root filesystem, which cannot move)")
	}
	p := value
	if backend, rest, ok := strings.Cut(value, ":"); ok && !strings.HasPrefix(value, "/") {
		if backend != "dir" {
			return "", fmt.Errorf("lxc.rootfs.path %q: storage backend %q cannot move (ferry moves directory rootfs only: \"dir:/path\" or \"/path\")", value, backend)
		}
		p = rest
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("lxc.rootfs.path %q is not an absolute directory", value)
	}
	return filepath.Clean(p), nil
}

// checkMovable refuses, before anything is frozen, what a dump or a
// restore of this configuration cannot handle.
func checkMovable(lines []configLine) error {
	if v, ok := lookup(lines, "lxc.tty.max"); ok && v != "" && v != "0" {
		// liblxc bind-mounts a host pty over /dev/ttyN; CRIU finds no
		// master for it in the container and the dump fails ("tty: Unable
		// to find a master for /3").
		return fmt.Errorf("lxc.tty.max = %s: CRIU cannot dump the container's ttys (host ptys bind-mounted over /dev/ttyN); set lxc.tty.max = 0", v)
	}
	root, _ := lookup(lines, "lxc.rootfs.path")
	if _, err := rootfsDir(root); err != nil {
		return err
	}
	types := map[int]string{}
	for _, l := range lines {
		if i, sub, ok := admission.LXCNetKey(l.Key); ok && sub == "type" {
			types[i] = l.Value
		}
	}
	for i, t := range types {
		switch t {
		case "", "none", "empty", "veth", "macvlan", "phys":
		default:
			return fmt.Errorf("lxc.net.%d.type = %s: liblxc checkpoints only veth, macvlan, phys, empty and none networks", i, t)
		}
	}
	return nil
}

// hostEnv is what the destination host offers, for the config rewrite.
type hostEnv struct {
	// linkExists says whether a network interface of that name exists.
	linkExists func(name string) bool
	// pathExists says whether a host path exists (bind mount sources,
	// included files).
	pathExists func(path string) bool
	// apparmor, selinux: the LSM is enabled here.
	apparmor, selinux bool
	// linkPrefixes are the IPv4 addresses of an interface here, with
	// their subnets.
	linkPrefixes func(name string) []netip.Prefix
	// addressTaken says which container here is configured with this
	// address on that link ("" for none).
	addressTaken func(link string, addr netip.Addr) string
}

func defaultHostEnv() hostEnv {
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	aa, _ := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	return hostEnv{
		// By netlink: /sys/class/net shows the namespace sysfs was
		// mounted in, not necessarily this process's.
		linkExists: func(name string) bool { _, err := net.InterfaceByName(name); return err == nil },
		pathExists: exists,
		apparmor:   strings.TrimSpace(string(aa)) == "Y",
		selinux:    exists("/sys/fs/selinux/enforce"),
		linkPrefixes: func(name string) []netip.Prefix {
			i, err := net.InterfaceByName(name)
			if err != nil {
				return nil
			}
			addrs, _ := i.Addrs()
			var out []netip.Prefix
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
					out = append(out, p)
				}
			}
			return out
		},
		addressTaken: func(string, netip.Addr) string { return "" },
	}
}

// checkAddress refuses a static address CRIU would restore where it
// cannot work: outside every subnet of the link here (the host's own
// bridge on another subnet), or the address of the link itself or of
// another container configured here. CRIU restores the address the
// container had; it cannot be given another.
func checkAddress(i int, link, address string, env hostEnv) error {
	p, err := netip.ParsePrefix(address)
	if err != nil || link == "" {
		return nil
	}
	here := env.linkPrefixes(link)
	var subnets []string
	inSubnet := len(here) == 0 // an interface without addresses: a plain switch
	for _, h := range here {
		if h.Addr() == p.Addr() {
			return fmt.Errorf("lxc.net.%d.ipv4.address = %s: %s is %s's own address on this host", i, address, p.Addr(), link)
		}
		subnets = append(subnets, h.Masked().String())
		inSubnet = inSubnet || h.Masked().Contains(p.Addr())
	}
	if !inSubnet {
		return fmt.Errorf("lxc.net.%d.ipv4.address = %s: not in %s's subnet on this host (%s); CRIU restores the address the container had, so it would be unreachable here",
			i, address, link, strings.Join(subnets, ", "))
	}
	if other := env.addressTaken(link, p.Addr()); other != "" {
		return fmt.Errorf("lxc.net.%d.ipv4.address = %s: container %q here has %s on %s already", i, address, other, p.Addr(), link)
	}
	return nil
}

// rewriteConfig adapts a source's config to this host: every path under
// the source's container directory moves under this one's (the rootfs,
// log files, an fstab), the rootfs becomes dir:<dst>/rootfs, LSM lines for
// an LSM this kernel lacks go (liblxc would pass them to CRIU's restore,
// which refuses them), and what must exist here (network links, bind mount
// sources, included files) is checked.
func rewriteConfig(cfg []byte, srcDir, dstDir string, env hostEnv) ([]byte, []string, error) {
	lines := parseConfig(cfg)
	if err := checkMovable(lines); err != nil {
		return nil, nil, err
	}
	var notes []string
	netTypes, links, addresses := map[int]string{}, map[int]string{}, map[int]string{}
	for _, l := range lines {
		if i, sub, ok := admission.LXCNetKey(l.Key); ok {
			switch sub {
			case "type":
				netTypes[i] = l.Value
			case "link":
				links[i] = l.Value
			case "ipv4.address":
				addresses[i] = l.Value
			}
		}
	}
	for i, t := range netTypes {
		if t == "veth" || t == "macvlan" {
			if err := checkAddress(i, links[i], addresses[i], env); err != nil {
				return nil, nil, err
			}
		}
	}
	var out []configLine
	for _, l := range lines {
		if l.Key == "" {
			out = append(out, l)
			continue
		}
		v := l.Value
		if srcDir != "" && (v == srcDir || strings.HasPrefix(v, srcDir+"/")) {
			v = dstDir + strings.TrimPrefix(v, srcDir)
		}
		switch {
		case l.Key == "lxc.rootfs.path":
			v = "dir:" + filepath.Join(dstDir, "rootfs")
		case strings.HasPrefix(l.Key, "lxc.apparmor."):
			if !env.apparmor {
				notes = append(notes, "dropped "+l.Key+" (no AppArmor here)")
				continue
			}
		case strings.HasPrefix(l.Key, "lxc.selinux."):
			if !env.selinux {
				notes = append(notes, "dropped "+l.Key+" (no SELinux here)")
				continue
			}
		case l.Key == "lxc.include":
			if !env.pathExists(v) {
				return nil, nil, fmt.Errorf("lxc.include = %s: no such file or directory on this host", v)
			}
		case l.Key == "lxc.mount.entry":
			if err := checkMountEntry(v, env); err != nil {
				return nil, nil, err
			}
		}
		if i, sub, ok := admission.LXCNetKey(l.Key); ok {
			t := netTypes[i]
			switch sub {
			case "link":
				if v != "" && (t == "veth" || t == "macvlan" || t == "phys") && !env.linkExists(v) {
					return nil, nil, fmt.Errorf("lxc.net.%d.link = %s: no network interface %q on this host (a %s network needs it; create the bridge first)", i, v, v, t)
				}
			case "veth.pair":
				if v != "" && env.linkExists(v) {
					return nil, nil, fmt.Errorf("lxc.net.%d.veth.pair = %s: an interface of that name already exists on this host", i, v)
				}
			}
		}
		if v != l.Value {
			l.Raw = l.Key + " = " + v
			l.Value = v
		}
		out = append(out, l)
	}
	if _, ok := lookup(out, "lxc.rootfs.path"); !ok {
		return nil, nil, errors.New("config has no lxc.rootfs.path")
	}
	return formatConfig(out), notes, nil
}

// sharedOf lists the writable bind mounts of host directories in a
// config's mount entries: data, which is never copied and follows only
// onto the same storage (runtime.Container.Shared). Read-only ones (the
// busybox template's /lib) are the host's own files, mounted again from
// the destination's.
func sharedOf(lines []configLine) []shareddir.Dir {
	var out []shareddir.Dir
	for _, l := range lines {
		if l.Key != "lxc.mount.entry" {
			continue
		}
		if m, ok := parseMountEntry(l.Value); ok && m.hostBind() && !m.has("ro") {
			out = append(out, shareddir.Dir{Source: filepath.Clean(m.source), Path: filepath.Join("/", m.target)})
		}
	}
	return out
}

// mountEntry is an lxc.mount.entry: what is mounted, where under the
// rootfs, with which options (fstab's fields).
type mountEntry struct {
	source, target string
	opts           []string
}

// parseMountEntry reads an lxc.mount.entry's value; false for one of
// fewer than four fields.
func parseMountEntry(v string) (mountEntry, bool) {
	f := strings.Fields(v)
	if len(f) < 4 {
		return mountEntry{}, false
	}
	return mountEntry{source: f[0], target: f[1], opts: strings.Split(f[3], ",")}, true
}

func (m mountEntry) has(opt string) bool { return slices.Contains(m.opts, opt) }

// hostBind says whether the entry bind-mounts a host path.
func (m mountEntry) hostBind() bool {
	return (m.has("bind") || m.has("rbind")) && filepath.IsAbs(m.source)
}

// checkMountEntry checks that the source of a bind mount exists here:
// "/lib lib none ro,bind 0 0" needs /lib (unless "optional").
func checkMountEntry(entry string, env hostEnv) error {
	m, ok := parseMountEntry(entry)
	if !ok || !m.hostBind() || m.has("optional") {
		return nil
	}
	if !env.pathExists(m.source) {
		return fmt.Errorf("lxc.mount.entry = %s: the bind mount's source %s does not exist on this host", entry, m.source)
	}
	return nil
}

package admission

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// LXCConfigDir holds the configs the LXC package ships (common.conf and
// the distributions' includes); an incoming config may include those.
var LXCConfigDir = "/usr/share/lxc/config"

// lxcDefaultDevices are the device rules LXC's own common.conf allows
// (LXC 5.0: mknod of any node, then /dev/null, zero, full, tty, console,
// ptmx, random, urandom, the ptys and fuse), as type, major:minor, access.
var lxcDefaultDevices = [][3]string{
	{"c", "*:*", "m"}, {"b", "*:*", "m"},
	{"c", "1:3", "rwm"}, {"c", "1:5", "rwm"}, {"c", "1:7", "rwm"},
	{"c", "5:0", "rwm"}, {"c", "5:1", "rwm"}, {"c", "5:2", "rwm"},
	{"c", "1:8", "rwm"}, {"c", "1:9", "rwm"}, {"c", "136:*", "rwm"},
	{"c", "10:229", "rwm"},
}

// CheckLXCConfig checks an LXC container's config as this host would run
// it (rewritten for its lxcpath; an fstab the container carries inlined
// as lxc.mount.entry lines). liblxc runs it as root here, so by default
// it refuses what the config adds to what LXC itself grants a container:
//
//   - lxc.hook.* and lxc.net.N.script.up/down: commands run as root on
//     this host;
//   - lxc.namespace.share.*, lxc.namespace.keep and an
//     lxc.namespace.clone list without mnt, pid, uts and ipc: this host's
//     (or another process's) namespaces; lxc.net.N.type = none, keeping
//     or not cloning net: this host's network (HostNetwork allows those);
//   - lxc.net.N.type = phys: a host interface moved into the container;
//   - lxc.mount.entry mounting a host path (a bind mount's source, a
//     device, an overlay's directories) outside BindSources and the
//     container's own rootfs; lxc.mount.fstab and lxc.include of files
//     this check cannot read (includes of LXC's own LXCConfigDir are
//     LXC's defaults, and fine);
//   - lxc.cap.keep of capabilities beyond MaxCaps (DefaultCaps): keep
//     is an allowlist, so keeping only default ones narrows the set;
//   - lxc.cgroup.devices.allow and lxc.cgroup2.devices.allow beyond the
//     rules of LXC's own common.conf;
//   - lxc.apparmor.profile = unconfined or unchanged, and an empty
//     lxc.seccomp.profile (both lift a confinement an include set).
//
// What a config leaves out it gets from LXC's defaults: a privileged LXC
// container without lxc.cap.drop or device rules holds every capability
// and device, as a container of this host's own would. The check bounds
// what a source may ask beyond those defaults; Privileged accepts all.
func (p Policy) CheckLXCConfig(config string) error {
	if p.Privileged {
		return nil
	}
	lines := lxcLines(config)
	rootfs := ""
	for _, l := range lines {
		if l.key == "lxc.rootfs.path" {
			rootfs = lxcRootfsDir(l.value)
		}
	}
	var why []string
	for _, l := range lines {
		k, v := l.key, l.value
		idx, sub, isNet := LXCNetKey(k)
		switch {
		case strings.HasPrefix(k, "lxc.hook.") && k != "lxc.hook.version" && v != "":
			why = append(why, fmt.Sprintf("%s = %s (hooks run as root on this host)", k, v))
		case isNet && (sub == "script.up" || sub == "script.down") && v != "":
			why = append(why, fmt.Sprintf("%s = %s (network scripts run as root on this host)", k, v))
		case isNet && sub == "type" && v == "none" && !p.HostNetwork:
			why = append(why, fmt.Sprintf("lxc.net.%d.type = none shares this host's network namespace", idx))
		case isNet && sub == "type" && v == "phys":
			why = append(why, fmt.Sprintf("lxc.net.%d.type = phys moves a host network interface into the container", idx))
		case strings.HasPrefix(k, "lxc.namespace.share.") && v != "":
			why = append(why, fmt.Sprintf("%s = %s joins another process's %s namespace", k, v, strings.TrimPrefix(k, "lxc.namespace.share.")))
		case k == "lxc.namespace.keep":
			for _, ns := range strings.Fields(v) {
				if ns != "net" || !p.HostNetwork {
					why = append(why, fmt.Sprintf("lxc.namespace.keep = %s keeps this host's %s namespace", v, ns))
				}
			}
		case k == "lxc.namespace.clone" && v != "":
			why = append(why, p.lxcClone(v)...)
		case k == "lxc.mount.entry":
			if r := p.lxcMount(v, rootfs); r != "" {
				why = append(why, r)
			}
		case k == "lxc.mount.fstab" && v != "":
			why = append(why, fmt.Sprintf("lxc.mount.fstab = %s (a file of this host's: its mounts cannot be checked)", v))
		case k == "lxc.include" && !under(v, LXCConfigDir):
			why = append(why, fmt.Sprintf("lxc.include = %s (a file of this host's outside %s: not checked)", v, LXCConfigDir))
		case k == "lxc.cap.keep":
			if extra := p.lxcCapsBeyond(v); len(extra) > 0 {
				why = append(why, "lxc.cap.keep keeps capabilities "+strings.Join(extra, ", "))
			}
		case (k == "lxc.cgroup.devices.allow" || k == "lxc.cgroup2.devices.allow") && v != "" && !lxcDefaultDevice(v):
			why = append(why, fmt.Sprintf("%s = %s (beyond LXC's default devices)", k, v))
		case k == "lxc.apparmor.profile" && (v == "unconfined" || v == "unchanged"):
			why = append(why, fmt.Sprintf("lxc.apparmor.profile = %s (no AppArmor confinement)", v))
		case k == "lxc.seccomp.profile" && v == "":
			why = append(why, "an empty lxc.seccomp.profile (no seccomp filter)")
		case k == "lxc.mount.auto":
			for _, m := range strings.Fields(v) {
				if strings.HasSuffix(m, ":rw") {
					why = append(why, fmt.Sprintf("lxc.mount.auto = %s mounts the host's %s writable", m, strings.TrimSuffix(m, ":rw")))
				}
			}
		}
	}
	why = append(why, lxcKeptDefaults(lines)...)
	return refused(why)
}

// lxcDefaultDrops are the capabilities LXC's own common.conf drops: with
// them a privileged container could load kernel modules, reach hardware
// and the clock, or lift its MAC confinement.
var lxcDefaultDrops = []string{"mac_admin", "mac_override", "sys_time", "sys_module", "sys_rawio"}

// lxcKeptDefaults refuses a config that keeps a capability LXC's defaults
// drop: without lxc.cap.keep (an allowlist, checked on its own), every
// capability not dropped, by the config or by an include of LXC's own
// (read from this host), is kept.
func lxcKeptDefaults(lines []lxcLine) []string {
	for _, l := range lines {
		if l.key == "lxc.cap.keep" && l.value != "" {
			return nil
		}
	}
	dropped := map[string]bool{}
	lxcDrops(lines, dropped, 0)
	var kept []string
	for _, c := range lxcDefaultDrops {
		if !dropped[c] {
			kept = append(kept, c)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	return []string{"keeps capabilities " + strings.Join(kept, ", ") + " (no lxc.cap.drop of them, nor an include of LXC's common.conf)"}
}

// lxcKept is the capability mask a config keeps: lxc.cap.keep's, or every
// capability but those it (and LXC's includes) drops.
func lxcKept(lines []lxcLine) uint64 {
	var keep []string
	kept := false
	for _, l := range lines {
		if l.key == "lxc.cap.keep" {
			keep, kept = strings.Fields(l.value), true
		}
	}
	var mask uint64
	if kept {
		for _, c := range keep {
			if bit, ok := capBits["CAP_"+strings.ToUpper(strings.TrimPrefix(strings.ToLower(c), "cap_"))]; ok {
				mask |= 1 << bit
			}
		}
		return mask
	}
	dropped := map[string]bool{}
	lxcDrops(lines, dropped, 0)
	for name, bit := range capBits {
		if !dropped[strings.ToLower(strings.TrimPrefix(name, "CAP_"))] {
			mask |= 1 << bit
		}
	}
	return mask
}

// lxcDrops adds the config's lxc.cap.drop values to dropped, following
// includes of LXC's own config directory (files, or directories of
// .conf files) a few levels deep; an empty lxc.cap.drop clears them.
func lxcDrops(lines []lxcLine, dropped map[string]bool, depth int) {
	for _, l := range lines {
		switch {
		case l.key == "lxc.cap.drop" && l.value == "":
			clear(dropped)
		case l.key == "lxc.cap.drop":
			for _, c := range strings.Fields(l.value) {
				dropped[strings.ToLower(c)] = true
			}
		case l.key == "lxc.include" && depth < 3 && under(l.value, LXCConfigDir):
			paths := []string{l.value}
			if st, err := os.Stat(l.value); err == nil && st.IsDir() {
				paths, _ = filepath.Glob(filepath.Join(l.value, "*.conf"))
			}
			for _, p := range paths {
				if b, err := os.ReadFile(p); err == nil {
					lxcDrops(lxcLines(string(b)), dropped, depth+1)
				}
			}
		}
	}
}

type lxcLine struct{ key, value string }

// lxcLines reads "key = value" lines as liblxc does: "#" starts a
// comment line, one pair of double quotes around a value is stripped.
func lxcLines(config string) []lxcLine {
	var out []lxcLine
	for _, raw := range strings.Split(config, "\n") {
		t := strings.TrimSpace(raw)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		out = append(out, lxcLine{strings.TrimSpace(k), v})
	}
	return out
}

// LXCNetKey splits an "lxc.net.N.rest" key into N and rest.
func LXCNetKey(key string) (int, string, bool) {
	rest, ok := strings.CutPrefix(key, "lxc.net.")
	if !ok {
		return 0, "", false
	}
	n, sub, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", false
	}
	i, err := strconv.Atoi(n)
	if err != nil || i < 0 {
		return 0, "", false
	}
	return i, sub, true
}

// lxcRootfsDir is the directory of a "dir:" (or plain path) rootfs, ""
// for other backends.
func lxcRootfsDir(v string) string {
	if rest, ok := strings.CutPrefix(v, "dir:"); ok {
		v = rest
	}
	if !filepath.IsAbs(v) {
		return ""
	}
	return filepath.Clean(v)
}

// lxcClone refuses a clone list that leaves namespaces shared with the
// process starting the container (this host's).
func (p Policy) lxcClone(v string) []string {
	have := strings.Fields(v)
	var why []string
	for _, ns := range [][]string{{"mnt", "mount"}, {"pid"}, {"uts"}, {"ipc"}, {"net"}} {
		if slices.ContainsFunc(have, func(h string) bool { return slices.Contains(ns, h) }) {
			continue
		}
		if ns[0] == "net" && p.HostNetwork {
			continue
		}
		why = append(why, fmt.Sprintf("lxc.namespace.clone = %s shares this host's %s namespace", v, ns[0]))
	}
	return why
}

// lxcMount says why an lxc.mount.entry ("SOURCE TARGET TYPE OPTIONS ...")
// is refused, or "". A host path may be mounted from BindSources or the
// container's own rootfs; a virtual file system (proc, tmpfs, ...) names
// none. The target is inside the container, relative to its rootfs.
func (p Policy) lxcMount(entry, rootfs string) string {
	f := strings.Fields(entry)
	if len(f) < 3 {
		return ""
	}
	opts := []string{}
	if len(f) > 3 {
		opts = strings.Split(f[3], ",")
	}
	bind := f[2] == "bind" || f[2] == "rbind" || slices.Contains(opts, "bind") || slices.Contains(opts, "rbind")
	allowed := func(path string) bool {
		return p.BindAllowed(path) || (rootfs != "" && under(path, rootfs))
	}
	for _, path := range hostPaths(f[0], bind, opts) {
		if !allowed(path) {
			return fmt.Sprintf("lxc.mount.entry = %s mounts host path %s", entry, path)
		}
	}
	return ""
}

// under says whether path lies at or beneath dir, both clean absolute
// paths compared component-wise.
func under(path, dir string) bool {
	if !filepath.IsAbs(path) || !filepath.IsAbs(dir) {
		return false
	}
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// lxcCapsBeyond lists the capabilities of an lxc.cap.keep value ("sys_admin
// net_raw", or "none") beyond MaxCaps.
func (p Policy) lxcCapsBeyond(v string) []string {
	maxCaps := p.MaxCaps
	if len(maxCaps) == 0 {
		maxCaps = DefaultCaps
	}
	var extra []string
	for _, c := range strings.Fields(v) {
		if c == "none" {
			continue
		}
		name := "CAP_" + strings.ToUpper(c)
		if strings.HasPrefix(strings.ToUpper(c), "CAP_") {
			name = strings.ToUpper(c)
		}
		if !slices.Contains(maxCaps, name) && !slices.Contains(extra, name) {
			extra = append(extra, name)
		}
	}
	return extra
}

// lxcDefaultDevice says whether a device rule ("c 1:3 rwm") is one of
// LXC's defaults, or narrower (less access).
func lxcDefaultDevice(rule string) bool {
	f := strings.Fields(rule)
	if len(f) != 3 {
		return false
	}
	for _, d := range lxcDefaultDevices {
		if f[0] == d[0] && f[1] == d[1] && strings.Trim(f[2], d[2]) == "" {
			return true
		}
	}
	return false
}

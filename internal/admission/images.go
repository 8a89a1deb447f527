package admission

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/capability"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/images"
)

// CheckImages checks the CRIU images in dir against the OCI config.json
// that passed CheckSpec. CRIU restores from the images, not from the
// configuration, what a peer could use to send a modest config.json with
// images that give their tasks more:
//   - each task's credentials, from its core image: every task's
//     permitted, effective, inheritable and bounding sets must lie within
//     the configuration's bounding set;
//   - each task's seccomp state: where the configuration sets a filter,
//     no task may be restored without one;
//   - the mount tree: every mount must be one the configuration makes (or
//     its runtime makes for it: cgroup hierarchies, masked and read-only
//     paths), of the type it names and read-only where it says so; a
//     filesystem CRIU would mount itself from a device or path of this
//     host is refused; and every masked or read-only path that exists on
//     this host must be masked or read-only in the images too.
//
// A configuration that is not an OCI one (LXC's: CheckLXCImages) is not
// checked here.
func (p Policy) CheckImages(dir string, spec []byte) error {
	if p.Privileged {
		return nil
	}
	var s specs.Spec
	if err := json.Unmarshal(spec, &s); err != nil || s.Process == nil {
		return nil
	}
	var allowed uint64
	if c := s.Process.Capabilities; c != nil {
		for _, name := range c.Bounding {
			if bit, ok := capBits[name]; ok {
				allowed |= 1 << bit
			}
		}
	}
	why, err := p.imageTasks(dir, allowed, s.Linux != nil && s.Linux.Seccomp != nil)
	if err != nil {
		return err
	}
	mounts, err := images.Mounts(dir)
	if err != nil {
		return fmt.Errorf("the CRIU images: %w", err)
	}
	why = append(why, imageMounts(&s, mounts, hostHas)...)
	slices.Sort(why)
	return refused(why)
}

// CheckLXCImages checks the CRIU images in dir against the LXC config
// that passed CheckLXCConfig: every task's capability sets must lie
// within what the config keeps (lxc.cap.keep, or every capability but
// those lxc.cap.drop drops, LXC's own includes followed), and where it
// sets a seccomp profile no task may be restored without a filter. Its
// mounts are liblxc's to make at the restore, from the config.
func (p Policy) CheckLXCImages(dir, config string) error {
	if p.Privileged {
		return nil
	}
	lines := lxcLines(config)
	seccomp := false
	for _, l := range lines {
		if l.key == "lxc.seccomp.profile" && l.value != "" {
			seccomp = true
		}
	}
	why, err := p.imageTasks(dir, lxcKept(lines), seccomp)
	if err != nil {
		return err
	}
	slices.Sort(why)
	return refused(why)
}

// imageTasks says which tasks of the images in dir hold capabilities
// beyond allowed, or (filtered) run without a seccomp filter.
func (p Policy) imageTasks(dir string, allowed uint64, filtered bool) ([]string, error) {
	tasks, err := images.Tasks(dir)
	if err != nil {
		return nil, fmt.Errorf("the CRIU images: %w", err)
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("the CRIU images hold no task (no core-*.img)")
	}
	var why []string
	for pid, t := range tasks {
		if extra := t.Caps &^ allowed; extra != 0 {
			why = append(why, fmt.Sprintf("task %d of the CRIU images holds %s, beyond the configuration's bounding set", pid, capNames(extra)))
		}
		if filtered && t.Unfiltered {
			why = append(why, fmt.Sprintf("task %d of the CRIU images runs without the seccomp filter the configuration sets", pid))
		}
	}
	return why, nil
}

// hostHas says whether path exists on this host (a masked path the kernel
// has: the container's /proc and /sys show it too).
func hostHas(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// imageMounts says what of the images' mount tree the configuration s
// does not account for (see CheckImages); has says whether a masked or
// read-only path exists here.
func imageMounts(s *specs.Spec, mounts []images.Mount, has func(string) bool) []string {
	byDest := map[string]specs.Mount{}
	var cgroupDirs []string
	for _, m := range s.Mounts {
		d := filepath.Clean(m.Destination)
		byDest[d] = m
		if m.Type == "cgroup" || m.Type == "cgroup2" {
			cgroupDirs = append(cgroupDirs, d)
		}
	}
	var masked, readonly []string
	if s.Linux != nil {
		masked, readonly = s.Linux.MaskedPaths, s.Linux.ReadonlyPaths
	}
	ids := map[uint32]images.Mount{}
	for _, m := range mounts {
		ids[m.ID] = m
	}
	points := map[string]images.Mount{}
	var why []string
	for _, m := range mounts {
		pt := filepath.Clean("/" + m.Point)
		parent, ok := ids[m.Parent]
		if !ok && pt == "/" {
			continue // the root: the restore's own root filesystem
		}
		points[pt] = m
		what := fmt.Sprintf("the CRIU images mount %s (%s) at %s", m.Type, m.Source, pt)
		switch sm, inSpec := byDest[pt]; {
		case inSpec && isBind(sm):
			if !m.External {
				why = append(why, what+", where the configuration binds "+sm.Source)
			}
		case inSpec:
			if !sameType(sm.Type, m.Type) {
				why = append(why, fmt.Sprintf("%s, where the configuration mounts %s", what, sm.Type))
			}
			// cgroup v1's tmpfs of hierarchies stays writable; they are not.
			if slices.Contains(sm.Options, "ro") && !m.ReadOnly && !(sm.Type == "cgroup" && m.Type == "tmpfs") {
				why = append(why, what+" writable, where the configuration says read-only")
			}
		case slices.ContainsFunc(cgroupDirs, func(d string) bool { return under(pt, d) }):
			sm := byDest[cgroupDirs[slices.IndexFunc(cgroupDirs, func(d string) bool { return under(pt, d) })]]
			if m.Type != "cgroup" && m.Type != "cgroup2" && m.Type != "tmpfs" {
				why = append(why, what+", inside the configuration's cgroup mount")
			}
			if slices.Contains(sm.Options, "ro") && !m.ReadOnly && m.Type != "tmpfs" {
				why = append(why, what+" writable, where the configuration says read-only")
			}
		case slices.Contains(masked, pt):
			// runc masks a file with /dev/null, a directory with an empty
			// read-only tmpfs.
			devNull := m.Root == "/null" && (m.Type == "tmpfs" || m.Type == "devtmpfs")
			if !devNull && !(m.Type == "tmpfs" && m.Root == "/" && m.ReadOnly) {
				why = append(why, what+", which the configuration masks")
			}
		case slices.Contains(readonly, pt):
			if !m.ReadOnly || m.Type != parent.Type {
				why = append(why, what+", which the configuration makes a read-only view of itself")
			}
		default:
			why = append(why, what+", which the configuration does not")
		}
		if !m.External && !virtualFS[m.Type] {
			why = append(why, fmt.Sprintf("the CRIU images mount %s from %s at %s themselves: a file system of this host's", m.Type, m.Source, pt))
		}
	}
	for _, p := range append(slices.Clone(masked), readonly...) {
		p = filepath.Clean(p)
		if _, ok := points[p]; !ok && has(p) {
			why = append(why, fmt.Sprintf("the CRIU images leave %s as it is, which the configuration masks or makes read-only", p))
		}
	}
	return why
}

// virtualFS are the file systems a container's mount tree may have CRIU
// mount anew: none reaches a device or path of the host.
var virtualFS = map[string]bool{"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true, "cgroup": true, "cgroup2": true}

// sameType says whether an image's mount of type got is what the
// configuration's type want makes (cgroup v1's is a tmpfs of hierarchies).
func sameType(want, got string) bool {
	return want == got || want == "cgroup" && (got == "tmpfs" || got == "cgroup2")
}

// capBits maps "CAP_SYS_ADMIN" to its bit, capName the bit to its name.
var capBits, capName = func() (map[string]int, map[int]string) {
	bits, names := map[string]int{}, map[int]string{}
	for _, c := range capability.ListKnown() {
		name := "CAP_" + strings.ToUpper(c.String())
		bits[name], names[int(c)] = int(c), name
	}
	return bits, names
}()

// capNames names the capabilities of a mask, sorted; a bit this library
// has no name for by its number.
func capNames(mask uint64) string {
	var names []string
	for bit := 0; bit < 64; bit++ {
		if mask&(1<<bit) == 0 {
			continue
		}
		name, ok := capName[bit]
		if !ok {
			name = fmt.Sprintf("capability %d", bit)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

package admission_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/images"
)

// writeCore writes a core image for task pid whose capability sets are
// all caps (a bit mask).
func writeCore(t *testing.T, dir string, pid int, caps uint64) {
	t.Helper()
	b, err := images.EncodeTaskCaps(caps)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "core-"+strconv.Itoa(pid)+".img"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// CRIU restores credentials from its images, not from the configuration:
// images whose tasks hold more than the configuration's bounding set are
// refused, and the engines' default set passes.
func TestCheckImagesCapabilities(t *testing.T) {
	spec := encode(t, ordinary())
	// CAP_CHOWN (0), CAP_KILL (5), CAP_NET_BIND_SERVICE (10): in the default set.
	const modest = 1<<0 | 1<<5 | 1<<10
	dir := t.TempDir()
	copyFile(t, filepath.Join(realImages, realMounts), filepath.Join(dir, realMounts))
	writeCore(t, dir, 1, modest)
	writeCore(t, dir, 7, modest)
	if err := (admission.Policy{}).CheckImages(dir, spec); err != nil {
		t.Fatalf("modest images refused: %v", err)
	}
	writeCore(t, dir, 9, modest|1<<21) // CAP_SYS_ADMIN
	err := (admission.Policy{}).CheckImages(dir, spec)
	if !admission.IsRefused(err) || !strings.Contains(err.Error(), "task 9 of the CRIU images holds CAP_SYS_ADMIN") {
		t.Errorf("a task with CAP_SYS_ADMIN: %v", err)
	}
	if err := (admission.Policy{Privileged: true}).CheckImages(dir, spec); err != nil {
		t.Errorf("--allow-privileged: %v", err)
	}
	if err := (admission.Policy{}).CheckImages(t.TempDir(), spec); err == nil {
		t.Error("images without a task passed")
	}
}

// realImages holds what a real dump of a lab container (runc, its own
// network namespace, runc.NewSpec's configuration) wrote: its mount tree
// and its task's core image, with the bundle's config.json.
const (
	realImages = "testdata/runc-images"
	realMounts = "mountpoints-13.img"
)

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// realSpec is the configuration the real images were dumped under.
func realSpec(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(realImages, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withMounts writes a copy of the real images whose mount tree edit
// changed.
func withMounts(t *testing.T, edit func([]images.Mount) []images.Mount) string {
	t.Helper()
	ms, err := images.Mounts(realImages)
	if err != nil {
		t.Fatal(err)
	}
	b, err := images.EncodeMounts(edit(ms))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyFile(t, filepath.Join(realImages, "core-1.img"), filepath.Join(dir, "core-1.img"))
	if err := os.WriteFile(filepath.Join(dir, realMounts), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Real dumps pass under their own configurations: a lab container's, and
// a Podman container's (a seccomp filter, threads, cgroup v1's
// hierarchies, Podman's bind mounts); the first re-encoded too (the test's
// encoder writes what CRIU does).
func TestCheckImagesRealMountTree(t *testing.T) {
	if err := (admission.Policy{}).CheckImages(realImages, realSpec(t)); err != nil {
		t.Fatalf("a real dump refused: %v", err)
	}
	podman, err := os.ReadFile("testdata/podman-images/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := (admission.Policy{}).CheckImages("testdata/podman-images", podman); err != nil {
		t.Fatalf("a real Podman dump refused: %v", err)
	}
	same := withMounts(t, func(ms []images.Mount) []images.Mount { return ms })
	if err := (admission.Policy{}).CheckImages(same, realSpec(t)); err != nil {
		t.Fatalf("the real mount tree, re-encoded, refused: %v", err)
	}
}

// CRIU mounts what the images' mount tree says, not what the
// configuration does: images that mount more, mount it otherwise, or drop
// the masks and read-only views the configuration asks for are refused,
// each saying why.
func TestCheckImagesMountTree(t *testing.T) {
	drop := func(point string) func([]images.Mount) []images.Mount {
		return func(ms []images.Mount) []images.Mount {
			return slices.DeleteFunc(ms, func(m images.Mount) bool { return m.Point == point })
		}
	}
	change := func(point string, f func(*images.Mount)) func([]images.Mount) []images.Mount {
		return func(ms []images.Mount) []images.Mount {
			for i := range ms {
				if ms[i].Point == point {
					f(&ms[i])
				}
			}
			return ms
		}
	}
	root := func(ms []images.Mount) uint32 {
		for _, m := range ms {
			if m.Point == "/" {
				return m.ID
			}
		}
		t.Fatal("no root in the real mount tree")
		return 0
	}
	add := func(m images.Mount) func([]images.Mount) []images.Mount {
		return func(ms []images.Mount) []images.Mount {
			m.Parent = root(ms)
			return append(ms, m)
		}
	}
	for _, c := range []struct {
		name string
		edit func([]images.Mount) []images.Mount
		why  []string
	}{
		{"a host disk", add(images.Mount{ID: 900, Type: "ext4", Point: "/mnt", Root: "/", Source: "/dev/sda1"}),
			[]string{"mount ext4 (/dev/sda1) at /mnt, which the configuration does not", "mount ext4 from /dev/sda1 at /mnt themselves"}},
		{"the host's kernel debug files", add(images.Mount{ID: 900, Type: "debugfs", Point: "/sys/kernel/debug", Root: "/", Source: "debugfs"}),
			[]string{"mount debugfs (debugfs) at /sys/kernel/debug, which the configuration does not"}},
		{"a mask dropped", drop("/proc/keys"), []string{"leave /proc/keys as it is"}},
		{"a read-only view dropped", drop("/proc/sys"), []string{"leave /proc/sys as it is"}},
		{"a mask of the wrong kind", change("/proc/timer_list", func(m *images.Mount) { m.Type, m.Root = "proc", "/timer_list" }),
			[]string{"at /proc/timer_list, which the configuration masks"}},
		{"sysfs writable", change("/sys", func(m *images.Mount) { m.ReadOnly = false }), []string{"at /sys writable"}},
		{"/proc a tmpfs", change("/proc", func(m *images.Mount) { m.Type = "tmpfs" }), []string{"at /proc, where the configuration mounts proc"}},
		{"a read-only view writable", change("/proc/irq", func(m *images.Mount) { m.ReadOnly = false }),
			[]string{"at /proc/irq, which the configuration makes a read-only view"}},
	} {
		dir := withMounts(t, c.edit)
		err := (admission.Policy{}).CheckImages(dir, realSpec(t))
		if !admission.IsRefused(err) {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		for _, w := range c.why {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: refused without saying %q: %v", c.name, w, err)
			}
		}
	}
}

// A configuration that binds a host directory gets it from the runtime
// at the restore (CRIU's external mounts): images that mount it
// themselves are refused.
func TestCheckImagesBindMountsAreTheRuntimes(t *testing.T) {
	var s specs.Spec
	if err := json.Unmarshal(realSpec(t), &s); err != nil {
		t.Fatal(err)
	}
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/srv/data", Options: []string{"rbind"}})
	spec, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	ext := withMounts(t, func(ms []images.Mount) []images.Mount {
		return append(ms, images.Mount{ID: 900, Parent: ms[len(ms)-1].ID, Type: "ext4", Point: "/data", Root: "/srv/data", Source: "/dev/sda1", External: true})
	})
	if err := (admission.Policy{}).CheckImages(ext, spec); err != nil {
		t.Errorf("the configuration's bind, external in the images: %v", err)
	}
	own := withMounts(t, func(ms []images.Mount) []images.Mount {
		return append(ms, images.Mount{ID: 900, Parent: ms[len(ms)-1].ID, Type: "ext4", Point: "/data", Root: "/", Source: "/dev/sda1"})
	})
	if err := (admission.Policy{}).CheckImages(own, spec); !admission.IsRefused(err) || !strings.Contains(err.Error(), "where the configuration binds /srv/data") {
		t.Errorf("a bind the images mount themselves: %v", err)
	}
}

// Where the configuration sets a seccomp filter, a task the images would
// restore without one is refused.
func TestCheckImagesSeccomp(t *testing.T) {
	var s specs.Spec
	if err := json.Unmarshal(realSpec(t), &s); err != nil {
		t.Fatal(err)
	}
	s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}
	spec, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	err = (admission.Policy{}).CheckImages(realImages, spec)
	if !admission.IsRefused(err) || !strings.Contains(err.Error(), "without the seccomp filter the configuration sets") {
		t.Errorf("an unfiltered task under a seccomp configuration: %v", err)
	}
}

// An LXC container's images must not give its tasks more than its config
// keeps: every capability but those it drops, or those it keeps; nor, under
// a seccomp profile, run a task without a filter.
func TestCheckLXCImages(t *testing.T) {
	dir := t.TempDir()
	writeCore(t, dir, 1, 1<<0|1<<21) // CAP_CHOWN, CAP_SYS_ADMIN
	const drops = "lxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio\n"
	if err := (admission.Policy{}).CheckLXCImages(dir, drops); err != nil {
		t.Fatalf("images within what the config keeps refused: %v", err)
	}
	if err := (admission.Policy{}).CheckLXCImages(dir, drops+"lxc.cap.drop = sys_admin\n"); !admission.IsRefused(err) || !strings.Contains(err.Error(), "task 1 of the CRIU images holds CAP_SYS_ADMIN") {
		t.Errorf("CAP_SYS_ADMIN under a config that drops it: %v", err)
	}
	if err := (admission.Policy{}).CheckLXCImages(dir, "lxc.cap.keep = chown kill\n"); !admission.IsRefused(err) || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") {
		t.Errorf("CAP_SYS_ADMIN under a config that keeps chown and kill: %v", err)
	}
	if err := (admission.Policy{}).CheckLXCImages(dir, drops+"lxc.seccomp.profile = /usr/share/lxc/config/common.seccomp\n"); !admission.IsRefused(err) || !strings.Contains(err.Error(), "seccomp") {
		t.Errorf("an unfiltered task under a seccomp profile: %v", err)
	}
}

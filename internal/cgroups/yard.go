package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	occgroups "github.com/opencontainers/cgroups"
)

// Yard makes dir a cgroup yard for CRIU (its cgroup-yard option): one link
// per hierarchy this process belongs to, to where that hierarchy is
// mounted whole, named as CRIU looks for it: the controllers as
// /proc/self/cgroup lists them ("cpu,cpuacct"), a named hierarchy's name
// ("systemd" for name=systemd), "unified" for v2. A dump given the yard
// opens the hierarchies there; without it CRIU mounts each anew, and a new
// cgroup2 mount took ~12 ms here, every dump, with the container frozen.
// A hierarchy that is not mounted whole is an error, and dir is left
// without a yard: CRIU must find every one it needs or none.
func Yard(dir string) error {
	own, err := occgroups.ParseCgroupFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return err
	}
	var known []string // every controller, to tell them from mount flags
	for controllers := range own {
		known = append(known, strings.Split(controllers, ",")...)
	}
	links := map[string]string{}
	for controllers := range own {
		at := hierarchyMount(mounts, controllers, known)
		if at == "" {
			return fmt.Errorf("cgroups: no mount of the whole %q hierarchy", controllers)
		}
		links[yardName(controllers)] = at
	}
	if err := os.RemoveAll(dir); err != nil { // an earlier dump's
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, at := range links {
		if err := os.Symlink(at, filepath.Join(dir, name)); err != nil {
			_ = os.RemoveAll(dir)
			return err
		}
	}
	return nil
}

// yardName is CRIU's name, in a yard, for the hierarchy /proc/PID/cgroup
// lists with controllers.
func yardName(controllers string) string {
	switch {
	case controllers == "":
		return "unified"
	case strings.HasPrefix(controllers, "name="):
		return strings.TrimPrefix(controllers, "name=")
	}
	return controllers
}

// hierarchyMount is where the hierarchy of controllers (a /proc/PID/cgroup
// field: "" for v2) is mounted from its root, or "". known names every
// controller, so that a mount's flags (rw, xattr) are not taken for one.
func hierarchyMount(mounts []*mountinfo.Info, controllers string, known []string) string {
	want := strings.Split(controllers, ",")
	slices.Sort(want)
	for _, m := range mounts {
		if m.Root != "/" {
			continue
		}
		if controllers == "" {
			if m.FSType == "cgroup2" {
				return m.Mountpoint
			}
			continue
		}
		if m.FSType != "cgroup" {
			continue
		}
		var have []string
		for _, o := range strings.Split(m.VFSOptions, ",") {
			if slices.Contains(known, o) {
				have = append(have, o)
			}
		}
		slices.Sort(have)
		if slices.Equal(have, want) {
			return m.Mountpoint
		}
	}
	return ""
}

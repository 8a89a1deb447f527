// Package mounts finds and removes the mounts below a directory (CRIU's
// cgroup yard in a work directory, Podman's storage, a root filesystem
// being built), so that removing the directory neither fails nor reaches
// through a mount.
package mounts

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Parse lists the mount points in a mountinfo table that are dir or
// below it, deepest first so they can be unmounted in order.
func Parse(mountinfo io.Reader, dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	var found []string
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			found = append(found, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(found, func(i, j int) bool {
		return strings.Count(found[i], "/") > strings.Count(found[j], "/")
	})
	return found, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Under lists this mount namespace's mount points at or below dir,
// deepest first.
func Under(dir string) ([]string, error) { return readMountinfo(dir, Parse) }

// readMountinfo runs parse over this mount namespace's mountinfo table
// for dir made absolute.
func readMountinfo[T any](dir string, parse func(io.Reader, string) (T, error)) (T, error) {
	var zero T
	abs, err := filepath.Abs(dir)
	if err != nil {
		return zero, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return zero, err
	}
	defer f.Close()
	return parse(f, abs)
}

// UnmountUnder detaches every mount at or below dir, so that removing dir
// never leaves a mount (or deletes files through one) behind.
func UnmountUnder(dir string) error {
	mps, err := Under(dir)
	if err != nil {
		return err
	}
	for _, mp := range mps {
		// A mount can appear twice when stacked; EINVAL means it is
		// already gone.
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	return nil
}

// RemoveAll removes dir and everything below it, mounts detached first.
func RemoveAll(dir string) error {
	if err := UnmountUnder(dir); err != nil {
		return err
	}
	if left, err := Under(dir); err != nil || len(left) > 0 {
		return errors.Join(err, fmt.Errorf("still mounted below %s: %v", dir, left))
	}
	return os.RemoveAll(dir)
}

// Overlay is an overlayfs mount's layers.
type Overlay struct {
	// Lower are the read-only layers, uppermost first.
	Lower []string
	// Upper and Work are the writable layer and overlayfs's scratch
	// directory beside it.
	Upper, Work string
}

// OverlayAt returns the layers of the overlayfs mounted at dir, or nil
// when what is mounted there (the last mount, where several are stacked)
// is not an overlay or dir is no mount point.
func OverlayAt(dir string) (*Overlay, error) { return readMountinfo(dir, ParseOverlay) }

// ParseOverlay is OverlayAt over a mountinfo table.
func ParseOverlay(mountinfo io.Reader, dir string) (*Overlay, error) {
	dir = filepath.Clean(dir)
	var found *Overlay
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || unescapeMount(fields[4]) != dir {
			continue
		}
		found = nil
		sep := slices.Index(fields, "-")
		if sep < 0 || len(fields) < sep+4 || fields[sep+1] != "overlay" {
			continue
		}
		o, err := parseOverlayOptions(fields[sep+3])
		if err != nil {
			return nil, fmt.Errorf("overlay at %s: %w", dir, err)
		}
		found = o
	}
	return found, sc.Err()
}

// parseOverlayOptions reads lowerdir, upperdir and workdir from an
// overlay's super options. The kernel escapes a comma, space or backslash
// in a path as an octal sequence; a colon inside a layer's path would be
// escaped with a backslash, which ferry refuses rather than guess.
func parseOverlayOptions(opts string) (*Overlay, error) {
	var o Overlay
	for _, kv := range strings.Split(opts, ",") {
		k, v, _ := strings.Cut(kv, "=")
		v = unescapeMount(v)
		switch k {
		case "lowerdir", "lowerdir+":
			if strings.Contains(v, `\`) {
				return nil, fmt.Errorf("a lower layer's path holds an escaped character: %q", v)
			}
			o.Lower = append(o.Lower, strings.Split(v, ":")...)
		case "datadir+":
			return nil, errors.New("data-only lower layers are not supported")
		case "upperdir":
			o.Upper = v
		case "workdir":
			o.Work = v
		}
	}
	if len(o.Lower) == 0 {
		return nil, errors.New("no lowerdir in its options")
	}
	return &o, nil
}

// Mount mounts the overlay at dir. The layers' paths must not hold ',' or
// ':' (overlayfs's option syntax); the caller has checked them.
func (o Overlay) Mount(dir string) error {
	opts := "lowerdir=" + strings.Join(o.Lower, ":") + ",upperdir=" + o.Upper + ",workdir=" + o.Work
	if err := unix.Mount("overlay", dir, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount an overlay at %s: %w", dir, err)
	}
	return nil
}

// MakeShared makes dir a shared mount point, bound onto itself first if
// it is not a mount point yet: what `ip netns add` does to /run/netns, so
// that what is mounted there later (a named network namespace) also
// appears in the mount namespaces that copied it as a slave, and goes
// from them when it goes here.
func MakeShared(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount %s: %w", dir, err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

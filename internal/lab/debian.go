package lab

// A real distribution's root filesystem for lab and bench containers: a
// minbase Debian 12 (bookworm) with redis-server and a few more packages,
// built once with mmdebstrap (or debootstrap) from the mirror this
// machine's apt uses, and cached as a tarball. The same tarball serves as a
// runc bundle's rootfs (LayDebianRootfs), a Podman image
// (ImportDebianImage) and an LXC rootfs (the directory LayDebianRootfs
// fills; LXC needs nothing more).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/aptsources"
	"github.com/ferry-migrate/ferry/internal/filelock"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/runtime/podman"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// Root filesystem kinds of a lab container (RunOptions.Rootfs).
const (
	// RootfsBusybox is the default: busybox and ferry's static workloads.
	RootfsBusybox = "busybox"
	// RootfsDebian is the cached Debian minbase (EnsureDebianRootfs) with
	// ferry's workloads in /usr/local/bin.
	RootfsDebian = "debian"
)

// DebianRecipeVersion is part of the cache key: bump it whenever the way
// the root filesystem is built changes (not the package list, which is in
// the key already), so that caches built the old way are not reused.
const DebianRecipeVersion = 1

// DebianSuite is the Debian release the root filesystem is built from.
const DebianSuite = "bookworm"

// DebianPackages are installed on top of minbase. redis-server (with
// redis-cli from redis-tools) is the real server; python3 gives a second
// one (python3 -m http.server) and, with procps and iproute2, brings the
// root filesystem past 10,000 files (minbase with redis alone has ~8,850),
// the size of a real distribution's image that the migration must handle.
var DebianPackages = []string{"redis-server", "redis-tools", "python3", "procps", "iproute2"}

// DebianOptions say how the Debian root filesystem is built and where it
// is cached. The zero value is the lab's default.
type DebianOptions struct {
	// CacheDir holds the built tarballs; empty means DefaultRootfsCache().
	CacheDir string
	// Packages replace DebianPackages when set.
	Packages []string
	// Mirror and SecurityMirror are the archive URLs; empty means the
	// ones this machine's apt uses (DebianMirrors).
	Mirror, SecurityMirror string
	// Tool is "mmdebstrap", "debootstrap", or empty: mmdebstrap, and
	// debootstrap when mmdebstrap is missing or fails.
	Tool string
	// Log receives the builder's output while a build runs; nil discards
	// it (errors still quote its end).
	Log io.Writer
}

// DebianRootfs is a built, cached root filesystem.
type DebianRootfs struct {
	// Tarball is the cached root filesystem (numeric owners, xattrs).
	Tarball string
	// Key identifies the recipe and package list (the hash in the name).
	Key string
	// Built is true when this call built it, false when it was cached.
	Built bool
	// Tool built it (only when Built).
	Tool string
}

// DefaultRootfsCache is where built root filesystems are kept:
// $FERRY_CACHE/rootfs, by default /var/cache/ferry/rootfs (setup.sh keeps
// its downloads in the same $FERRY_CACHE).
func DefaultRootfsCache() string { return filelock.CacheDir("rootfs") }

func (o DebianOptions) cacheDir() string {
	if o.CacheDir != "" {
		return o.CacheDir
	}
	return DefaultRootfsCache()
}

func (o DebianOptions) packages() []string {
	p := DebianPackages
	if len(o.Packages) > 0 {
		p = o.Packages
	}
	p = slices.Clone(p)
	slices.Sort(p)
	return slices.Compact(p)
}

// Key is the cache key: a hash of the recipe version, suite, variant and
// package list (in any order). The mirror is not part of it: any mirror
// serves the same release.
func (o DebianOptions) Key() string {
	sum := sha256.Sum256(fmt.Appendf(nil, "ferry debian rootfs recipe %d\nsuite %s\nvariant minbase\npackages %s\n",
		DebianRecipeVersion, DebianSuite, strings.Join(o.packages(), ",")))
	return hex.EncodeToString(sum[:])[:12]
}

// name is the cached tarball's base name without extension.
func (o DebianOptions) name() string { return "debian-" + DebianSuite + "-" + o.Key() }

// Path is where the cached tarball is (or will be).
func (o DebianOptions) Path() string { return filepath.Join(o.cacheDir(), o.name()+".tar") }

// ImageName is the Podman image ImportDebianImage makes.
func (o DebianOptions) ImageName() string { return "localhost/ferry-debian:" + o.Key() }

// EnsureDebianRootfs returns the cached root filesystem, building it first
// when it is not cached. The build happens in a temporary directory of
// the cache and is renamed into place only when complete; a lock file
// keeps concurrent callers from building it twice.
func EnsureDebianRootfs(ctx context.Context, o DebianOptions) (DebianRootfs, error) {
	r := DebianRootfs{Tarball: o.Path(), Key: o.Key()}
	built, err := filelock.Build(ctx, r.Tarball, func(tmp string) (string, error) {
		mirror, security := o.Mirror, o.SecurityMirror
		if mirror == "" || security == "" {
			m, s := DebianMirrors()
			mirror, security = orDefault(mirror, m), orDefault(security, s)
		}
		out := filepath.Join(tmp, "rootfs.tar")
		var errs []error
		for _, tool := range o.tools() {
			if _, err := exec.LookPath(tool); err != nil {
				errs = append(errs, fmt.Errorf("%s: not installed (scripts/setup.sh installs it)", tool))
				continue
			}
			build := buildMmdebstrap
			if tool == "debootstrap" {
				build = buildDebootstrap
			}
			if o.Log != nil {
				fmt.Fprintf(o.Log, "building the Debian %s root filesystem with %s from %s (once; cached as %s)\n", DebianSuite, tool, mirror, r.Tarball)
			}
			if err := build(ctx, o, tmp, out, mirror, security); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", tool, err))
				_ = os.Remove(out)
				continue
			}
			r.Tool = tool
			return out, nil
		}
		return "", fmt.Errorf("build the Debian root filesystem: %w", errors.Join(errs...))
	})
	r.Built = built
	return r, err
}

func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (o DebianOptions) tools() []string {
	if o.Tool != "" {
		return []string{o.Tool}
	}
	return []string{"mmdebstrap", "debootstrap"}
}

// sourcesLines are the apt sources of the root filesystem.
func sourcesLines(mirror, security string) []string {
	return []string{
		fmt.Sprintf("deb %s %s main", mirror, DebianSuite),
		fmt.Sprintf("deb %s %s-updates main", mirror, DebianSuite),
		fmt.Sprintf("deb %s %s-security main", security, DebianSuite),
	}
}

// buildMmdebstrap writes the root filesystem as the tarball out. mmdebstrap
// cleans apt's package lists and caches itself.
func buildMmdebstrap(ctx context.Context, o DebianOptions, tmp, out, mirror, security string) error {
	args := []string{"--variant=minbase", "--components=main",
		"--include=" + strings.Join(o.packages(), ","),
		"--aptopt=Acquire::Retries \"3\"",
		DebianSuite, out}
	args = append(args, sourcesLines(mirror, security)...)
	c := exec.CommandContext(ctx, "mmdebstrap", args...)
	// Its scratch directory goes to the cache's file system, not /tmp.
	c.Env = append(os.Environ(), "TMPDIR="+tmp)
	return tail.Run(c, o.Log, 8)
}

// buildDebootstrap installs into a directory and tars it. debootstrap
// takes one mirror, so the result lacks the updates mmdebstrap gets from
// bookworm-updates and -security; its apt sources list all three.
func buildDebootstrap(ctx context.Context, o DebianOptions, tmp, out, mirror, security string) error {
	root := filepath.Join(tmp, "root")
	c := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--components=main",
		"--include="+strings.Join(o.packages(), ","), DebianSuite, root, mirror)
	err := tail.Run(c, o.Log, 8)
	// debootstrap mounts proc and sys inside (and /dev in some setups);
	// none may stay, or removing the directory would reach into them.
	if uerr := mounts.UnmountUnder(root); uerr != nil {
		return errors.Join(err, uerr)
	}
	if err != nil {
		return err
	}
	sources := strings.Join(sourcesLines(mirror, security), "\n") + "\n"
	if err := os.WriteFile(filepath.Join(root, "etc/apt/sources.list"), []byte(sources), 0o644); err != nil {
		return err
	}
	for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"} {
		files, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, f := range files {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	c = exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "--sort=name",
		"-C", root, "-cf", out, ".")
	return tail.Run(c, o.Log, 8)
}

// DebianMirrors returns the Debian archive and security archive URLs this
// machine's apt uses, or deb.debian.org's (aptsources.Mirrors).
func DebianMirrors() (mirror, security string) { return aptsources.Mirrors() }

// DebianMirrorReachable asks the mirror for the suite's release file,
// within timeout.
func DebianMirrorReachable(ctx context.Context, o DebianOptions, timeout time.Duration) error {
	mirror := o.Mirror
	if mirror == "" {
		mirror, _ = DebianMirrors()
	}
	return aptsources.Reachable(ctx, mirror, DebianSuite, timeout)
}

// LayDebianRootfs fills dir (a runc bundle's rootfs, or an LXC container's
// rootfs directory) with the Debian root filesystem, building and caching
// it first if needed, and adds ferry's workload binaries from the ferry
// binary's directory to /usr/local/bin.
func LayDebianRootfs(ctx context.Context, dir string, o DebianOptions) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, err := EnsureDebianRootfs(ctx, o)
	if err != nil {
		return err
	}
	return layDebianRootfs(ctx, r.Tarball, dir, filepath.Dir(exe))
}

// layDebianRootfs extracts tarball into dir (extractDebian) and installs
// the workloads from binDir in /usr/local/bin (a real directory: /bin is a
// symlink in a merged-/usr Debian).
func layDebianRootfs(ctx context.Context, tarball, dir, binDir string) error {
	if err := extractDebian(ctx, tarball, dir); err != nil {
		return err
	}
	return installWorkloads(dir, binDir, "usr/local/bin")
}

// extractDebian extracts tarball into dir, keeping numeric owners, modes
// and xattrs but no device files (the runtime makes /dev), and writes the
// basic /etc files the lab's own rootfs has where Debian lacks them.
func extractDebian(ctx context.Context, tarball, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c := exec.CommandContext(ctx, "tar", "--numeric-owner", "--same-owner", "--same-permissions",
		"--xattrs", "--xattrs-include=*", "--exclude=./dev/*", "-C", dir, "-xf", tarball)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("extract %s: %v: %s", tarball, err, tail.Lines(string(out), 6))
	}
	for name, content := range rootfsFiles {
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// DebianImageRoot holds the Debian root filesystems unpacked as images
// (EnsureDebianImage), which the lab's containers share as the lower layer
// of an overlay root. The lab's agents take it as their --image-root.
func DebianImageRoot() string { return filepath.Join(DefaultRootfsCache(), "images") }

// EnsureDebianImage returns the directory of the Debian root filesystem
// unpacked as an image below DebianImageRoot, unpacking it (into a
// temporary directory renamed into place) if it is not there yet. Nothing
// writes to it afterwards: the containers' writes go to their own layers.
func EnsureDebianImage(ctx context.Context, o DebianOptions) (string, error) {
	r, err := EnsureDebianRootfs(ctx, o)
	if err != nil {
		return "", err
	}
	root := DebianImageRoot()
	dir := filepath.Join(root, o.name())
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	unlock, err := filelock.Lock(ctx, filepath.Join(root, o.name()+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp := filepath.Join(root, ".unpack-"+o.name())
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := extractDebian(ctx, r.Tarball, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	return dir, os.Rename(tmp, dir)
}

// layRootfs fills a lab container's bundle with the kind of root
// filesystem asked for: a Debian one by default as an overlay, the image
// below and the container's own layer (bundle/upper) above, with the
// workloads installed through it.
func layRootfs(ctx context.Context, o RunOptions, bundle, binDir string) error {
	root := filepath.Join(bundle, "rootfs")
	switch {
	case o.Rootfs == "" || o.Rootfs == RootfsBusybox:
		return buildRootfs(root, binDir)
	case o.Rootfs == RootfsDebian && o.CopyImage:
		r, err := EnsureDebianRootfs(ctx, DebianOptions{Packages: o.Packages})
		if err != nil {
			return err
		}
		return layDebianRootfs(ctx, r.Tarball, root, binDir)
	case o.Rootfs == RootfsDebian:
		image, err := EnsureDebianImage(ctx, DebianOptions{Packages: o.Packages})
		if err != nil {
			return err
		}
		ov := mounts.Overlay{Lower: []string{image}, Upper: filepath.Join(bundle, "upper"), Work: filepath.Join(bundle, "work")}
		for _, d := range []string{root, ov.Upper, ov.Work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := ov.Mount(root); err != nil {
			return err
		}
		return installWorkloads(root, binDir, "usr/local/bin")
	}
	return fmt.Errorf("unknown root filesystem %q: want %s or %s", o.Rootfs, RootfsBusybox, RootfsDebian)
}

// ImportDebianImage makes the Debian root filesystem (with ferry's
// workloads from binDir; empty means the ferry binary's directory) an
// image of the Podman host h, named o.ImageName(), and returns that name.
// It goes through podman.Host.ImportRootfs, which gives the same
// directory the same image ID on every host (what `podman container
// restore --import` needs), unlike `podman import`.
func ImportDebianImage(ctx context.Context, h podman.Host, o DebianOptions, binDir string) (string, error) {
	if binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		binDir = filepath.Dir(exe)
	}
	r, err := EnsureDebianRootfs(ctx, o)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "ferry-debian-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "rootfs")
	if err := layDebianRootfs(ctx, r.Tarball, dir, binDir); err != nil {
		return "", err
	}
	image := o.ImageName()
	if err := h.ImportRootfs(ctx, dir, image); err != nil {
		return "", err
	}
	return image, nil
}

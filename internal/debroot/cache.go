// Package debroot gives the package tests clean Debian hosts to install
// ferry's .debs into: a minimal Debian root filesystem built once with
// mmdebstrap and cached (Ensure), a fresh copy of it with the .debs
// installed by apt as an operator would (Install), and commands run
// inside such a root as on a host of its own (Mount): a mount namespace
// of the root's whose root it is, in a network namespace the caller names.
//
// Nothing of ferry comes from the machine or the working tree once the
// .debs are built (BuildDebs): the root holds no clone and no Go.
package debroot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/aptsources"
	"github.com/ferry-migrate/ferry/internal/filelock"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// RecipeVersion enters the cache key: bump it whenever the way the root
// is built changes beyond what Options.buildArgs already says.
const RecipeVersion = 1

// DefaultSuite is Debian 12, the release ferry's packages are for.
const DefaultSuite = "bookworm"

// DefaultPackages go into the root on top of minbase: what an agent's host
// has besides ferry, so that installing ferry's .debs needs no download.
var DefaultPackages = []string{
	// ferry's Depends, and what its agent runs.
	"runc", "iproute2", "iptables",
	// ferry-criu's Depends: the libraries its CRIU links (dpkg-shlibdeps
	// in scripts/release-criu.sh; libc6 is in minbase).
	"libbsd0", "libnet1", "libnftables1", "libnl-3-200", "libprotobuf-c1", "libuuid1",
	// What every Debian host has and the package's scripts and unit use:
	// systemd-tmpfiles (postinst), systemd-analyze (the unit's check),
	// sysctl (postinst).
	"systemd", "procps",
}

// Options say which root is built and where it is cached. The zero value
// is the package tests' root.
type Options struct {
	// CacheDir holds the built roots; "" is DefaultCacheDir().
	CacheDir string
	// Suite is the Debian release; "" is DefaultSuite.
	Suite string
	// Packages replace DefaultPackages when set.
	Packages []string
	// Mirror and SecurityMirror are the archives; "" takes the ones this
	// machine's apt uses (/etc/apt/sources.list.d/debian.sources first).
	// They are not part of the key: any mirror serves the same release.
	Mirror, SecurityMirror string
	// Log receives mmdebstrap's output while it builds; nil discards it
	// (an error still quotes its end).
	Log io.Writer
}

// DefaultCacheDir is $FERRY_CACHE/debroot, by default
// /var/cache/ferry/debroot (beside setup.sh's other caches).
func DefaultCacheDir() string { return filelock.CacheDir("debroot") }

func (o Options) cacheDir() string {
	if o.CacheDir != "" {
		return o.CacheDir
	}
	return DefaultCacheDir()
}

func (o Options) suite() string {
	if o.Suite != "" {
		return o.Suite
	}
	return DefaultSuite
}

func (o Options) packages() []string {
	p := DefaultPackages
	if len(o.Packages) > 0 {
		p = o.Packages
	}
	p = slices.Clone(p)
	slices.Sort(p)
	return slices.Compact(p)
}

// buildArgs are mmdebstrap's options, the suite and the package list:
// everything of its command line but the mirrors and the output.
func (o Options) buildArgs() []string {
	return []string{
		"--variant=minbase", "--components=main",
		"--include=" + strings.Join(o.packages(), ","),
		// apt's package lists stay, as on an installed host: `apt install
		// ./x.deb` then finds a dependency the root lacks.
		"--skip=cleanup/apt/lists",
		`--aptopt=Acquire::Retries "3"`,
	}
}

// Key identifies the root: a hash of the recipe's version, the suite and
// mmdebstrap's options (the package list among them, in any order).
func (o Options) Key() string {
	sum := sha256.Sum256(fmt.Appendf(nil, "ferry debroot recipe %d\nsuite %s\n%s\n",
		RecipeVersion, o.suite(), strings.Join(o.buildArgs(), "\n")))
	return hex.EncodeToString(sum[:])[:12]
}

func (o Options) name() string { return "debroot-" + o.suite() + "-" + o.Key() }

// Path is the cached root's tarball.
func (o Options) Path() string { return filepath.Join(o.cacheDir(), o.name()+".tar") }

// Cached is a built root.
type Cached struct {
	// Tarball holds the root (numeric owners, xattrs, device nodes).
	Tarball string
	Key     string
	// Built is true when this call built it; Took is how long that took.
	Built bool
	Took  time.Duration
}

// Ensure returns the cached root, building it first when it is not
// there. Concurrent callers (other processes too) wait for one build: an
// flock beside the tarball. The build goes to a temporary directory of
// the cache, renamed into place when complete.
func Ensure(ctx context.Context, o Options) (Cached, error) {
	c := Cached{Tarball: o.Path(), Key: o.Key()}
	start := time.Now()
	built, err := filelock.Build(ctx, c.Tarball, func(tmp string) (string, error) {
		if _, err := exec.LookPath("mmdebstrap"); err != nil {
			return "", fmt.Errorf("build the Debian root: mmdebstrap is not installed (make setup installs it): %w", err)
		}
		mirror, security := o.Mirror, o.SecurityMirror
		if mirror == "" {
			m, s, err := aptsources.Find(aptsources.System)
			if err != nil {
				return "", fmt.Errorf("build the Debian root: which mirror? %w", err)
			}
			mirror = m
			if security == "" {
				security = s
			}
		}
		// apt downloads as its sandbox user, who must reach its lists here.
		if err := os.Chmod(tmp, 0o755); err != nil {
			return "", err
		}
		out := filepath.Join(tmp, "root.tar")
		args := append(o.buildArgs(), o.suite(), out)
		args = append(args, sourceLines(o.suite(), mirror, security)...)
		if o.Log != nil {
			fmt.Fprintf(o.Log, "debroot: building the Debian %s root with mmdebstrap from %s (once; cached as %s)\n", o.suite(), mirror, c.Tarball)
		}
		cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
		// Its scratch goes to the cache's file system, not /tmp; its mounts
		// (root mode mounts /proc, /sys and /dev in the chroot it builds)
		// live in a mount namespace of its own, gone with it however it ends.
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		if err := tail.Run(cmd, o.Log, 15); err != nil {
			return "", fmt.Errorf("build the Debian root: %w", err)
		}
		return out, nil
	})
	if err != nil {
		return c, err
	}
	if built {
		c.Built, c.Took = true, time.Since(start)
	}
	return c, nil
}

// sourceLines are the root's apt sources.
func sourceLines(suite, mirror, security string) []string {
	lines := []string{
		fmt.Sprintf("deb %s %s main", mirror, suite),
		fmt.Sprintf("deb %s %s-updates main", mirror, suite),
	}
	if security != "" {
		lines = append(lines, fmt.Sprintf("deb %s %s-security main", security, suite))
	}
	return lines
}

// Package criu probes the CRIU binary and the kernel features it relies on,
// and reads the statistics CRIU leaves in an images directory. Checkpoints
// themselves are taken through runc (internal/runc).
package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// MinVersion is the oldest CRIU ferry supports: 4.1.1 cannot dump TCP
// sockets on Linux >= 6.16 (SO_PASSCRED), 4.2.1 can.
var MinVersion = Version{Major: 4, Minor: 2, Sublevel: 1}

// Places ferry looks for CRIU, in order, before PATH: the ferry-criu
// package's, then the one `make setup` builds. Both carry ferry's patches,
// whatever else PATH holds (Debian's own criu 3.17 fails on new kernels).
var binaryPlaces = []string{"/usr/libexec/ferry/criu", "/usr/local/sbin/criu"}

// BinaryEnv, when set, names the CRIU ferry uses instead (tests, or a CRIU
// kept elsewhere). Its file must be named criu: runc, Podman and liblxc
// look that name up in PATH (see UseBinary).
const BinaryEnv = "FERRY_CRIU"

// Binary returns the CRIU ferry uses on this host: $FERRY_CRIU, else the
// first of binaryPlaces that is an executable file, else criu from PATH.
// Every part of ferry that runs CRIU asks here.
func Binary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return exec.LookPath(p)
	}
	for _, p := range binaryPlaces {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath("criu")
}

// bin is Binary's answer, or plain "criu" so that the error names it.
func bin() string {
	if p, err := Binary(); err == nil {
		return p
	}
	return "criu"
}

// UseBinary puts the directory of the CRIU Binary chooses first in this
// process's PATH, so that what it starts (runc, Podman, lxc-*) runs the
// same CRIU as ferry does: they look "criu" up in PATH. The agent calls it
// once at start, before any goroutine reads the environment.
func UseBinary() (string, error) {
	p, err := Binary()
	if err != nil {
		return "", err
	}
	if filepath.Base(p) != "criu" {
		return p, fmt.Errorf("%s: runc and liblxc run \"criu\" from PATH, so the file must be named criu", p)
	}
	if found, err := exec.LookPath("criu"); err == nil && found == p {
		return p, nil
	}
	return p, os.Setenv("PATH", filepath.Dir(p)+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// Version is a CRIU release number.
type Version struct {
	Major, Minor, Sublevel int
}

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Sublevel)
}

// AtLeast reports whether v is maj.min.sub or newer.
func (v Version) AtLeast(maj, min, sub int) bool {
	if v.Major != maj {
		return v.Major > maj
	}
	if v.Minor != min {
		return v.Minor > min
	}
	return v.Sublevel >= sub
}

// ParseVersion reads the output of `criu --version` ("Version: 4.2.1",
// possibly followed by a "GitID:" line) or a bare "4.2.1". A missing
// sublevel counts as 0, as CRIU prints "4.2" for x.y.0 releases.
func ParseVersion(out string) (Version, error) {
	s := strings.TrimSpace(out)
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "Version:"); ok {
			s = strings.TrimSpace(rest)
			break
		}
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, fmt.Errorf("criu: unrecognised version %q", strings.TrimSpace(out))
	}
	var nums [3]int
	for i, p := range parts {
		// Tolerate suffixes such as "1-rc2" or "1+git".
		end := 0
		for end < len(p) && p[end] >= '0' && p[end] <= '9' {
			end++
		}
		n, err := strconv.Atoi(p[:end])
		if err != nil {
			return Version{}, fmt.Errorf("criu: unrecognised version %q", strings.TrimSpace(out))
		}
		nums[i] = n
	}
	return Version{Major: nums[0], Minor: nums[1], Sublevel: nums[2]}, nil
}

// InstalledVersion runs `criu --version` (named so because a func cannot
// share the name of the Version type). Running the binary is simpler than go-criu's
// GetCriuVersion, which needs a `criu swrk` RPC session, and it reports the
// same binary (the one in PATH) that runc will use.
func InstalledVersion(ctx context.Context) (Version, error) {
	i, err := Installed(ctx)
	return i.Version, err
}

// Info is what `criu --version` tells of a CRIU: its release and the
// ferry patches it carries.
type Info struct {
	Version Version
	Patches Patches
}

// Installed runs `criu --version` of the CRIU Binary chooses.
func Installed(ctx context.Context) (Info, error) {
	out, err := exec.CommandContext(ctx, bin(), "--version").CombinedOutput()
	if err != nil {
		return Info{}, fmt.Errorf("criu --version: %w: %s", err, strings.TrimSpace(string(out)))
	}
	v, err := ParseVersion(string(out))
	return Info{Version: v, Patches: ParsePatches(string(out))}, err
}

// Check runs `criu check`. It fails, carrying CRIU's output, unless CRIU says
// "Looks good" (which it also says, with a caveat, when only optional kernel
// features are missing).
func Check(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, bin(), "check").CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err == nil && strings.Contains(text, "Looks good") {
		return nil
	}
	if err == nil {
		err = errors.New("no \"Looks good\"")
	}
	return fmt.Errorf("criu check: %w: %s", err, text)
}

// HasFeature reports whether `criu check --feature name` succeeds, e.g. for
// uffd-noncoop, mem_dirty_track or tcp_half_closed.
func HasFeature(ctx context.Context, name string) bool {
	return exec.CommandContext(ctx, bin(), "check", "--feature", name).Run() == nil
}

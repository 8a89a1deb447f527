// Package criu probes the CRIU binary and the kernel features it relies on,
// and reads the statistics CRIU leaves in an images directory. Checkpoints
// themselves are taken through runc (internal/runtime/runc).
package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// MinVersion is the oldest CRIU ferry supports: 4.1.1 cannot dump TCP
// sockets on Linux >= 6.16 (SO_PASSCRED), 4.2.1 can.
var MinVersion = Version{Major: 4, Minor: 2, Sublevel: 1}

// Binary returns the path of the criu executable found in PATH.
func Binary() (string, error) {
	return exec.LookPath("criu")
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
	out, err := exec.CommandContext(ctx, "criu", "--version").CombinedOutput()
	if err != nil {
		return Version{}, fmt.Errorf("criu --version: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return ParseVersion(string(out))
}

// Check runs `criu check`. It fails, carrying CRIU's output, unless CRIU says
// "Looks good" (which it also says, with a caveat, when only optional kernel
// features are missing).
func Check(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "criu", "check").CombinedOutput()
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
	return exec.CommandContext(ctx, "criu", "check", "--feature", name).Run() == nil
}

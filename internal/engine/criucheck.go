package engine

import (
	"fmt"
	"strings"

	"github.com/ferry-migrate/ferry/internal/criu"
)

// criuFix is what an operator does for a host whose CRIU lacks ferry's
// patches.
func criuFix(hostName string) string {
	return fmt.Sprintf("install the ferry-criu package on %s, or run `make setup` there (it builds CRIU with ferry's patches); `ferry check` on %s shows what its CRIU lacks", hostName, hostName)
}

// describe names a host's CRIU for a message.
func (c *CRIUCaps) describe(hostName string) string {
	what := "CRIU"
	if c.Version != "" {
		what += " " + c.Version
	}
	if c.Path != "" {
		what += " at " + c.Path
	}
	return fmt.Sprintf("%s's %s (ferry patches: %s)", hostName, what, c.Patches)
}

// criuRefusal says why a migration running technique key cannot go
// ahead for want of a CRIU patch, or nil. Each end checks what its own
// CRIU must carry for its side (only it knows its runtime: lazyRestore
// says the destination's restores lazily), and, told the peer's CRIU,
// whether the destination's restores what the source's dumps. here is
// this end's CRIU (nil: not told, nothing checked), on hostName; peer the
// other end's (nil: not told), on peerName.
func criuRefusal(key string, side criu.Side, hostName string, here *CRIUCaps, peerName string, peer *CRIUCaps, lazyRestore bool) error {
	if here == nil {
		return nil
	}
	if missing := criu.Blocking(here.Patches, criu.Job{Technique: key, Side: side, LazyRestore: lazyRestore}); len(missing) > 0 {
		return blockingError(key, hostName, here, missing)
	}
	if peer == nil {
		return nil
	}
	src, dst, srcName, dstName := here, peer, hostName, peerName
	if side == criu.Destination {
		src, dst, srcName, dstName = peer, here, peerName, hostName
	}
	if missing := criu.Unreadable(src.Patches, dst.Patches); len(missing) > 0 {
		return fmt.Errorf("%s lacks ferry's CRIU %s %s: it cannot restore what %s dumps, whose CRIU carries %s. Fix: %s",
			dst.describe(dstName), patchWord(missing), criu.IDs(missing), srcName, src.Patches, criuFix(dstName))
	}
	return nil
}

func blockingError(key, hostName string, c *CRIUCaps, missing []criu.Patch) error {
	why := make([]string, len(missing))
	for i, p := range missing {
		why[i] = p.Without
	}
	return fmt.Errorf("%s lacks ferry's CRIU %s %s, without which %s %s (%s). Fix: %s",
		c.describe(hostName), patchWord(missing), criu.IDs(missing), key, criu.Fails, strings.Join(why, "; "), criuFix(hostName))
}

func patchWord(ps []criu.Patch) string {
	if len(ps) == 1 {
		return "patch"
	}
	return "patches"
}

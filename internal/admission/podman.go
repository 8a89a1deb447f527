package admission

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// podmanRegenerated are the mount destinations whose mounts Podman drops
// from an imported container's spec and mounts again from files it makes
// for the new container under its own storage and run directories (libpod
// 4.3's restore of an imported checkpoint: setupContainer removes the
// first mount at each of these destinations; makeBindMounts and the
// restore add its own).
var podmanRegenerated = []string{"/dev/shm", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/run/.containerenv", "/run/secrets"}

// CheckPodmanSpec checks a Podman container's OCI spec (spec.dump, the
// source's config.json of container id) as CheckSpec does, except for
// Podman's own bind mounts, which never reach this host.
//
// spec.dump names the source host's files for /etc/hosts, /etc/resolv.conf,
// /etc/hostname, /run/.containerenv, the container's /dev/shm and
// /run/secrets: files Podman generated in that container's directories
// there (STORAGE or RUNROOT/overlay-containers/ID/userdata/...). Podman
// here drops the first mount at each of those destinations and mounts its
// own files instead, so such a mount is let through, and only such a one:
// the first at its destination (a second would survive Podman's removal),
// at exactly that destination, from a clean path inside the source
// container's own userdata directory. Anything else, a user's -v over
// /etc/hosts included, is checked as any bind mount. Sources under this
// host's Podman storage are not allowed as such: a bind of that storage
// would reach every other container's files.
func (p Policy) CheckPodmanSpec(b []byte, id string) error {
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("bad spec.dump: %w", err)
	}
	if id == "" || strings.Contains(id, "/") {
		return fmt.Errorf("bad Podman container ID %q", id)
	}
	own := "/overlay-containers/" + id + "/userdata/"
	seen := map[string]bool{}
	var kept []specs.Mount
	for _, m := range s.Mounts {
		regenerated := false
		for _, d := range podmanRegenerated {
			if m.Destination == d {
				regenerated = !seen[d]
				seen[d] = true
			}
		}
		if regenerated && isBind(m) && filepath.IsAbs(m.Source) && filepath.Clean(m.Source) == m.Source && strings.Contains(m.Source, own) {
			continue
		}
		kept = append(kept, m)
	}
	s.Mounts = kept
	checked, err := json.Marshal(&s)
	if err != nil {
		return err
	}
	return p.CheckSpec(checked)
}

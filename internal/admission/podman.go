package admission

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
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
// would reach every other container's files; only volumes, the data
// directories of the named volumes this host's Podman makes for the
// container, are.
func (p Policy) CheckPodmanSpec(b []byte, id string, volumes ...string) error {
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
		if isBind(m) && slices.Contains(volumes, m.Source) {
			continue // a named volume made here for the container
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

// podmanGlobalFlags are the global flags Podman's own exit command passes
// (specgenutil.CreateExitCommandArgs), each with a value: where its
// storage, state and networks are. Flags that name programs or code to
// run (--conmon, --hooks-dir, --module, --config, a --runtime path) are
// not among them.
var podmanGlobalFlags = map[string]bool{
	"--root": true, "--runroot": true, "--log-level": true, "--cgroup-manager": true, "--tmpdir": true,
	"--network-config-dir": true, "--network-backend": true, "--volumepath": true, "--db-backend": true,
	"--runtime": true, "--storage-driver": true, "--storage-opt": true, "--events-backend": true, "--imagestore": true,
}

// podmanCleanupFlags may follow "container cleanup" in it.
var podmanCleanupFlags = map[string]bool{"--rm": true, "--rmi": true, "--stopped-only": true, "--exec": true}

// CheckPodmanExitCommand says why a Podman container's exit command
// (config.dump's exitCommand, which conmon runs as root on this host when
// the container exits) is not Podman's own cleanup, "" when it is: this
// host's podman binary (podman, the resolved path of the one on PATH),
// only the global flags Podman passes (a --runtime by name, paths
// absolute), then "container cleanup", its own flags and the container's
// ID.
func CheckPodmanExitCommand(cmd []string, podman string) string {
	if len(cmd) == 0 {
		return ""
	}
	bad := func(why string) string {
		return fmt.Sprintf("its exit command %q is not Podman's own cleanup (%s): conmon would run it as root on this host", strings.Join(cmd, " "), why)
	}
	prog := filepath.Clean(cmd[0])
	if real, err := filepath.EvalSymlinks(prog); err == nil {
		prog = real
	}
	if podman == "" || prog != podman {
		return bad("not this host's podman, " + podman)
	}
	i := 1
	for ; i < len(cmd) && cmd[i] != "container"; i++ {
		flag, value, inline := strings.Cut(cmd[i], "=")
		switch {
		case flag == "--syslog" || flag == "--transient-store":
			continue
		case !podmanGlobalFlags[flag]:
			return bad("flag " + flag)
		}
		if !inline {
			if i+1 >= len(cmd) {
				return bad(flag + " without a value")
			}
			i++
			value = cmd[i]
		}
		if flag == "--runtime" && strings.Contains(value, "/") {
			return bad("--runtime names a program by path")
		}
		if strings.HasPrefix(value, "/") && filepath.Clean(value) != value {
			return bad(flag + " " + value)
		}
	}
	if i+1 >= len(cmd) || cmd[i+1] != "cleanup" {
		return bad("no container cleanup")
	}
	rest := cmd[i+2:]
	if len(rest) == 0 {
		return bad("no container ID")
	}
	for _, a := range rest[:len(rest)-1] {
		if !podmanCleanupFlags[a] {
			return bad("cleanup flag " + a)
		}
	}
	if id := rest[len(rest)-1]; strings.HasPrefix(id, "-") || strings.Contains(id, "/") {
		return bad("container ID " + id)
	}
	return ""
}

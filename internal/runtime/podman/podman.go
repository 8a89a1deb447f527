// Package podman drives Podman for one emulated host. It is the baseline
// that ferry's benchmark compares itself with: migration by
// `podman container checkpoint --export`, a copy of the archive, and
// `podman container restore --import` on the other host.
//
// Every host gets its own Podman instance: its own storage, run and tmp
// directories, network configuration and lock files, all under Host.Dir, so
// a container restored on one host is a different instance's container.
// Containers use the host network, and Podman runs inside the host's
// network namespace, so the container lives in that namespace.
package podman

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// Host is one emulated host's Podman instance.
type Host struct {
	// Dir holds all of this host's Podman state; Cleanup removes it.
	Dir string
	// NetNS is the network namespace Podman and its containers run in: a
	// name under /var/run/netns or an absolute path. Empty means the
	// caller's own namespace.
	NetNS string
}

// containersConf replaces the system containers.conf for a host. File
// locks live in the host's tmpdir; the default shared-memory locks are one
// set for the whole machine, and each fresh instance frees all of them on
// its first start ("refresh"), so two hosts could end up sharing a lock.
const containersConf = `[engine]
lock_type = "file"
`

func (h Host) path(elem ...string) string {
	return filepath.Join(append([]string{h.Dir}, elem...)...)
}

func (h Host) netnsPath() string {
	if strings.Contains(h.NetNS, "/") {
		return h.NetNS
	}
	return filepath.Join("/var/run/netns", h.NetNS)
}

// globalFlags keep this instance apart from every other one on the machine;
// a Host without a Dir is the machine's own Podman, with its own settings.
func (h Host) globalFlags() []string {
	if h.Dir == "" {
		return nil
	}
	return []string{
		"--root", h.path("storage"),
		"--runroot", h.path("run"),
		"--tmpdir", h.path("libpod"),
		"--network-config-dir", h.path("net"),
		"--storage-driver", "overlay",
		"--cgroup-manager", "cgroupfs",
		"--events-backend", "file",
	}
}

// prepare creates the directories and config file the podman command line
// refers to. Errors surface when podman runs.
func (h Host) prepare() {
	if h.Dir == "" {
		return
	}
	_ = os.MkdirAll(h.path("tmp"), 0o700)
	conf := h.path("containers.conf")
	if _, err := os.Stat(conf); err != nil {
		_ = os.WriteFile(conf, []byte(containersConf), 0o644)
	}
}

// Command returns podman with this host's flags, run in its network
// namespace. It uses nsenter --net rather than `ip netns exec`: the latter
// also makes a new mount namespace and remounts /sys, which hides the
// cgroup mounts from runc ("no cgroup mount found in mountinfo") and would
// keep the container's overlay mount out of later podman commands' view.
func (h Host) Command(ctx context.Context, args ...string) *exec.Cmd {
	h.prepare()
	full := append(h.globalFlags(), args...)
	var c *exec.Cmd
	if h.NetNS != "" {
		c = exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + h.netnsPath(), "--", "podman"}, full...)...)
	} else {
		c = exec.CommandContext(ctx, "podman", full...)
	}
	// TMPDIR is where image import and load stage their data.
	if h.Dir != "" {
		c.Env = append(os.Environ(), "TMPDIR="+h.path("tmp"), "CONTAINERS_CONF="+h.path("containers.conf"))
	}
	return c
}

// podman runs a command and returns its stdout; the error carries the end
// of stderr.
func (h Host) podman(ctx context.Context, args ...string) (string, error) {
	c := h.Command(ctx, args...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return stdout.String(), fmt.Errorf("podman %s: %v: %s", strings.Join(args[:min(len(args), 2)], " "), err, tail.Lines(stderr.String(), 6))
	}
	return stdout.String(), nil
}

// Run starts a detached container on the host network. Logging and health
// checks are off so that the baseline carries no overhead ferry lacks; the
// ulimits are low enough to be set under this machine's hard limits.
func (h Host) Run(ctx context.Context, name, image string, args []string) error {
	full := []string{"run", "--detach", "--name", name,
		"--network", "host",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
		"--log-driver", "none", "--no-healthcheck", "--pull", "never",
		qualify(image)}
	_, err := h.podman(ctx, append(full, args...)...)
	return err
}

// CheckpointExport checkpoints the container, stopping it, and writes an
// uncompressed archive. extra goes to `podman container checkpoint`
// (for example --tcp-established).
func (h Host) CheckpointExport(ctx context.Context, name, archive string, extra ...string) error {
	if err := os.MkdirAll(filepath.Dir(archive), 0o700); err != nil {
		return err
	}
	args := append([]string{"container", "checkpoint", "--export", archive, "--compress", "none"}, extra...)
	_, err := h.podman(ctx, append(args, name)...)
	return err
}

// RestoreImport restores a container from an exported checkpoint under its
// original name and ID. The image it was created from must exist on this
// host with the same ID (see ImportRootfs). extra goes to
// `podman container restore`.
func (h Host) RestoreImport(ctx context.Context, archive string, extra ...string) error {
	_, err := h.podman(ctx, append([]string{"container", "restore", "--import", archive}, extra...)...)
	return err
}

// Remove kills and removes the container; a missing container is no error.
func (h Host) Remove(ctx context.Context, name string) error {
	_, err := h.podman(ctx, "rm", "--force", "--ignore", "--time", "0", name)
	return err
}

// Inspect returns one field of `podman inspect`, given as a Go template
// such as "{{.State.Running}}".
func (h Host) Inspect(ctx context.Context, name, format string) (string, error) {
	out, err := h.podman(ctx, "inspect", "--type", "container", "--format", format, name)
	return strings.TrimSpace(out), err
}

// Exec runs a command in the container and returns its stdout.
func (h Host) Exec(ctx context.Context, name string, args ...string) (string, error) {
	return h.podman(ctx, append([]string{"exec", name}, args...)...)
}

// Cleanup removes every container of the host, resets its Podman instance,
// unmounts whatever is still mounted under Dir and deletes Dir.
func (h Host) Cleanup(ctx context.Context) error {
	if h.Dir == "" {
		return errors.New("podman: host has no Dir")
	}
	if _, err := os.Stat(h.Dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	if _, err := os.Stat(h.path("storage")); err == nil {
		// --time 0: a shell as PID 1 ignores SIGTERM, and reset would
		// wait 10 s per container before killing it.
		if _, err := h.podman(ctx, "rm", "--all", "--force", "--time", "0"); err != nil {
			errs = append(errs, err)
		}
		if _, err := h.podman(ctx, "system", "reset", "--force"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := mounts.UnmountUnder(h.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(h.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

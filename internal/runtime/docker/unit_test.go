package docker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/ferry-migrate/ferry/internal/admission"
)

func TestAdmit(t *testing.T) {
	ordinary := func() *config {
		return &config{Name: "web", Image: "sha256:00", Config: &container.Config{Image: "web:1"},
			HostConfig: &container.HostConfig{NetworkMode: "none"}}
	}
	r := &Runtime{}
	if err := r.admit(ordinary()); err != nil {
		t.Fatalf("an ordinary container refused: %v", err)
	}
	for _, c := range []struct {
		why  string
		edit func(c *config)
	}{
		{"privileged", func(c *config) { c.HostConfig.Privileged = true }},
		{"bind mounts", func(c *config) { c.HostConfig.Binds = []string{"/etc:/host-etc"} }},
		{"bind mounts", func(c *config) { c.HostConfig.Mounts = []mount.Mount{{Type: mount.TypeVolume, Source: "data"}} }},
		{"devices", func(c *config) { c.HostConfig.Devices = []container.DeviceMapping{{PathOnHost: "/dev/sda"}} }},
		{"PID namespace", func(c *config) { c.HostConfig.PidMode = "host" }},
		{"host's network", func(c *config) { c.HostConfig.NetworkMode = "host" }},
		{"Docker network", func(c *config) { c.HostConfig.NetworkMode = "bridge" }},
		{"CAP_SYS_ADMIN", func(c *config) { c.HostConfig.CapAdd = []string{"SYS_ADMIN"} }},
		{"confinement", func(c *config) { c.HostConfig.SecurityOpt = []string{"seccomp=unconfined"} }},
	} {
		cfg := ordinary()
		c.edit(cfg)
		err := r.admit(cfg)
		if !admission.IsRefused(err) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %v", c.why, err)
		}
		if err := (&Runtime{Admission: admission.Policy{Privileged: true}}).admit(cfg); err != nil {
			t.Errorf("%s with --allow-privileged: %v", c.why, err)
		}
	}
	// The host network passes where the operator allows it, or where the
	// daemon runs in the namespace ferry's host gives containers.
	cfg := ordinary()
	cfg.HostConfig.NetworkMode = "host"
	if err := (&Runtime{Admission: admission.Policy{HostNetwork: true}}).admit(cfg); err != nil {
		t.Error(err)
	}
	if err := (&Runtime{NetNS: "/var/run/netns/h2"}).admit(cfg); err != nil {
		t.Error(err)
	}
}

func TestStatus(t *testing.T) {
	for in, want := range map[string]string{"running": "running", "paused": "paused", "created": "stopped", "exited": "stopped", "restarting": "stopped"} {
		if got := status(in); got != want {
			t.Errorf("status(%q) = %q", in, got)
		}
	}
}

// TestRemoveUnpacked: of containerd's unpacked checkpoints, the one made
// since the restore began from these images goes; another restore's, and
// one older than the restore, stay.
func TestRemoveUnpacked(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	images := t.TempDir()
	write := func(dir, inventory string) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "inventory.img"), []byte(inventory), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	write(images, "ours")
	old := write(filepath.Join(tmp, "ctrd-checkpoint1"), "ours")
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	ours := write(filepath.Join(tmp, "ctrd-checkpoint2"), "ours")
	theirs := write(filepath.Join(tmp, "ctrd-checkpoint3"), "another container's")
	removeUnpacked(images, since)
	for dir, want := range map[string]bool{old: true, ours: false, theirs: true} {
		if _, err := os.Stat(dir); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", filepath.Base(dir), err == nil, want)
		}
	}
}

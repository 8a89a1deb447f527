package docker

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/go-connections/nat"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/runc"
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
		{"bind mounts", func(c *config) { c.HostConfig.Mounts = []mount.Mount{{Type: mount.TypeBind, Source: "/srv"}} }},
		{"devices", func(c *config) { c.HostConfig.Devices = []container.DeviceMapping{{PathOnHost: "/dev/sda"}} }},
		{"device cgroup rules", func(c *config) { c.HostConfig.DeviceCgroupRules = []string{"b 8:0 rwm"} }},
		{"does not mask /proc/kcore", func(c *config) { c.HostConfig.MaskedPaths = []string{} }},
		{"does not keep /proc/sys read-only", func(c *config) { c.HostConfig.ReadonlyPaths = []string{"/proc/bus"} }},
		{"host kernel sysctl", func(c *config) { c.HostConfig.Sysctls = map[string]string{"kernel.core_pattern": "|/x"} }},
		{"PID namespace", func(c *config) { c.HostConfig.PidMode = "host" }},
		{"host's network", func(c *config) { c.HostConfig.NetworkMode = "host" }},
		{"network of another container", func(c *config) { c.HostConfig.NetworkMode = "container:db" }},
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
	// Named volumes move with the container, and bridge networks are the
	// destination Docker's own.
	for _, edit := range []func(c *config){
		func(c *config) { c.HostConfig.Binds = []string{"data:/data"} },
		func(c *config) {
			c.HostConfig.Mounts = []mount.Mount{{Type: mount.TypeVolume, Source: "data", Target: "/data"}}
		},
		func(c *config) { c.Config.Volumes = map[string]struct{}{"/data": {}} },
		func(c *config) { c.HostConfig.NetworkMode = "bridge" },
		func(c *config) { c.HostConfig.NetworkMode = "cachenet" },
	} {
		cfg := ordinary()
		edit(cfg)
		if err := r.admit(cfg); err != nil {
			t.Errorf("%+v: %v", cfg.HostConfig, err)
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

// TestWrapper runs ferry-runc.sh over a runc that records what it was
// given: a checkpoint of ferry's gets CRIU its configuration file and, for
// a lazy restore, the work directory the file names in place of the
// shim's, and the options runc's RPC would otherwise turn off; anything
// else reaches runc untouched.
func TestWrapper(t *testing.T) {
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "ferry-runc")
	if err := os.WriteFile(wrapper, Wrapper, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	fake := "#!/bin/sh\n{ echo \"CRIU_CONFIG_FILE=$CRIU_CONFIG_FILE\"; for a; do echo \"$a\"; done; } > " + out + "\n"
	if err := os.WriteFile(filepath.Join(dir, "runc"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	t.Setenv("CRIU_CONFIG_FILE", "")
	plain, ferrys, lazy := filepath.Join(dir, "plain"), filepath.Join(dir, "ferrys"), filepath.Join(dir, "lazy")
	for _, d := range []string{plain, ferrys, lazy} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := (runc.CRIUConfig{LeaveStopped: true, TCPEstablished: true}).Write(filepath.Join(ferrys, criuConf)); err != nil {
		t.Fatal(err)
	}
	if err := (runc.CRIUConfig{LeaveStopped: true, LazyPages: true, WorkDir: "/ferry/work-dir"}).Write(filepath.Join(lazy, criuConf)); err != nil {
		t.Fatal(err)
	}
	restore := func(images string) []string {
		return []string{"--root", "/r", "restore", "--detach", "--work-path", "/shim/work", "--image-path", images, "--bundle", "/b", "id"}
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"another verb", []string{"--root", "/r", "state", "restore"}, []string{"CRIU_CONFIG_FILE=", "--root", "/r", "state", "restore"}},
		{"a checkpoint not ferry's", restore(plain), append([]string{"CRIU_CONFIG_FILE="}, restore(plain)...)},
		{"ferry's, with TCP", restore(ferrys), []string{"CRIU_CONFIG_FILE=" + filepath.Join(ferrys, criuConf),
			"--root", "/r", "restore", "--tcp-established", "--detach", "--work-path", "/shim/work", "--image-path", ferrys, "--bundle", "/b", "id"}},
		{"ferry's, lazy", restore(lazy), []string{"CRIU_CONFIG_FILE=" + filepath.Join(lazy, criuConf),
			"--root", "/r", "restore", "--work-path", "/ferry/work-dir", "--lazy-pages", "--detach", "--image-path", lazy, "--bundle", "/b", "id"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if b, err := exec.Command(wrapper, c.args...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, b)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"); !slices.Equal(got, c.want) {
				t.Errorf("runc got\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

func TestPublishedPorts(t *testing.T) {
	got := publishedPorts(nat.PortMap{
		"6379/tcp": {{HostPort: "6379"}},
		"7000/udp": {{HostIP: "0.0.0.0", HostPort: "7000"}, {HostIP: "10.0.0.1", HostPort: "7100"}},
	})
	want := []string{"10.0.0.1:7100->7000/udp", "6379->6379/tcp", "7000->7000/udp"}
	if !slices.Equal(got, want) {
		t.Errorf("publishedPorts: %v, want %v", got, want)
	}
}

func TestAddressFree(t *testing.T) {
	n := network.Inspect{
		IPAM:       network.IPAM{Config: []network.IPAMConfig{{Subnet: "172.20.0.0/16", Gateway: "172.20.0.1"}}},
		Containers: map[string]network.EndpointResource{"x": {IPv4Address: "172.20.0.3/16"}},
	}
	for addr, want := range map[string]bool{"172.20.0.2": true, "172.20.0.3": false, "172.20.0.1": false, "10.0.0.2": false, "": false} {
		if got := addressFree(n, addr); got != want {
			t.Errorf("addressFree(%q) = %v, want %v", addr, got, want)
		}
	}
}

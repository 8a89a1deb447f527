package lxc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Prepare checks the rewritten config (a carried fstab inlined) against
// the host's admission policy before it writes anything. No lxc-* tool
// runs: the tools' check is skipped, and Prepare runs none.
func TestPrepareAdmission(t *testing.T) {
	const name = "app"
	srcPath := "/var/lib/ferry/lab/h1/lxc"
	// What the lab's RunLXC writes: the network namespace LXC runs in.
	labConfig := "lxc.uts.name = app\nlxc.rootfs.path = dir:" + srcPath + "/app/rootfs\nlxc.net.0.type = none\n" +
		"lxc.tty.max = 0\nlxc.pty.max = 1\nlxc.autodev = 1\nlxc.mount.auto = proc:mixed sys:ro\nlxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio\nlxc.init.cmd = /bin/memhog\n" +
		"lxc.log.file = " + srcPath + "/app/lxc.log\n"
	empty := strings.Replace(labConfig, "type = none", "type = empty", 1)
	for _, tc := range []struct {
		name           string
		config         string
		fstab          string // carried as the container's file "fstab"
		netns, ctrNetS string
		policy         admission.Policy
		want           string // "" admitted
	}{
		{name: "own network namespace", config: empty},
		{name: "this machine's network", config: labConfig, want: "lxc.net.0.type = none shares this host's network namespace"},
		{name: "host network allowed", config: labConfig, policy: admission.Policy{HostNetwork: true}},
		// The lab's agents run in the namespace they give containers.
		{name: "the host's container namespace", config: labConfig, ctrNetS: "/proc/self/ns/net"},
		{name: "another namespace than the containers'", config: labConfig, ctrNetS: "/proc/self/ns/mnt", want: "lxc.net.0.type = none"},
		{name: "tools in a namespace of the host's", config: labConfig, netns: "/proc/self/ns/net"},
		{name: "hook", config: empty + "lxc.hook.pre-start = /bin/sh -c id\n", want: "lxc.hook.pre-start"},
		{name: "carried fstab", config: empty + "lxc.mount.fstab = " + srcPath + "/app/fstab\n", fstab: "# mounts\nproc proc proc defaults 0 0\n"},
		{name: "carried fstab binding /", config: empty + "lxc.mount.fstab = " + srcPath + "/app/fstab\n", fstab: "/ host none rbind,create=dir 0 0\n", want: "mounts host path /"},
		{name: "carried fstab, allowed", config: empty + "lxc.mount.fstab = " + srcPath + "/app/fstab\n", fstab: "/ host none rbind,create=dir 0 0\n",
			policy: admission.Policy{BindSources: []string{"/"}}},
		{name: "this host's fstab", config: empty + "lxc.mount.fstab = /etc/fstab\n", want: "lxc.mount.fstab = /etc/fstab"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(filepath.Join(t.TempDir(), "lxc"))
			r.checkOnce.Do(func() {}) // no tools, no CRIU run here
			r.NetNS, r.ContainerNetNS, r.Admission = tc.netns, tc.ctrNetS, tc.policy
			meta := map[string][]byte{"config": []byte(tc.config), "lxcpath": []byte(srcPath)}
			if tc.fstab != "" {
				meta["file:fstab"] = []byte(tc.fstab)
			}
			_, err := r.Prepare(context.Background(), &runtime.Container{Runtime: "lxc", Name: name, ID: name, Meta: meta}, runtime.PrepareOptions{})
			_, serr := os.Stat(r.dir(name))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("not admitted: %v", err)
				}
				if b, err := os.ReadFile(filepath.Join(r.dir(name), "fstab")); tc.fstab != "" && string(b) != tc.fstab {
					t.Errorf("carried fstab not written: %q %v", b, err)
				}
				return
			}
			if !admission.IsRefused(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want a refusal naming %q", err, tc.want)
			}
			if !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("a refused Prepare wrote %s: %v", r.dir(name), serr)
			}
		})
	}
}

func TestAdmissionText(t *testing.T) {
	cfg := []byte("lxc.uts.name = a\nlxc.mount.fstab = /x/a/fstab\nlxc.mount.fstab = /etc/fstab\n")
	got := admissionText(cfg, map[string][]byte{"/x/a/fstab": []byte("# c\n\n/srv srv none bind 0 0\nproc proc proc defaults 0 0\n")})
	want := "lxc.uts.name = a\nlxc.mount.entry = /srv srv none bind 0 0\nlxc.mount.entry = proc proc proc defaults 0 0\nlxc.mount.fstab = /etc/fstab\n"
	if got != want {
		t.Errorf("admissionText = %q, want %q", got, want)
	}
}

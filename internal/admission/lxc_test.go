package admission_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/admission"
)

// labLXCConfig is what the lab's RunLXC writes (rewritten for the
// destination's lxcpath): the host's network, no ttys, busybox's init.
const labLXCConfig = `lxc.uts.name = app
lxc.rootfs.path = dir:/var/lib/ferry/lab/h2/lxc/app/rootfs
lxc.net.0.type = none
lxc.tty.max = 0
lxc.pty.max = 1
lxc.autodev = 1
lxc.mount.auto = proc:mixed sys:ro
lxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio
lxc.init.cmd = /bin/memhog --memory 64M
lxc.signal.halt = SIGTERM
lxc.log.file = /var/lib/ferry/lab/h2/lxc/app/lxc.log
lxc.log.level = INFO
`

// downloadLXCConfig is what `lxc-create -t download -- -d debian` writes:
// LXC's shipped defaults (common.conf: capabilities dropped, devices
// allowlisted, seccomp; hooks of the LXC package's own), a veth on
// lxcbr0, AppArmor's generated profile.
const downloadLXCConfig = `# Template used to create this container: /usr/share/lxc/templates/lxc-download
# Distribution configuration
lxc.include = /usr/share/lxc/config/common.conf
lxc.include = /usr/share/lxc/config/debian.common.conf
lxc.arch = linux64

# Container specific configuration
lxc.apparmor.profile = generated
lxc.apparmor.allow_nesting = 1
lxc.rootfs.path = dir:/var/lib/lxc/web/rootfs
lxc.uts.name = "web"

# Network configuration
lxc.net.0.type = veth
lxc.net.0.link = lxcbr0
lxc.net.0.flags = up
lxc.net.0.hwaddr = 00:16:3e:4f:2a:91
`

func TestOrdinaryLXCConfigsAreAdmitted(t *testing.T) {
	if err := (admission.Policy{}).CheckLXCConfig(downloadLXCConfig); err != nil {
		t.Errorf("lxc-create's config refused: %v", err)
	}
	// The lab's containers share the network namespace LXC runs in: the
	// adapter admits that where it is the one this host gives containers.
	if err := (admission.Policy{HostNetwork: true}).CheckLXCConfig(labLXCConfig); err != nil {
		t.Errorf("the lab's config refused: %v", err)
	}
	// Without LXC's defaults nor a drop of its own, a config keeps every
	// capability: refused.
	bare := strings.Replace(labLXCConfig, "lxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio\n", "", 1)
	if err := (admission.Policy{HostNetwork: true}).CheckLXCConfig(bare); err == nil || !strings.Contains(err.Error(), "keeps capabilities") {
		t.Errorf("a config that drops no capability: %v", err)
	}
	if err := (admission.Policy{}).CheckLXCConfig(labLXCConfig); err == nil || !strings.Contains(err.Error(), "lxc.net.0.type = none shares this host's network namespace") {
		t.Errorf("the lab's config on this host's own network: %v", err)
	}
	for _, extra := range []string{
		"lxc.cap.drop = sys_admin",             // dropping more
		"lxc.cap.keep = chown setuid setgid",   // an allowlist within the defaults
		"lxc.cap.keep = none",                  // no capability at all
		"lxc.hook.version = 1",                 // how hooks are called, not a hook
		"lxc.hook.pre-start =",                 // clears the hooks
		"lxc.cgroup2.devices.allow = c 1:3 rw", // /dev/null, as common.conf does
		"lxc.cgroup.devices.allow = c 136:* rwm",
		"lxc.cgroup2.devices.allow =",
		"lxc.cgroup2.devices.deny = a",
		"lxc.mount.entry = proc dev/.lxc/proc proc create=dir,optional 0 0",
		"lxc.mount.entry = tmpfs tmp tmpfs defaults 0 0",
		"lxc.mount.entry = /var/lib/lxc/web/rootfs/srv/data srv none bind 0 0", // the container's own files
		"lxc.include = /usr/share/lxc/config/common.conf.d/",
		"lxc.seccomp.profile = /usr/share/lxc/config/common.seccomp",
		"lxc.apparmor.profile = lxc-container-default-cgns",
		"lxc.namespace.clone = mnt pid uts ipc net cgroup",
		"lxc.net.1.type = empty",
		"lxc.net.1.type = macvlan",
	} {
		if err := (admission.Policy{}).CheckLXCConfig(downloadLXCConfig + extra + "\n"); err != nil {
			t.Errorf("%q refused: %v", extra, err)
		}
	}
}

// Every malicious addition is refused, and says why; the operator's
// allowances admit what they name.
func TestMaliciousLXCConfigsAreRefused(t *testing.T) {
	privileged := admission.Policy{Privileged: true}
	for _, c := range []struct {
		extra  string
		want   string
		allows admission.Policy
	}{
		{"lxc.hook.pre-start = /bin/sh -c 'id > /tmp/owned'", "lxc.hook.pre-start = /bin/sh -c 'id > /tmp/owned' (hooks run as root on this host)", privileged},
		{"lxc.hook.start-host = /tmp/x", "lxc.hook.start-host", privileged},
		// Issue 46: clearing the drops keeps every capability, sys_module too.
		{"lxc.cap.drop =", "keeps capabilities mac_admin, mac_override, sys_time, sys_module, sys_rawio", privileged},
		{"lxc.mount.auto = proc:rw sys:rw", "lxc.mount.auto = proc:rw mounts the host's proc writable", privileged},
		{"lxc.hook.post-stop = /tmp/x", "lxc.hook.post-stop", privileged},
		{"lxc.net.0.script.up = /tmp/x", "lxc.net.0.script.up = /tmp/x (network scripts run as root", privileged},
		{"lxc.net.1.type = none", "lxc.net.1.type = none shares this host's network namespace", admission.Policy{HostNetwork: true}},
		{"lxc.net.1.type = phys\nlxc.net.1.link = eth0", "lxc.net.1.type = phys", privileged},
		{"lxc.namespace.share.pid = 1", "lxc.namespace.share.pid = 1 joins another process's pid namespace", privileged},
		{"lxc.namespace.share.net = 1", "lxc.namespace.share.net", privileged},
		{"lxc.namespace.keep = net", "keeps this host's net namespace", admission.Policy{HostNetwork: true}},
		{"lxc.namespace.keep = user pid", "keeps this host's pid namespace", privileged},
		{"lxc.namespace.clone = mnt pid net", "shares this host's uts namespace", privileged},
		{"lxc.namespace.clone = mnt pid uts ipc", "shares this host's net namespace", admission.Policy{HostNetwork: true}},
		{"lxc.mount.entry = / host none rbind,create=dir 0 0", "mounts host path /", admission.Policy{BindSources: []string{"/"}}},
		{"lxc.mount.entry = /etc/shadow shadow none bind,ro,create=file 0 0", "mounts host path /etc/shadow", admission.Policy{BindSources: []string{"/etc"}}},
		{"lxc.mount.entry = /srv/data2 data none bind 0 0", "/srv/data2", admission.Policy{BindSources: []string{"/srv/data2"}}},
		{"lxc.mount.entry = /var/lib/lxc/web/rootfs/../../other/rootfs o none bind 0 0", "mounts host path /var/lib/lxc/web/rootfs/../../other/rootfs", privileged},
		{"lxc.mount.entry = lib lib none bind 0 0", "mounts host path lib", privileged},
		{"lxc.mount.entry = /dev/sda1 mnt ext4 defaults 0 0", "mounts host path /dev/sda1", privileged},
		{"lxc.mount.entry = overlay mnt overlay lowerdir=/etc,upperdir=/tmp/u,workdir=/tmp/w 0 0", "mounts host path /etc", admission.Policy{BindSources: []string{"/"}}},
		{"lxc.mount.fstab = /etc/fstab", "lxc.mount.fstab = /etc/fstab", privileged},
		{"lxc.include = /var/lib/lxc/other/config", "lxc.include = /var/lib/lxc/other/config", privileged},
		{"lxc.include = /usr/share/lxc/config/../../../../etc/lxc/x.conf", "lxc.include", privileged},
		{"lxc.cap.keep = sys_admin", "lxc.cap.keep keeps capabilities CAP_SYS_ADMIN", admission.Policy{MaxCaps: append(append([]string{}, admission.DefaultCaps...), "CAP_SYS_ADMIN")}},
		{"lxc.cap.keep = chown sys_module", "CAP_SYS_MODULE", privileged},
		{"lxc.cgroup2.devices.allow = b 8:* rwm", "lxc.cgroup2.devices.allow = b 8:* rwm (beyond LXC's default devices)", privileged},
		{"lxc.cgroup.devices.allow = a", "lxc.cgroup.devices.allow = a", privileged},
		{"lxc.cgroup2.devices.allow = c *:* rwm", "c *:* rwm", privileged},
		{"lxc.cgroup2.devices.allow = c 10:200 rwm", "c 10:200 rwm", privileged}, // /dev/net/tun
		{"lxc.apparmor.profile = unconfined", "lxc.apparmor.profile = unconfined", privileged},
		{"lxc.apparmor.profile = unchanged", "lxc.apparmor.profile = unchanged", privileged},
		{"lxc.seccomp.profile =", "empty lxc.seccomp.profile", privileged},
	} {
		t.Run(c.extra, func(t *testing.T) {
			cfg := downloadLXCConfig + c.extra + "\n"
			err := (admission.Policy{}).CheckLXCConfig(cfg)
			if err == nil || !admission.IsRefused(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("refusal %v, want one naming %q", err, c.want)
			}
			if err := c.allows.CheckLXCConfig(cfg); err != nil {
				t.Errorf("the allowance %+v still refuses: %v", c.allows, err)
			}
			if err := privileged.CheckLXCConfig(cfg); err != nil {
				t.Errorf("--allow-privileged refuses: %v", err)
			}
		})
	}
	// Every reason is given at once.
	err := (admission.Policy{}).CheckLXCConfig(labLXCConfig + "lxc.hook.mount = /x\nlxc.cap.keep = sys_admin\n")
	if r := new(admission.Refused); !errors.As(err, &r) || len(r.Reasons) != 3 {
		t.Errorf("three reasons expected: %v", err)
	}
}

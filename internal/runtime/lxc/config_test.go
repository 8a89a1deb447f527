package lxc

import (
	"strings"
	"testing"
)

// templateConfig is what Debian 12's `lxc-create -t busybox -P /srv/a -n bb`
// writes (abridged).
const templateConfig = `# Template used to create this container: /usr/share/lxc/templates/lxc-busybox
lxc.net.0.type = veth
lxc.net.0.link = lxcbr0
lxc.net.0.flags = up
lxc.apparmor.profile = generated
lxc.apparmor.allow_nesting = 1
lxc.rootfs.path = dir:/srv/a/bb/rootfs
lxc.uts.name = "bb"
lxc.tty.max = 0
lxc.mount.fstab = /srv/a/bb/fstab
lxc.mount.entry = /lib lib none ro,bind 0 0
lxc.mount.entry = /sys/kernel/security sys/kernel/security none ro,bind,optional 0 0
lxc.log.file = /srv/a/bb/bb.log
`

func fakeEnv(links, paths []string) hostEnv {
	in := func(list []string) func(string) bool {
		return func(s string) bool {
			for _, x := range list {
				if x == s {
					return true
				}
			}
			return false
		}
	}
	return hostEnv{linkExists: in(links), pathExists: in(paths)}
}

func TestRewriteConfig(t *testing.T) {
	out, notes, err := rewriteConfig([]byte(templateConfig), "/srv/a/bb", "/srv/b/bb", fakeEnv([]string{"lxcbr0"}, []string{"/lib"}))
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	for _, want := range []string{
		"lxc.rootfs.path = dir:/srv/b/bb/rootfs\n",
		"lxc.mount.fstab = /srv/b/bb/fstab\n",
		"lxc.log.file = /srv/b/bb/bb.log\n",
		"lxc.net.0.link = lxcbr0\n",
		`lxc.uts.name = "bb"` + "\n", // untouched lines keep their form
		"# Template used",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rewritten config lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "/srv/a/") || strings.Contains(got, "apparmor") {
		t.Errorf("rewritten config keeps the source's paths or AppArmor lines:\n%s", got)
	}
	if len(notes) != 2 {
		t.Errorf("notes = %q, want the two dropped AppArmor lines", notes)
	}

	// Where AppArmor is on, its lines stay.
	env := fakeEnv([]string{"lxcbr0"}, []string{"/lib"})
	env.apparmor = true
	out, _, err = rewriteConfig([]byte(templateConfig), "/srv/a/bb", "/srv/b/bb", env)
	if err != nil || !strings.Contains(string(out), "lxc.apparmor.profile = generated") {
		t.Errorf("with AppArmor: %v\n%s", err, out)
	}

	// The bridge is missing here.
	_, _, err = rewriteConfig([]byte(templateConfig), "/srv/a/bb", "/srv/b/bb", fakeEnv(nil, []string{"/lib"}))
	if err == nil || !strings.Contains(err.Error(), `no network interface "lxcbr0"`) {
		t.Errorf("missing bridge: %v", err)
	}
	// A bind mount's source is missing here (the optional one may be).
	_, _, err = rewriteConfig([]byte(templateConfig), "/srv/a/bb", "/srv/b/bb", fakeEnv([]string{"lxcbr0"}, nil))
	if err == nil || !strings.Contains(err.Error(), "/lib does not exist") {
		t.Errorf("missing bind source: %v", err)
	}
}

func TestRootfsDir(t *testing.T) {
	for in, want := range map[string]string{"dir:/a/b/": "/a/b", "/a/b": "/a/b"} {
		if got, err := rootfsDir(in); err != nil || got != want {
			t.Errorf("rootfsDir(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "overlay:/a:/b", "lvm:/dev/vg/x", "dir:rel", "rel"} {
		if _, err := rootfsDir(in); err == nil {
			t.Errorf("rootfsDir(%q) accepted", in)
		}
	}
}

func TestCRIUVersion(t *testing.T) {
	v, err := criuVersion("Version: 4.2.1\nGitID: v4.2.1\n")
	if err != nil || v != [3]int{4, 2, 1} {
		t.Errorf("criuVersion = %v, %v", v, err)
	}
	if v, err := criuVersion("Version: 3.17\n"); err != nil || v != [3]int{3, 17, 0} {
		t.Errorf("criuVersion(3.17) = %v, %v", v, err)
	}
	if _, err := criuVersion("nothing"); err == nil {
		t.Error("criuVersion accepted no version")
	}
}

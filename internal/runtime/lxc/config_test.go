package lxc

import (
	"net/netip"
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
	return hostEnv{linkExists: in(links), pathExists: in(paths),
		linkPrefixes: func(string) []netip.Prefix { return nil },
		addressTaken: func(string, netip.Addr) string { return "" }}
}

// A static address on a host's own bridge: kept where the bridge here
// has its subnet and nobody else has it; refused, saying why, otherwise.
func TestCheckAddress(t *testing.T) {
	env := fakeEnv([]string{"lxcbr0"}, nil)
	env.linkPrefixes = func(name string) []netip.Prefix {
		if name == "lxcbr0" {
			return []netip.Prefix{netip.MustParsePrefix("10.0.3.1/24")}
		}
		return nil
	}
	env.addressTaken = func(link string, a netip.Addr) string {
		if link == "lxcbr0" && a == netip.MustParseAddr("10.0.3.20") {
			return "web"
		}
		return ""
	}
	for _, c := range []struct {
		link, address, want string
	}{
		{"lxcbr0", "10.0.3.10/24", ""},
		{"lxcbr0", "", ""},            // DHCP: nothing to check
		{"br9", "192.168.9.5/24", ""}, // no address on the link: a plain switch
		{"lxcbr0", "10.0.4.10/24", "not in lxcbr0's subnet on this host (10.0.3.0/24)"},
		{"lxcbr0", "10.0.3.1/24", "lxcbr0's own address"},
		{"lxcbr0", "10.0.3.20/24", `container "web" here has 10.0.3.20`},
	} {
		err := checkAddress(0, c.link, c.address, env)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s on %s: %v, want %q", c.address, c.link, err, c.want)
		}
	}
	cfg := "lxc.rootfs.path = dir:/srv/a/bb/rootfs\nlxc.net.0.type = veth\nlxc.net.0.link = lxcbr0\nlxc.net.0.ipv4.address = 10.0.4.10/24\n"
	if _, _, err := rewriteConfig([]byte(cfg), "/srv/a/bb", "/srv/b/bb", env); err == nil || !strings.Contains(err.Error(), "subnet") {
		t.Errorf("a config with an address outside the bridge's subnet: %v", err)
	}
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

// Writable bind mounts of host directories are shared data; read-only
// ones, optional ones' sources aside, are the host's own files.
func TestSharedOf(t *testing.T) {
	cfg := templateConfig + "lxc.mount.entry = /srv/data srv/data none bind,create=dir 0 0\nlxc.mount.entry = tmpfs tmp tmpfs defaults 0 0\n"
	got := sharedOf(parseConfig([]byte(cfg)))
	if len(got) != 1 || got[0].Source != "/srv/data" || got[0].Path != "/srv/data" {
		t.Errorf("shared: %+v, want /srv/data only", got)
	}
}

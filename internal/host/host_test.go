package host

import "testing"

// Every path derives from the state directory unless given apart.
func TestPaths(t *testing.T) {
	c := Config{StateDir: "/var/lib/ferry"}
	for _, p := range []struct{ got, want string }{
		{c.RuncRoot(), "/var/lib/ferry/runc"},
		{c.BundleRoot(), "/var/lib/ferry/bundles"},
		{c.BundleDir("web"), "/var/lib/ferry/bundles/web"},
		{c.LogPath("web"), "/var/lib/ferry/bundles/web.log"},
		{c.WorkDir("m1"), "/var/lib/ferry/work/m1"},
		{c.LogsDir(), "/var/lib/ferry/logs"},
	} {
		if p.got != p.want {
			t.Errorf("%s, want %s", p.got, p.want)
		}
	}
	c = Config{StateDir: "/var/lib/ferry", RuncRootDir: "/run/runc", BundlesDir: "/srv/bundles", ScratchDir: "/dev/shm/ferry"}
	for _, p := range []struct{ got, want string }{
		{c.RuncRoot(), "/run/runc"},
		{c.BundleRoot(), "/srv/bundles"},
		{c.BundleDir("web"), "/srv/bundles/web"},
		{c.LogPath("web"), "/srv/bundles/web.log"},
		{c.WorkDir("m1"), "/dev/shm/ferry/m1"},
		{c.LogsDir(), "/var/lib/ferry/logs"},
	} {
		if p.got != p.want {
			t.Errorf("%s, want %s", p.got, p.want)
		}
	}
}

package host

import "testing"

// Every path derives from the state directory unless given apart.
func TestPaths(t *testing.T) {
	for _, c := range []struct {
		c Config
		// runc root, bundle root, a bundle, its log, a work dir, the logs
		want [6]string
	}{
		{Config{StateDir: "/var/lib/ferry"}, [6]string{"/var/lib/ferry/runc", "/var/lib/ferry/bundles",
			"/var/lib/ferry/bundles/web", "/var/lib/ferry/bundles/web.log", "/var/lib/ferry/work/m1", "/var/lib/ferry/logs"}},
		{Config{StateDir: "/var/lib/ferry", RuncRootDir: "/run/runc", BundlesDir: "/srv/bundles", ScratchDir: "/dev/shm/ferry"},
			[6]string{"/run/runc", "/srv/bundles", "/srv/bundles/web", "/srv/bundles/web.log", "/dev/shm/ferry/m1", "/var/lib/ferry/logs"}},
	} {
		got := [6]string{c.c.RuncRoot(), c.c.BundleRoot(), c.c.BundleDir("web"), c.c.LogPath("web"), c.c.WorkDir("m1"), c.c.LogsDir()}
		if got != c.want {
			t.Errorf("%+v:\n got %q\nwant %q", c.c, got, c.want)
		}
	}
}

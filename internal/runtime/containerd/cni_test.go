package containerd

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/cnet"
)

func TestOwnNetNS(t *testing.T) {
	for _, c := range []struct {
		dir, path string
		own       bool
	}{
		{"/var/lib/x/netns", "/var/lib/x/netns/default-web", true},
		{"/var/lib/x/netns", "/var/lib/x/netns/../../../run/netns/h1", false},
		{"/var/lib/x/netns", "/var/lib/x/netns2/default-web", false},
		{"/var/lib/x/netns", "/var/run/netns/ferry-h1", false},
		{"", "/default-web", false},
	} {
		if got := ownNetNS(c.dir, c.path); got != c.own {
			t.Errorf("ownNetNS(%q, %q) = %v", c.dir, c.path, got)
		}
	}
}

// A container attached with the host's CNI plugins gets the address it
// asks for where it is free, another where it is taken, and gives it
// back on detach; its pinned namespace goes with RemoveNetNS.
func TestCNIAttachDetach(t *testing.T) {
	testroot.Require(t, "skipping: needs root for network namespaces")
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("skipping: the CNI plugins are not installed (apt-get install containernetworking-plugins)")
	}
	dir := t.TempDir()
	// The plugins run in this test's own namespace: the bridge goes there.
	host := filepath.Join(dir, "host")
	if err := NewNetNS(host); err != nil {
		t.Fatal(err)
	}
	defer RemoveNetNS(host)
	c := CNI{ConfDir: filepath.Join(dir, "net.d"), BinDirs: DefaultCNI.BinDirs, CacheDir: filepath.Join(dir, "cache")}
	if err := os.MkdirAll(c.ConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "t", "plugins": [{"type": "bridge", "bridge": "ferrytest0",
		"ipam": {"type": "host-local", "ranges": [[{"subnet": "10.99.0.0/24"}]], "dataDir": %q}}]}`, filepath.Join(dir, "ipam"))
	if err := os.WriteFile(filepath.Join(c.ConfDir, "t.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	attach := func(id string, want netip.Addr) (string, netip.Prefix) {
		t.Helper()
		ns := filepath.Join(dir, id)
		if err := NewNetNS(ns); err != nil {
			t.Fatal(err)
		}
		var got netip.Prefix
		err := cnet.Do(host, func() (err error) { got, err = c.Attach(ctx, "t", id, ns, want, nil); return err })
		if err != nil {
			t.Fatal(err)
		}
		return ns, got
	}
	want := netip.MustParseAddr("10.99.0.7")
	ns1, a1 := attach("one", want)
	if a1.Addr() != want || a1.Bits() != 24 {
		t.Errorf("asked for %s, got %s", want, a1)
	}
	n, err := cniNetwork(map[string]string{LabelCNINetwork: "t"}, ns1)
	if err != nil || n.Address != want.String() || n.Subnet != "10.99.0.0/24" || !n.HostLocal {
		t.Errorf("cniNetwork: %+v %v", n, err)
	}
	ns2, a2 := attach("two", want)
	if a2.Addr() == want {
		t.Errorf("%s given twice", want)
	}
	if err := cnet.Do(host, func() error { return c.Detach(ctx, "t", "one", ns1, nil) }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ipam", "t", want.String())); !os.IsNotExist(err) {
		t.Errorf("the lease of %s outlived the detach (%v)", want, err)
	}
	for _, ns := range []string{ns1, ns2} {
		if err := RemoveNetNS(ns); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(ns); !os.IsNotExist(err) {
			t.Errorf("%s stays", ns)
		}
	}
	if _, err := cnet.NetlinkIn(ns1); err == nil {
		t.Error("a removed namespace can still be entered")
	}
}

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts("8080:80, 5353:53/udp,")
	if err != nil || len(got) != 2 || got[0] != (PortMapping{8080, 80, "tcp"}) || got[1] != (PortMapping{5353, 53, "udp"}) {
		t.Errorf("ParsePorts: %+v %v", got, err)
	}
	for _, bad := range []string{"80", "0:80", "80:70000", "a:b", "80:80/icmp"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) took it", bad)
		}
	}
}

package lab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewHostNames(t *testing.T) {
	h := newHost(3)
	checks := map[string][2]string{
		"name":          {h.Name, "h3"},
		"state dir":     {h.StateDir, "/var/lib/ferry/lab/h3"},
		"cgroup parent": {h.CgroupParent, "ferry-h3"},
		"netns path":    {h.NetNS, "/var/run/netns/ferry-h3"},
		"netns name":    {h.NetNSName, "ferry-h3"},
		"addr":          {h.Addr, "10.77.0.3"},
		"agent addr":    {h.AgentAddr, "10.77.0.3:7070"},
		"control sock":  {h.ControlSock, "/run/ferry/lab/h3.sock"},
		"cgroups path":  {h.CgroupsPath("c1"), "/ferry-h3/c1"},
	}
	for what, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s = %q, want %q", what, c[0], c[1])
		}
	}
	l := &Lab{Hosts: []Host{newHost(1), newHost(2), h}}
	args := strings.Join(agentArgs(&h, l), " ")
	want := "agent --name h3 --listen 10.77.0.3:7070 --control /run/ferry/lab/h3.sock --state /var/lib/ferry/lab/h3 --cgroup-parent ferry-h3 --netns /var/run/netns/ferry-h3 --scratch /dev/shm/ferry-lab/h3 --bundles /dev/shm/ferry-lab/bundles/h3 --tls-dir /var/lib/ferry/lab/pki/h3 --allow h1,h2,h3 --segment-bridge svc0 --segment-range 10.79.0.0/24 --allow-bind /var/lib/ferry/lab/shared --allow-faults --runc-root /var/lib/ferry/lab/h3/runc --image-root " + DebianImageRoot() + " --podman-dir /var/lib/ferry/lab/h3/podman --lxc-path /var/lib/ferry/lab/h3/lxc --containerd /var/lib/ferry/lab/h3/containerd/containerd.sock --containerd-runc-root /var/lib/ferry/lab/h3/containerd/runc --cni-conf-dir /var/lib/ferry/lab/h3/cni/net.d --cni-cache-dir /var/lib/ferry/lab/h3/cni/cache --docker unix:///var/lib/ferry/lab/h3/docker/docker.sock --docker-exec-root /var/lib/ferry/lab/h3/docker/exec"
	if args != want {
		t.Errorf("agent args\n got %s\nwant %s", args, want)
	}
	// Two paths, striped TCP: an address per path.
	l.Paths, l.Streams = 2, 4
	args = strings.Join(agentArgs(&h, l), " ")
	if !strings.Contains(args, "--listen 10.77.0.3:7070,10.78.0.3:7070 ") || !strings.HasSuffix(args, "--mptcp=false --streams 4") {
		t.Errorf("agent args with two paths and streams: %s", args)
	}
	// The Kubernetes lab's nodes, h1 and h2, name their kubelet's
	// containerd (h3, above, is none).
	h1 := newHost(1)
	if args := strings.Join(agentArgs(&h1, l), " "); !strings.Contains(args, " --kubernetes "+KubeDir) || !strings.Contains(args, " --shim-dir ") {
		t.Errorf("h1's agent args name no kubelet: %s", args)
	}
}

func TestLabHostLookup(t *testing.T) {
	l := &Lab{Hosts: []Host{newHost(1), newHost(2)}}
	for _, name := range []string{"h2", "2", "ferry-h2"} {
		h, err := l.Host(name)
		if err != nil || h.Index != 2 {
			t.Errorf("Host(%q) = %v, %v", name, h, err)
		}
	}
	for _, name := range []string{"h3", "0", "h0", "x", "", "h01", "ferry-sw"} {
		if h, err := l.Host(name); err == nil {
			t.Errorf("Host(%q) = %v, want an error", name, h.Name)
		}
	}
}

func TestTbfParams(t *testing.T) {
	rate, burst, limit := tbfParams(1_000_000_000)
	if rate != 125_000_000 || burst != 500_000 || limit != 6_250_000+500_000 {
		t.Errorf("1gbit: rate %d burst %d limit %d", rate, burst, limit)
	}
	// Slow links still get a bucket big enough for offloaded segments.
	if _, burst, _ := tbfParams(1_000_000); burst != 32*1024 {
		t.Errorf("1mbit burst %d", burst)
	}
}

func TestBuildRootfs(t *testing.T) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("no %s (install busybox-static): %v", BusyboxPath, err)
	}
	bins := t.TempDir()
	err := buildRootfs(filepath.Join(t.TempDir(), "rootfs"), bins)
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("without memhog: %v, want an error telling to run make build", err)
	}
	// busybox is static, so it stands in for the workload binaries.
	for _, n := range []string{"memhog", "ferry-workload-echo"} {
		if err := copyFile(BusyboxPath, filepath.Join(bins, n)); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := buildRootfs(dir, bins); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"bin/busybox", "bin/memhog", "bin/ferry-workload-echo", "etc/passwd", "etc/group"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v", f, err)
		}
	}
	for _, a := range []string{"sh", "ls", "cat", "sleep", "ps", "echo"} {
		if target, err := os.Readlink(filepath.Join(dir, "bin", a)); err != nil || target != "busybox" {
			t.Errorf("bin/%s -> %q, %v", a, target, err)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp mode %v, %v", fi.Mode(), err)
	}
	for _, d := range []string{"proc", "sys", "dev", "root"} {
		if fi, err := os.Stat(filepath.Join(dir, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
	// A dynamically linked workload would not run in the rootfs.
	if err := copyFile("/bin/ls", filepath.Join(bins, "memhog")); err != nil {
		t.Fatal(err)
	}
	if err := buildRootfs(filepath.Join(t.TempDir(), "rootfs"), bins); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("dynamic memhog: %v", err)
	}
}

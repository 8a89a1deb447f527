package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/debroot"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// TestInstalledFromPackages: ferry as an operator installs it from the
// release's packages, no clone and no Go: ferry's and ferry-criu's .debs
// installed by apt into two clean Debian 12 roots, certificates made as
// DEPLOY.md says, each agent started exactly as the packaged unit's
// ExecStart says with /etc/ferry/agent.toml, each root a host of its own
// in a lab host's network namespace. A memhog started by the first root's
// runc moves pre-copy to the second, its state whole, with the CLI of the
// first; afterwards only the second root's runc lists it.
func TestInstalledFromPackages(t *testing.T) {
	requireLab(t)
	ctx := context.Background()
	bin := ferryBin(t)
	debs, err := debroot.BuildDebs(ctx, debroot.DebsOptions{Bin: filepath.Dir(bin), Dist: t.TempDir()})
	if err != nil {
		t.Fatalf("build the .debs: %v", err)
	}
	l := upLabWith(t, lab.Options{Hosts: 3, FerryBin: bin})
	// The roots' agents take the lab's agents' addresses.
	for _, h := range l.Hosts[:2] {
		if err := l.StopAgent(h.Name); err != nil {
			t.Fatal(err)
		}
	}
	src, dst := &l.Hosts[0], &l.Hosts[1]
	var roots [2]*debroot.Mounted
	for i, h := range []*lab.Host{src, dst} {
		r, err := debroot.Install(ctx, debroot.Options{}, filepath.Join(t.TempDir(), h.Name), debs.Files()...)
		if err != nil {
			t.Fatalf("install the .debs into %s's root: %v", h.Name, err)
		}
		t.Logf("%s: a clean Debian 12 root, ferry %s and ferry-criu %s installed by apt (copy %v, install %v)",
			h.Name, r.Installed["ferry"], r.Installed["ferry-criu"], r.Copy.Round(time.Millisecond), r.Install.Round(time.Millisecond))
		m, err := debroot.Mount(r.Dir, debroot.MountOptions{})
		if err != nil {
			t.Fatal(err)
		}
		roots[i] = m
		cgroupParent := "ferry-pkg-" + h.Name
		t.Cleanup(func() {
			// The container first, by its runtime; then the agents and
			// whatever else runs in the root.
			_ = m.Command(context.Background(), h.NetNS, "runc", "delete", "-f", "app").Run()
			if err := m.Close(); err != nil {
				t.Errorf("%s's root: %v", h.Name, err)
			}
			_ = cgroups.Remove(cgroupParent)
		})
		// The agent's settings, as DEPLOY.md §3 edits them, plus what a
		// lab host needs: its own cgroup parent (two hosts share this
		// machine) and its network namespace for containers restored here.
		peer := dst
		if h == dst {
			peer = src
		}
		conf := fmt.Sprintf("name = %q\nlisten = [%q]\ntls-dir = \"/etc/ferry/pki\"\nallow = [%q]\ncgroup-parent = %q\nnetns = %q\n",
			h.Name, h.AgentAddr, peer.Name, cgroupParent, h.NetNS)
		if err := os.WriteFile(m.HostPath("/etc/ferry/agent.toml"), []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := func(m *debroot.Mounted, h *lab.Host, argv ...string) string {
		t.Helper()
		out, err := m.Command(ctx, h.NetNS, argv...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %s: %v\n%s", h.Name, strings.Join(argv, " "), err, out)
		}
		return string(out)
	}
	// DEPLOY.md §2, the CA on the first host.
	run(roots[0], src, "ferry", "certs", "init", "--dir", "/root/ferry-ca")
	for _, h := range []*lab.Host{src, dst} {
		run(roots[0], src, "ferry", "certs", "issue", "--dir", "/root/ferry-ca", "--host", h.Name, "--ip", h.Addr)
	}
	run(roots[0], src, "sh", "-c", "mkdir -p /etc/ferry && cp -rp /root/ferry-ca/"+src.Name+" /etc/ferry/pki")
	// The scp to the second host.
	if out, err := exec.Command("cp", "-rp", roots[0].HostPath("/root/ferry-ca/"+dst.Name), roots[1].HostPath("/etc/ferry/pki")).CombinedOutput(); err != nil {
		t.Fatalf("copy %s's certificate: %v\n%s", dst.Name, err, out)
	}

	for i, h := range []*lab.Host{src, dst} {
		log := filepath.Join(t.TempDir(), "agent.log")
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s's agent log:\n%s", h.Name, tail.File(log, 30))
			}
		})
		if _, err := roots[i].StartService("ferry-agent.service", h.NetNS, log); err != nil {
			t.Fatal(err)
		}
		sock := roots[i].HostPath("/run/ferry/agent.sock")
		waitFor(t, 30*time.Second, h.Name+"'s packaged agent serving "+sock, func() (bool, error) {
			_, err := procs.SocketServer(sock)
			return err == nil, err
		})
	}

	// A memhog in the first root, started by its runc, in h1's namespace.
	bundle := roots[0].HostPath("/srv/app")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	memhog, err := os.ReadFile(filepath.Join(filepath.Dir(bin), "memhog"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "memhog"), memhog, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := runc.NewSpec(runc.SpecOptions{Args: []string{"/memhog", "--memory", "32M", "--dirty-rate", "200", "--port", memhogPort},
		NetNS: src.NetNS, CgroupsPath: "/ferry-pkg-" + src.Name + "/app"})
	if err := runc.WriteSpec(bundle, spec); err != nil {
		t.Fatal(err)
	}
	run(roots[0], src, "sh", "-c", "cd /srv/app && runc run -d app </dev/null >/dev/null 2>&1")
	p, _, err := bench.StartProbe(ctx, &l.Hosts[2], bin, []string{src.Addr + ":" + memhogPort, dst.Addr + ":" + memhogPort}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)

	out := run(roots[0], src, "ferry", "migrate", "app", "--to", dst.Name+"@"+dst.AgentAddr, "--mode", "precopy", "--json")
	var rep api.Report
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rep); err != nil {
		t.Fatalf("the report: %v\n%s", err, out)
	}
	res, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.SourceState != "removed" || !res.StateOK || res.Answers == 0 {
		t.Fatalf("report ok %v, source %q, error %q; probe %+v", rep.OK, rep.SourceState, rep.Error, res)
	}
	if list := run(roots[1], dst, "runc", "list"); !strings.Contains(list, "app ") || !strings.Contains(list, "running") {
		t.Errorf("the second root's runc does not list app running:\n%s", list)
	}
	if list := run(roots[0], src, "runc", "list"); strings.Contains(list, "app ") {
		t.Errorf("the first root's runc still lists app:\n%s", list)
	}
	// The CRIU ferry used is the ferry-criu package's, with every patch.
	for i, h := range []*lab.Host{src, dst} {
		check := run(roots[i], h, "ferry", "check")
		if !strings.Contains(check, "/usr/libexec/ferry/criu 4.2.1") || !strings.Contains(check, "all 16 of ferry's") {
			t.Errorf("%s: ferry check does not show ferry-criu's CRIU with its patches:\n%s", h.Name, check)
		}
	}
	t.Logf("moved between packaged agents: downtime %.0f ms (client %.0f ms), total %.0f ms", rep.DowntimeMs, res.ClientDowntimeMs, rep.TotalMs)
}

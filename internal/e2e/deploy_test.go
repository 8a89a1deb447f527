package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// TestDeployGuide follows docs/DEPLOY.md in the lab, with h1 and h2 playing
// node1 and node2: a CA and a certificate per host (ferry certs), an agent
// per host run from an agent.toml like the guide's (ferry agent --config),
// then, on the source, ferry migrate --to NAME@ADDR, ferry ps --all, the
// report and the source agent's Prometheus metrics; and from a third
// machine, with an operator's certificate, ferry ps and a migration back. Besides the guide's keys, each file names what makes a lab host
// a host (its control socket, state, runc root, cgroup parent, network
// namespace): the lab's own agents keep theirs.
func TestDeployGuide(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	dir := t.TempDir()
	ferry := func(h *lab.Host, args ...string) string {
		t.Helper()
		out, err := h.Command(ctx, bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ferry %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	src, dst := &l.Hosts[0], &l.Hosts[1]

	// 2. Certificates.
	ca := filepath.Join(dir, "ferry-ca")
	ferry(src, "certs", "init", "--dir", ca)
	for _, h := range []*lab.Host{src, dst} {
		ferry(src, "certs", "issue", "--dir", ca, "--host", h.Name, "--ip", h.Addr)
	}

	// 3. An agent per host, from its agent.toml.
	const port, metricsPort = 7171, 9171
	sockets := map[string]string{}
	for i, h := range []*lab.Host{src, dst} {
		other := []*lab.Host{dst, src}[i]
		sockets[h.Name] = filepath.Join(dir, h.Name+".sock")
		conf := fmt.Sprintf(`name = %q
listen = ["%s:%d"]
tls-dir = %q
allow = [%q]
metrics = "%s:%d"

# The lab host this agent plays.
control = %q
state = %q
runc-root = %q
cgroup-parent = %q
netns = %q
scratch = %q
`, h.Name, h.Addr, port, filepath.Join(ca, h.Name), other.Name, h.Addr, metricsPort,
			sockets[h.Name], filepath.Join(dir, h.Name+"-state"), h.RuncRoot(), h.CgroupParent, h.NetNS, filepath.Join(dir, h.Name+"-scratch"))
		path := filepath.Join(dir, h.Name+".toml")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := h.Command(ctx, bin, "agent", "--config", path)
		logf, err := os.Create(filepath.Join(dir, h.Name+"-agent.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			logf.Close()
		})
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if _, err := os.Stat(sockets[h.Name]); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(logf.Name())
				t.Fatalf("the agent of %s never opened its control socket:\n%s", h.Name, b)
			}
		}
	}

	// 5. Migrate, from the source host.
	const name = "deployed"
	p := startMemhog(t, l, bin, name)
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = h.Runc().Delete(context.Background(), name)
		}
	})
	out := ferry(src, "migrate", name, "--from", sockets[src.Name], "--to", fmt.Sprintf("%s@%s:%d", dst.Name, dst.Addr, port), "--mode", "precopy", "--json")
	var rep engine.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil || !rep.OK {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	if s, d := status(t, src, name), status(t, dst, name); s != "absent" || d != "running" {
		t.Errorf("after the migration: %s at %s, %s at %s", s, src.Name, d, dst.Name)
	}
	var jobs []engine.Job
	if err := json.Unmarshal([]byte(ferry(src, "ps", "--all", "--from", sockets[src.Name], "--json")), &jobs); err != nil ||
		len(jobs) != 1 || jobs[0].Container != name || jobs[0].Report == nil || !jobs[0].Report.OK {
		t.Errorf("ps --all: %+v %v", jobs, err)
	}
	// The source's metrics, scraped the way Prometheus would.
	scrape, err := src.Command(ctx, "busybox", "wget", "-q", "-O", "-", fmt.Sprintf("http://%s:%d/metrics", src.Addr, metricsPort)).CombinedOutput()
	if err != nil {
		t.Fatalf("scrape /metrics: %v\n%s", err, scrape)
	}
	for _, want := range []string{`ferry_migrations_total{mode="precopy",outcome="ok",runtime="runc"} 1`, "ferry_migrations_in_flight 0", `ferry_migration_downtime_seconds_count{mode="precopy"} 1`} {
		if !strings.Contains(string(scrape), want) {
			t.Errorf("metrics lack %s:\n%s", want, scrape)
		}
	}

	// 5, from elsewhere: h3 plays an operator's workstation with an
	// operator's certificate; it lists node1's migrations and moves the
	// container back, asking node2 over the network.
	ops := &l.Hosts[2]
	ferry(ops, "certs", "operator", "--dir", ca, "--name", "alice")
	opDir := filepath.Join(ca, "alice")
	node1, node2 := fmt.Sprintf("%s@%s:%d", src.Name, src.Addr, port), fmt.Sprintf("%s@%s:%d", dst.Name, dst.Addr, port)
	jobs = nil
	if err := json.Unmarshal([]byte(ferry(ops, "ps", "--all", "--from", node1, "--tls-dir", opDir, "--json")), &jobs); err != nil ||
		len(jobs) != 1 || jobs[0].Container != name {
		t.Errorf("ps --all from elsewhere: %+v %v", jobs, err)
	}
	out = ferry(ops, "migrate", name, "--from", node2, "--to", node1, "--tls-dir", opDir, "--mode", "cold", "--json")
	rep = engine.Report{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || !rep.OK {
		t.Fatalf("migrate back, from elsewhere: %v\n%s", err, out)
	}
	if s, d := status(t, src, name), status(t, dst, name); s != "running" || d != "absent" {
		t.Errorf("after the migration back: %s at %s, %s at %s", s, src.Name, d, dst.Name)
	}
	if log := readLog(t, filepath.Join(dir, dst.Name+"-agent.log")); !strings.Contains(log, "operator=alice") {
		t.Errorf("node2's log does not name the operator:\n%s", log)
	}
	// A host's certificate is no operator's: refused before any request.
	if out, err := ops.Command(ctx, bin, "ps", "--from", node1, "--tls-dir", filepath.Join(ca, dst.Name)).CombinedOutput(); err == nil || !strings.Contains(string(out), "not an operator's") {
		t.Errorf("ps with a host's certificate: %v\n%s", err, out)
	}
	if pr, err := p.Stop(); err != nil || !pr.StateOK {
		t.Errorf("workload: %+v %v", pr, err)
	}
}

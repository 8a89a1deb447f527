package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/probe"
)

// A containerd container on a CNI bridge network (each lab host's
// lab.CNINetwork, the same subnet on every host, its bridge in the host's
// namespace) with ports published through the network's portmap plugin
// moves: at the destination it is attached to the network of that name,
// with its address where it is free there and another where it is taken,
// its ports published again (the probe reaches it through them, its
// memory whole); the source's namespace, address lease and ports are
// gone. A destination without the network, or where another container
// publishes one of its ports, refuses it before anything is frozen.
func TestContainerdOnACNIBridge(t *testing.T) {
	requireContainerd(t)
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("the CNI plugins are not installed (apt-get install containernetworking-plugins)")
	}
	bin := ferryBin(t)
	l := upLab(t, bin)
	h1, h2 := &l.Hosts[0], &l.Hosts[1]
	ctx := context.Background()
	if err := l.ImportWorkloadImage(ctx, "containerd", h1.Name, h2.Name); err != nil {
		t.Fatal(err)
	}
	// run starts memhog on h's CNI network (at want, if given), its probe
	// and echo ports published with published, and returns its address.
	run := func(t *testing.T, h *lab.Host, name, want string, published bool) string {
		t.Helper()
		t.Cleanup(func() {
			for _, h := range l.Hosts[:2] {
				_ = l.RemoveFrom(ctx, "containerd", h.Name, name)
			}
		})
		args := append(memhogArgs("64M", "200"), "--echo-port", echoPort)
		a := lab.Attachments{Bridge: true, IP: want}
		if published {
			a.Ports = []string{memhogPort + "/udp", echoPort + "/tcp"}
		}
		if err := l.RunContainerd(ctx, h.Name, name, args, a); err != nil {
			t.Fatal(err)
		}
		return cniAddress(t, h, name)
	}
	// move moves name; with probed, memhog is probed through its
	// published port at each host's address.
	move := func(t *testing.T, name, mode, addr string, probed bool) engine.Report {
		t.Helper()
		var rep engine.Report
		if probed {
			p := startProbe(t, l, bin, "64M")
			var pr probe.Result
			var perr error
			rep, pr, perr = migrate(t, l, p, engine.Request{Container: name, Mode: mode, Runtime: "containerd"})
			if perr != nil || !pr.StateOK {
				t.Errorf("workload after the move: %+v %v", pr, perr)
			}
		} else {
			var err error
			if rep, err = migrateQuiet(l, engine.Request{Container: name, Mode: mode, Runtime: "containerd"}); err != nil {
				t.Fatal(err)
			}
		}
		if !rep.OK || rep.SourceState != "removed" {
			t.Fatalf("report: ok=%v source %q at %q: %s", rep.OK, rep.SourceState, rep.FailedAt, rep.Error)
		}
		if len(rep.Networks) != 1 || rep.Networks[0].Name != lab.CNINetwork || !strings.Contains(rep.Networks[0].Outcome, "established connections are closed") {
			t.Errorf("the report's networks: %+v", rep.Networks)
		}
		if got := ctrTasks(t, h2); !strings.Contains(" "+got+" ", " "+name+":RUNNING ") {
			t.Errorf("ctr tasks ls on h2: %q", got)
		}
		if got := ctrContainers(t, h1); got != "" {
			t.Errorf("ctr containers ls on h1 still lists %q", got)
		}
		// What the source held on its network is gone: the namespace
		// pinned for the container and the address's lease.
		if _, err := os.Stat(filepath.Join(h1.ContainerdRuntime().NetNSDir(), "default-"+name)); !os.IsNotExist(err) {
			t.Errorf("h1 keeps the moved container's network namespace (%v)", err)
		}
		if _, err := os.Stat(filepath.Join(h1.StateDir, "cni", "ipam", lab.CNINetwork, addr)); !os.IsNotExist(err) {
			t.Errorf("h1's network keeps the lease of %s (%v)", addr, err)
		}
		return rep
	}

	for _, mode := range []string{engine.ModeCold, engine.ModePostcopy} {
		t.Run(mode, func(t *testing.T) {
			name := "cni-" + mode
			addr := run(t, h1, name, "", true)
			rep := move(t, name, mode, addr, true)
			if got := cniAddress(t, h2, name); got != addr {
				t.Errorf("address on h2 %s, want %s (free there)", got, addr)
			}
			if !strings.Contains(rep.Networks[0].Outcome, "published again") {
				t.Errorf("the report does not say the ports are published again: %q", rep.Networks[0].Outcome)
			}
			echoIn(t, h2, addr)
			// The ports answer at h2's address, from h3, and no longer at h1's.
			if err := echoFrom(&l.Hosts[2], h2.Addr); err != nil {
				t.Errorf("echo through h2's published port: %v", err)
			}
			if err := echoFrom(&l.Hosts[2], h1.Addr); err == nil {
				t.Error("h1 still forwards the moved container's port")
			}
		})
	}

	t.Run("address taken", func(t *testing.T) {
		name := "cni-taken"
		addr := run(t, h1, name, "", false)
		run(t, h2, "cni-squat", addr, false) // holds the address at h2
		rep := move(t, name, engine.ModeCold, addr, false)
		got := cniAddress(t, h2, name)
		if got == addr {
			t.Fatalf("h2 gave %s twice", addr)
		}
		if !strings.Contains(rep.Networks[0].Outcome, addr+" where it is free") {
			t.Errorf("the report does not say the address is kept only where free: %q", rep.Networks[0].Outcome)
		}
		echoIn(t, h2, got)
		echoIn(t, h2, addr) // the squatter, untouched
	})

	t.Run("port taken at the destination", func(t *testing.T) {
		name := "cni-port"
		run(t, h1, name, "", true)
		run(t, h2, "cni-port-squat", "", true) // publishes the same ports at h2
		rep, err := migrateQuiet(l, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "containerd"})
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK || !strings.Contains(rep.Error, "publishes port") || rep.FrozenMs != 0 {
			t.Fatalf("report: ok=%v frozen %.0f ms at %q: %s", rep.OK, rep.FrozenMs, rep.FailedAt, rep.Error)
		}
		if got := ctrTasks(t, h1); !strings.Contains(got, name+":RUNNING") {
			t.Errorf("ctr tasks ls on h1: %q", got)
		}
		if got := ctrContainers(t, h2); got != "cni-port-squat" {
			t.Errorf("h2 keeps %q", got)
		}
	})

	t.Run("network missing at the destination", func(t *testing.T) {
		name := "cni-nonet"
		run(t, h1, name, "", false)
		conf := filepath.Join(h2.CNI().ConfDir, "10-"+lab.CNINetwork+".conflist")
		if err := os.Rename(conf, conf+".away"); err != nil {
			t.Fatal(err)
		}
		defer os.Rename(conf+".away", conf)
		rep, err := migrateQuiet(l, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "containerd"})
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK || !strings.Contains(rep.Error, "no CNI network") || rep.SourceState != "" && rep.SourceState != "resumed" {
			t.Fatalf("report: ok=%v source %q at %q: %s", rep.OK, rep.SourceState, rep.FailedAt, rep.Error)
		}
		if rep.FrozenMs != 0 {
			t.Errorf("frozen %.0f ms for a refusal", rep.FrozenMs)
		}
		if got := ctrTasks(t, h1); got != name+":RUNNING" {
			t.Errorf("ctr tasks ls on h1: %q", got)
		}
		if got := ctrContainers(t, h2); got != "" {
			t.Errorf("h2 keeps %q", got)
		}
		if left, _ := os.ReadDir(h2.ContainerdRuntime().NetNSDir()); len(left) != 0 {
			t.Errorf("h2 keeps network namespaces: %v", left)
		}
	})
}

// cniAddress is container name's address on h's CNI network, as ferry
// reads it.
func cniAddress(t *testing.T, h *lab.Host, name string) string {
	t.Helper()
	r := h.ContainerdRuntime()
	defer r.Close()
	c, err := r.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Networks) != 1 || c.Networks[0].Driver != "cni" {
		t.Fatalf("%s on %s: networks %+v", name, h.Name, c.Networks)
	}
	return c.Networks[0].Address
}

// echoIn checks that memhog's echo port answers at addr from h's
// namespace (where its CNI bridge is).
func echoIn(t *testing.T, h *lab.Host, addr string) {
	t.Helper()
	if err := echoFrom(h, addr); err != nil {
		t.Errorf("echo at %s from %s: %v", addr, h.Name, err)
	}
}

// echoFrom has memhog's echo port at addr echo a line to a client in h's
// namespace.
func echoFrom(h *lab.Host, addr string) error {
	return cnet.Do(h.NetNS, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, echoPort), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		b := make([]byte, 5)
		if _, err := c.Read(b); err != nil {
			return err
		}
		if string(b) != "ping\n" {
			return fmt.Errorf("echoed %q", b)
		}
		return nil
	})
}

// migrateQuiet asks h1's agent for req to h2 and returns its report.
func migrateQuiet(l *lab.Lab, req engine.Request) (engine.Report, error) {
	req.To = l.Hosts[1].AgentAddr
	return client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), req, nil)
}

package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/units"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/vishvananda/netlink"
)

// TestMain lets the test binary stand in for `ferry agent`: Up runs
// FerryBin with "agent ..." inside a host's namespace, and a fake that
// serves the control socket is enough to test starting and stopping it.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(fakeAgent(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func fakeAgent(args []string) int {
	i := slices.Index(args, "--control")
	if i < 0 || i+1 >= len(args) {
		fmt.Fprintln(os.Stderr, "fake agent: no --control")
		return 2
	}
	ln, err := net.Listen("unix", args[i+1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake agent:", err)
		return 1
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ln.Close()
	return 0
}

// needLabHost skips unless the test can build a lab without disturbing one.
func needLabHost(t *testing.T, tools ...string) {
	t.Helper()
	testroot.Require(t, "needs root for network namespaces, cgroups and runc")
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	if why := existing(); why != "" {
		t.Skipf("a lab is already up (%s); not touching it", why)
	}
}

// upLab brings a lab up and always takes it down at the end of the test.
func upLab(t *testing.T, o Options) *Lab {
	t.Helper()
	t.Cleanup(func() {
		if err := Down(context.Background()); err != nil {
			t.Errorf("Down in cleanup: %v", err)
		}
	})
	l, err := Up(context.Background(), o)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	return l
}

// assertNoLab checks that nothing of a lab is left.
func assertNoLab(t *testing.T) {
	t.Helper()
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "ferry-") {
			t.Errorf("netns %s left", e.Name())
		}
	}
	for _, d := range []string{StateDir, RunDir} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left (%v)", d, err)
		}
	}
	cgs, _ := filepath.Glob(filepath.Join(cgroups.Root, "*", "ferry-h*"))
	if len(cgs) > 0 {
		t.Errorf("cgroups left: %v", cgs)
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if n := l.Attrs().Name; n == BridgeName || hostDirRe.MatchString(n) {
			t.Errorf("link %s in the root netns", n)
		}
	}
	if _, err := Load(); !errors.Is(err, ErrNoLab) {
		t.Errorf("Load after Down: %v, want ErrNoLab", err)
	}
}

func nsLink(pid int) string {
	l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	return l
}

func nsOf(t *testing.T, name string) string {
	t.Helper()
	ino, err := netnsInode(name)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("net:[%d]", ino)
}

func tbfOn(t *testing.T, nsName, link string) *netlink.Tbf {
	t.Helper()
	h, err := handleAt(nsName)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatalf("%s in %s: %v", link, nsName, err)
	}
	qs, err := h.QdiscList(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if tbf, ok := q.(*netlink.Tbf); ok {
			return tbf
		}
	}
	return nil
}

func TestUpDown(t *testing.T) {
	needLabHost(t, BusyboxPath)
	ctx := context.Background()
	l := upLab(t, Options{Hosts: 2, BandwidthBps: 1_000_000_000, NoAgents: true})

	for _, ns := range []string{SwitchNetNS, "ferry-h1", "ferry-h2"} {
		if !netnsExists(ns) {
			t.Errorf("netns %s missing", ns)
		}
	}
	loaded, err := Load()
	if err != nil || len(loaded.Hosts) != 2 || loaded.BandwidthBps != 1_000_000_000 {
		t.Fatalf("Load: %+v, %v", loaded, err)
	}
	if _, err := Up(ctx, Options{NoAgents: true}); err == nil || !strings.Contains(err.Error(), "ferry-lab lab down") {
		t.Errorf("second Up: %v, want an error pointing to `ferry-lab lab down`", err)
	}

	h1, _ := l.Host("h1")
	out, err := h1.Command(ctx, BusyboxPath, "ping", "-c", "1", "-W", "3", "10.77.0.2").CombinedOutput()
	if err != nil {
		t.Errorf("h1 cannot ping h2: %v\n%s", err, out)
	}
	out, err = h1.Command(ctx, BusyboxPath, "ip", "-4", "addr", "show", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.77.0.1/24") {
		t.Errorf("h1 eth0: %v\n%s", err, out)
	}

	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if strings.HasPrefix(a.IP.String(), "10.77.") {
			t.Errorf("root netns has lab address %s", a.IPNet)
		}
	}

	for _, end := range [][2]string{{"ferry-h1", "eth0"}, {SwitchNetNS, "h1"}, {"ferry-h2", "eth0"}, {SwitchNetNS, "h2"}} {
		q := tbfOn(t, end[0], end[1])
		if q == nil {
			t.Errorf("no tbf on %s in %s", end[1], end[0])
		} else if q.Rate != 125_000_000 {
			t.Errorf("tbf on %s in %s: rate %d B/s, want 125000000", end[1], end[0], q.Rate)
		}
	}

	if err := Down(ctx); err != nil {
		t.Fatalf("Down: %v", err)
	}
	assertNoLab(t)
	if err := Down(ctx); err != nil {
		t.Errorf("second Down: %v", err)
	}
	assertNoLab(t)
}

func TestUnshaped(t *testing.T) {
	needLabHost(t)
	upLab(t, Options{Hosts: 1, NoAgents: true})
	if q := tbfOn(t, "ferry-h1", "eth0"); q != nil {
		t.Errorf("unshaped lab has tbf: %+v", q)
	}
}

// A crash loses the state file; Down must still find and remove
// everything, including processes left in the lab's namespaces.
func TestDownAfterCrash(t *testing.T) {
	needLabHost(t, "sleep")
	ctx := context.Background()
	l := upLab(t, Options{Hosts: 3, NoAgents: true})
	h3, _ := l.Host("h3")
	stray := h3.Command(ctx, "sleep", "1000")
	if err := stray.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = stray.Wait(); close(waited) }()
	t.Cleanup(func() { _ = stray.Process.Kill(); <-waited })

	if err := os.Remove(StateFile); err != nil {
		t.Fatal(err)
	}
	if err := Down(ctx); err != nil {
		t.Fatalf("Down without state: %v", err)
	}
	assertNoLab(t)
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Error("process left in ferry-h3 survived Down")
	}
}

func TestAgents(t *testing.T) {
	needLabHost(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := upLab(t, Options{Hosts: 2, FerryBin: exe})
	var pids []int
	for _, h := range l.Hosts {
		if h.AgentPID <= 0 || !h.AgentAlive() {
			t.Fatalf("%s: agent pid %d not alive", h.Name, h.AgentPID)
		}
		if got, want := nsLink(h.AgentPID), nsOf(t, h.NetNSName); got != want {
			t.Errorf("%s: agent in %s, want %s", h.Name, got, want)
		}
		c, err := net.Dial("unix", h.ControlSock)
		if err != nil {
			t.Errorf("%s: control socket: %v", h.Name, err)
		} else {
			c.Close()
		}
		pids = append(pids, h.AgentPID)
	}
	loaded, err := Load()
	if err != nil || loaded.Hosts[1].AgentPID != pids[1] {
		t.Fatalf("Load: %+v, %v", loaded, err)
	}

	// Crash: the state (and so the recorded PIDs) is lost.
	if err := os.Remove(StateFile); err != nil {
		t.Fatal(err)
	}
	if err := Down(ctx); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if left := procs.WaitGone(pids, 2*time.Second); len(left) > 0 {
		t.Errorf("agents %v survived Down", left)
	}
	assertNoLab(t)
}

func TestAgentThatDies(t *testing.T) {
	needLabHost(t)
	// `true` exits at once: Up must report it and clean up.
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true")
	}
	t.Cleanup(func() { _ = Down(context.Background()) })
	_, err = Up(context.Background(), Options{Hosts: 1, FerryBin: bin})
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("Up with a dying agent: %v", err)
	}
	assertNoLab(t)
}

func TestRunContainer(t *testing.T) {
	needLabHost(t, "runc", BusyboxPath)
	// busybox is static, so it stands in for memhog next to a fake ferry.
	bins := t.TempDir()
	if err := copyFile(BusyboxPath, filepath.Join(bins, "memhog")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := upLab(t, Options{Hosts: 2, NoAgents: true, FerryBin: filepath.Join(bins, "ferry")})
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx, "h1", "sleeper", []string{"sleep", "1000"}) }()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		// runc run --detach returns at once; waiting on it means the
		// container holds a pipe of runc's (stdout or stderr).
		t.Fatal("Run did not return: runc.Host.Run must give runc files, not pipes, as stdout and stderr")
	}
	h1, _ := l.Host("h1")
	st, err := h1.Runc().State(ctx, "sleeper")
	if err != nil || st.Status != "running" || st.Pid <= 0 {
		t.Fatalf("state %+v, %v", st, err)
	}
	if got, want := nsLink(st.Pid), nsOf(t, "ferry-h1"); got != want {
		t.Errorf("container in %s, want h1's %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(cgroups.Root, "memory", "ferry-h1", "sleeper")); err != nil {
		t.Errorf("container cgroup: %v", err)
	}
	if err := l.Run(ctx, "1", "sleeper", []string{"true"}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second Run with the same name: %v", err)
	}
	if err := l.Run(ctx, "h2", "bad/name", []string{"true"}); err == nil {
		t.Error("Run accepted a bad name")
	}
	cs, err := h1.Containers(ctx)
	if err != nil || len(cs) != 1 || cs[0].ID != "sleeper" {
		t.Errorf("Containers: %+v, %v", cs, err)
	}

	if err := Down(ctx); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if left := procs.WaitGone([]int{st.Pid}, 2*time.Second); len(left) > 0 {
		t.Errorf("container process %d survived Down", st.Pid)
	}
	assertNoLab(t)
}

func TestMeasureLinkThroughput(t *testing.T) {
	needLabHost(t, "iperf3")
	ctx := context.Background()
	const rate = 1_000_000_000
	l := upLab(t, Options{Hosts: 2, BandwidthBps: rate, NoAgents: true})
	bps, err := MeasureLinkThroughput(ctx, l, "h1", "h2", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("h1 -> h2 over a %s link: %.1f Mbit/s", units.FormatRate(rate), bps/1e6)
	// Not a speed test: only the shaper's cap, which no machine can beat.
	if bps > 1.2*rate {
		t.Errorf("%.0f bit/s through a %s link: shaping is not working", bps, units.FormatRate(rate))
	}
	if _, err := MeasureLinkThroughput(ctx, l, "h1", "h1", time.Second); err == nil {
		t.Error("measuring a host against itself succeeded")
	}
}

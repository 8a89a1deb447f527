package cnet

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"
)

func TestNames(t *testing.T) {
	if Name("h2", "web") != "ferry-c-h2-web" || Path("x") != "/var/run/netns/x" {
		t.Fatal("naming changed")
	}
	if a, b := hostSide("ferry-c-h1-web", "eth0"), hostSide("ferry-c-h2-web", "eth0"); a == b || len(a) > 15 {
		t.Fatalf("host-side names %q %q: must differ per namespace and fit IFNAMSIZ", a, b)
	}
	if err := Delete("not-ours"); err == nil {
		t.Fatal("deleted a namespace ferry did not make")
	}
}

// segment makes a namespace (never the machine's own) holding bridge
// tbr0 at 10.98.0.1/24, removed at the end with container namespace ctr.
func segment(t *testing.T, hostName, ctr string) {
	t.Helper()
	testroot.Require(t, "needs root for network namespaces")
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 missing")
	}
	_ = exec.Command("ip", "netns", "del", hostName).Run()
	_ = Delete(ctr)
	ip(t, "netns", "add", hostName)
	t.Cleanup(func() {
		_ = Delete(ctr)
		_ = exec.Command("ip", "netns", "del", hostName).Run()
	})
	ip(t, "-n", hostName, "link", "add", "tbr0", "type", "bridge")
	ip(t, "-n", hostName, "link", "set", "tbr0", "up")
	ip(t, "-n", hostName, "addr", "add", "10.98.0.1/24", "dev", "tbr0")
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v %s", args, err, out)
	}
}

// TestCreateDescribeRoundTrip builds a container namespace on a bridge,
// reads it back, and checks the carrier switch and the cleanup.
func TestCreateDescribeRoundTrip(t *testing.T) {
	const hostName, ctr = "ferry-cnet-test-host", "ferry-c-cnet-test"
	segment(t, hostName, ctr)

	want := Spec{Ifaces: []Iface{{Name: "eth0", MAC: "02:fe:0a:62:00:07", MTU: 1400, Addrs: []string{"10.98.0.7/24"}}}, Gateway: "10.98.0.1"}
	path, err := Create(ctr, Path(hostName), "tbr0", want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Describe(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("described %+v, created %+v", got, want)
	}
	state := func() string {
		out, _ := exec.Command("ip", "-n", hostName, "-br", "link", "show", hostSide(ctr, "eth0")).Output()
		return string(out)
	}
	if !strings.Contains(state(), "DOWN") {
		t.Fatalf("host side up before SetCarrier: %s", state())
	}
	if err := SetCarrier(ctr, Path(hostName), want, true); err != nil {
		t.Fatal(err)
	}
	if s := state(); strings.Contains(s, "DOWN") {
		t.Fatalf("host side still down: %s", s)
	}
	if err := SetCarrier(ctr, Path(hostName), want, false); err != nil {
		t.Fatal(err)
	}
	if s := state(); !strings.Contains(s, "DOWN") {
		t.Fatalf("host side still up: %s", s)
	}
	if err := SetCarrier("ferry-c-cnet-none", Path(hostName), want, true); err == nil {
		t.Fatal("no error for a namespace without veths")
	}
	if err := Delete(ctr); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("namespace left behind")
	}
	if s := state(); s != "" {
		t.Fatalf("host side of the veth left behind: %s", s)
	}
}

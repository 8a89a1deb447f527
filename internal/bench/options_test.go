package bench

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// bench migrate refuses what the lab cannot run before any lab comes up,
// and lets through every combination it can.
func TestMigrateOptionsCheck(t *testing.T) {
	for _, c := range []struct {
		name string
		o    MigrateOptions
		want string // "": accepted
	}{
		{"the defaults", MigrateOptions{}, ""},
		{"every baseline", MigrateOptions{Baselines: []string{"link", "podman", "paths"}}, ""},
		{"an unknown runtime", MigrateOptions{Runtime: "rkt"}, `unknown runtime "rkt"`},
		{"an unknown baseline", MigrateOptions{Baselines: []string{"link", "vmotion"}}, `unknown baseline "vmotion"`},
		{"a TCP client under runc", MigrateOptions{TCPClient: true, Runtime: "runc"}, ""},
		{"a TCP client under lxc", MigrateOptions{TCPClient: true, Runtime: "lxc"}, "--tcp-client needs --runtime runc"},
		{"the host's network", MigrateOptions{Network: "host"}, ""},
		{"an unknown network", MigrateOptions{Network: "overlay"}, `unknown --network "overlay"`},
		{"Docker's bridge", MigrateOptions{Network: "bridge", Runtime: "docker"}, ""},
		{"Podman's volume", MigrateOptions{VolumeBytes: 1 << 20, Runtime: "podman"}, ""},
		{"a bridge under containerd", MigrateOptions{Network: "bridge", Runtime: "containerd"}, "need --runtime docker or podman"},
		{"a volume under runc", MigrateOptions{VolumeBytes: 1 << 20}, "need --runtime docker or podman"},
		{"a path cut with two paths", MigrateOptions{CutPathAt: 0.5, Paths: 2}, ""},
		{"a path cut with one path", MigrateOptions{CutPathAt: 0.5, Paths: 1}, "--cut-path-at needs --paths 2"},
	} {
		err := c.o.check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// bench faults refuses unknown runtimes, modes, faults and phases naming
// the known ones, and a matrix narrowed to nothing.
func TestFaultsPlanRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		o    FaultsOptions
		want string
	}{
		{"a runtime the lab runs nothing in", FaultsOptions{Runtimes: []string{"kubernetes"}}, `unknown runtime "kubernetes" (one of runc, podman, lxc, containerd, docker)`},
		{"an unknown mode", FaultsOptions{Modes: []string{"teleport"}}, `unknown mode "teleport" (one of cold, precopy, postcopy, hybrid)`},
		{"an unknown fault", FaultsOptions{Actions: []string{"unplug"}}, `unknown fault "unplug" (one of ` + strings.Join(fault.Actions, ", ")},
		{"an unknown phase", FaultsOptions{Phases: []string{"lunch"}}, `unknown phase "lunch" (one of ` + strings.Join(fault.Phases, ", ")},
		{"cold has no rounds", FaultsOptions{Modes: []string{engine.ModeCold}, Phases: []string{fault.Rounds}}, "no fault case matches"},
		{"an address outside runc", FaultsOptions{Address: true, Cases: []FaultCase{{Runtime: "lxc", Mode: engine.ModeCold, Phase: fault.Dump, Fault: fault.KillSource}}},
			"under runc only, not lxc"},
	} {
		cases, _, err := c.o.plan()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %d cases, %v; want an error saying %q", c.name, len(cases), err, c.want)
		}
	}
}

// The defaults are runc's whole matrix; cases given are run as given,
// under runc where they name no runtime; a runtime's image is imported
// once however many cases use it, and only where its containers run from
// one (or the plan says which tool this host lacks).
func TestFaultsPlan(t *testing.T) {
	cases, images, err := FaultsOptions{}.plan()
	if err != nil || len(cases) != len(FaultMatrix(nil, nil, nil, nil)) || len(images) != 0 {
		t.Fatalf("the defaults: %d cases, images %v, %v", len(cases), images, err)
	}
	for _, c := range cases {
		if c.Runtime != "runc" {
			t.Fatalf("a default case outside runc: %+v", c)
		}
	}

	given := []FaultCase{{Mode: engine.ModeCold, Phase: fault.Freeze, Fault: fault.KillSource}}
	cases, _, err = FaultsOptions{Address: true, Cases: given, Modes: []string{"ignored"}}.plan()
	if err != nil || len(cases) != 1 || cases[0].Runtime != "runc" || given[0].Runtime != "" {
		t.Errorf("a case given without a runtime: %+v, %v (the caller's: %+v)", cases, err, given)
	}

	o := FaultsOptions{Runtimes: []string{"podman", "lxc", "docker"}, Modes: []string{engine.ModeCold}, Phases: []string{fault.Dump}}
	var lacks []string
	for _, kind := range o.Runtimes {
		rt, err := lab.RuntimeOf(kind)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := exec.LookPath(rt.Tool); err != nil {
			lacks = append(lacks, rt.Tool)
		}
	}
	cases, images, err = o.plan()
	if len(lacks) > 0 {
		if err == nil || !strings.Contains(err.Error(), "which this host lacks") {
			t.Errorf("this host lacks %v: %v", lacks, err)
		}
		return
	}
	if err != nil || !slices.Equal(images, []string{"podman", "docker"}) {
		t.Errorf("images %v, %v; want podman's and docker's, once each", images, err)
	}
	perKind := map[string]int{}
	for _, c := range cases {
		perKind[c.Runtime]++
	}
	if len(perKind) != 3 || perKind["podman"] != perKind["lxc"] || perKind["podman"] < 2 {
		t.Errorf("cases per runtime %v", perKind)
	}
}

// What a case leaves unsettled on a host is its container's journal
// entries not in a final state, and no other container's.
func TestPendingListsTheContainersUnsettledEntries(t *testing.T) {
	var h lab.Host
	h.Name, h.StateDir = "h2", t.TempDir()
	j, err := journal.Open(filepath.Join(h.StateDir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []journal.Entry{
		{ID: "a1", Role: journal.Destination, Container: "app", State: journal.Restoring},
		{ID: "b2", Role: journal.Destination, Container: "app", State: journal.Dropped},
		{ID: "c3", Role: journal.Source, Container: "other", State: journal.InDoubt},
	} {
		if err := j.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	if got := pending(&h, "app"); !slices.Equal(got, []string{"h2: a1 destination restoring"}) {
		t.Errorf("pending(app) = %q", got)
	}
	if got := pending(&h, "gone"); len(got) != 0 {
		t.Errorf("pending(gone) = %q", got)
	}
}

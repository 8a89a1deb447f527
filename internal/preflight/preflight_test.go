package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/criu"
)

// ferrysCRIU is `criu --version` of CRIU 4.2.1 with every ferry patch.
func ferrysCRIU() criu.Info {
	return criuFrom("Version: 4.2.1\nferry-patches: 0001,0002,0003,0004,0005,0006,0007,0008,0009,0010,0011,0012,0013,0014,0015,0016\n")
}

// criuFrom is what criu.Installed makes of a `criu --version` output.
func criuFrom(out string) criu.Info {
	v, err := criu.ParseVersion(out)
	if err != nil {
		panic(err)
	}
	return criu.Info{Version: v, Patches: criu.ParsePatches(out)}
}

// goodHost answers like a fully equipped host.
func goodHost() Probes {
	return Probes{
		IsRoot:    func() bool { return true },
		CriuPath:  func() (string, error) { return "/usr/local/sbin/criu", nil },
		CriuInfo:  func(context.Context) (criu.Info, error) { return ferrysCRIU(), nil },
		CriuCheck: func(context.Context) error { return nil },
		Features: func(context.Context) criu.Features {
			return criu.Features{DirtyTracking: true, UffdNoncoop: true, LazyPages: true,
				PipeMaxSize: 16 << 20, TCPRepair: true, MPTCP: true}
		},
		RuntimeVersion: func(_ context.Context, name string) (string, bool) {
			return map[string]string{"runc": "1.1.5", "podman": "4.3.1", "lxc": "5.0.2"}[name], true
		},
		Cgroup:          func() Cgroup { return Cgroup{V1: true, V2: true, V2Path: "/sys/fs/cgroup/unified"} },
		WriteTracking:   func() error { return nil },
		VMAFlags:        func() error { return nil },
		DockerFerryRunc: func() bool { return true },
	}
}

func fixes(ps []Problem) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.What+" => "+p.Fix)
	}
	return strings.Join(s, "\n")
}

func TestRunAllGood(t *testing.T) {
	r := goodHost().Run(context.Background())
	if !r.OK || len(r.Problems) != 0 || len(r.Warnings) != 0 {
		t.Fatalf("want ok without problems or warnings, got ok=%v\n%s\n%s", r.OK, fixes(r.Problems), fixes(r.Warnings))
	}
	if r.CriuVersion != "4.2.1" || r.CriuCheck != "ok" || *r.Runtimes["runc"] != "1.1.5" || r.PipeMaxSize != 16<<20 {
		t.Errorf("unexpected report: %+v", r)
	}
}

func TestRunFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Probes)
		fix    string // a problem's fix must contain this
	}{
		{"not root", func(p *Probes) { p.IsRoot = func() bool { return false } }, "root"},
		{"no criu", func(p *Probes) { p.CriuPath = func() (string, error) { return "", errors.New("not found") } }, "make setup"},
		{"old criu", func(p *Probes) {
			p.CriuInfo = func(context.Context) (criu.Info, error) {
				return criu.Info{Version: criu.Version{Major: 4, Minor: 1, Sublevel: 1}}, nil
			}
		}, "make setup"},
		{"unreadable version", func(p *Probes) {
			p.CriuInfo = func(context.Context) (criu.Info, error) { return criu.Info{}, errors.New("garbage") }
		}, "make setup"},
		{"check fails", func(p *Probes) {
			p.CriuCheck = func(context.Context) error { return errors.New("criu check: exit status 1: vdso: boom") }
		}, "criu check"},
		{"no runc", func(p *Probes) {
			p.RuntimeVersion = func(_ context.Context, name string) (string, bool) { return "1", name != "runc" }
		}, "install runc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodHost()
			tc.change(&p)
			r := p.Run(context.Background())
			if r.OK {
				t.Fatal("ok = true")
			}
			if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Fix, tc.fix) {
				t.Errorf("want one problem with a fix mentioning %q, got:\n%s", tc.fix, fixes(r.Problems))
			}
		})
	}
}

func TestRunNoCriu(t *testing.T) {
	p := goodHost()
	p.CriuPath = func() (string, error) { return "", errors.New("not found") }
	called := false
	p.Features = func(context.Context) criu.Features { called = true; return criu.Features{} }
	r := p.Run(context.Background())
	if called {
		t.Error("probed CRIU features without CRIU")
	}
	if r.CriuVersion != "" || r.CriuCheck == "ok" || len(r.Warnings) != 0 {
		t.Errorf("report without criu: %+v", r)
	}
}

func TestRunWarnings(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      criu.Features
		noUFFD bool     // no userfaultfd write protection, nor BPF iterators
		want   []string // substrings of the warnings' fixes, in order
	}{
		{"no soft-dirty", criu.Features{UffdNoncoop: true, LazyPages: true, PipeMaxSize: 16 << 20, TCPRepair: true, MPTCP: true},
			true, []string{"CONFIG_MEM_SOFT_DIRTY", "CONFIG_DEBUG_INFO_BTF"}},
		{"no soft-dirty but write tracking", criu.Features{UffdNoncoop: true, LazyPages: true, PipeMaxSize: 16 << 20, TCPRepair: true, MPTCP: true},
			false, nil},
		{"small pipes", criu.Features{DirtyTracking: true, UffdNoncoop: true, PipeMaxSize: 1 << 20, TCPRepair: true, MPTCP: true},
			false, []string{"sysctl -w fs.pipe-max-size=16777216"}},
		{"no uffd", criu.Features{DirtyTracking: true, PipeMaxSize: 16 << 20, TCPRepair: true, MPTCP: true},
			false, []string{"CONFIG_USERFAULTFD"}},
		{"bare", criu.Features{PipeMaxSize: 1 << 20},
			true, []string{"CONFIG_MEM_SOFT_DIRTY", "CONFIG_USERFAULTFD", "CAP_NET_ADMIN", "net.mptcp.enabled=1", "CONFIG_DEBUG_INFO_BTF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodHost()
			p.Features = func(context.Context) criu.Features { return tc.f }
			if tc.noUFFD {
				p.WriteTracking = func() error { return errors.New("no userfaultfd") }
				p.VMAFlags = func() error { return errors.New("no BPF") }
			}
			r := p.Run(context.Background())
			if !r.OK || len(r.Problems) != 0 {
				t.Fatalf("optional features must not fail ok: %v\n%s", r.OK, fixes(r.Problems))
			}
			if len(r.Warnings) != len(tc.want) {
				t.Fatalf("want %d warnings, got:\n%s", len(tc.want), fixes(r.Warnings))
			}
			for i, w := range tc.want {
				if !strings.Contains(r.Warnings[i].Fix, w) {
					t.Errorf("warning %d fix %q lacks %q", i, r.Warnings[i].Fix, w)
				}
			}
		})
	}
}

// A host whose cgroups lack favordynmods is told how to remount them; one
// that has it, or a kernel without the option, is told nothing.
func TestRunWarnsWithoutFavorDynmods(t *testing.T) {
	for _, tc := range []struct {
		name string
		cg   Cgroup
		want string // in the fix; empty: no warning
	}{
		{"without", Cgroup{V1: true, V2: true, V2Path: "/sys/fs/cgroup/unified", Remount: "/sys/fs/cgroup/unified"}, "mount -o remount,favordynmods /sys/fs/cgroup/unified"},
		{"with", Cgroup{V2: true, V2Path: "/sys/fs/cgroup", FavorDynmods: true}, ""},
		{"no such option", Cgroup{V1: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodHost()
			p.Cgroup = func() Cgroup { return tc.cg }
			r := p.Run(context.Background())
			if !r.OK {
				t.Fatalf("favordynmods must not fail ok:\n%s", fixes(r.Problems))
			}
			var got []string
			for _, w := range r.Warnings {
				if strings.Contains(w.What, "favordynmods") {
					got = append(got, w.Fix)
				}
			}
			switch {
			case tc.want == "" && len(got) != 0:
				t.Errorf("unexpected warning: %q", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Errorf("warnings %q, want one fix with %q", got, tc.want)
			}
		})
	}
}

func TestFavorDynmods(t *testing.T) {
	const hybrid = `cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
`
	const legacy = `tmpfs /sys/fs/cgroup tmpfs rw 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0
`
	for _, tc := range []struct {
		name      string
		mounts    string
		hasOption bool
		set       bool
		remount   string
	}{
		{"hybrid, without", hybrid, true, false, "/sys/fs/cgroup/unified"},
		{"legacy, without", legacy, true, false, "/sys/fs/cgroup/memory"},
		{"unified, with", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nsdelegate,favordynmods 0 0\n", true, true, ""},
		{"a v1 hierarchy with", strings.Replace(hybrid, "rw,relatime,freezer", "rw,relatime,freezer,favordynmods", 1), true, true, ""},
		{"kernel without the option", hybrid, false, false, ""},
		{"a cgroup2 elsewhere", "cgroup2 /run/other cgroup2 rw 0 0\n" + legacy, true, false, "/sys/fs/cgroup/memory"},
		{"no cgroups", "proc /proc proc rw 0 0\n", true, false, ""},
	} {
		set, remount := favorDynmods(tc.mounts, "/sys/fs/cgroup", tc.hasOption)
		if set != tc.set || remount != tc.remount {
			t.Errorf("%s: favorDynmods = %v, %q; want %v, %q", tc.name, set, remount, tc.set, tc.remount)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.44-fc-v657": true, "6.0.0": true, "5.19.17": false, "7.1": true, "4.9": false, "bogus": false,
	} {
		if got := kernelAtLeast(release, 6, 0); got != want {
			t.Errorf("kernelAtLeast(%q, 6, 0) = %v", release, got)
		}
	}
}

// The JSON field names are a public contract.
func TestJSONShape(t *testing.T) {
	p := goodHost()
	p.RuntimeVersion = func(_ context.Context, name string) (string, bool) { return "1.1.5", name == "runc" }
	b, err := json.Marshal(p.Run(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ok", "criu_path", "criu_version", "criu_check", "features", "pipe_max_size",
		"runtimes", "cgroup", "root", "problems", "warnings"} {
		if _, ok := m[k]; !ok {
			t.Errorf("missing key %q in %s", k, b)
		}
	}
	feats := m["features"].(map[string]any)
	for _, k := range []string{"dirty_tracking", "lazy_pages", "tcp_repair", "mptcp"} {
		if _, ok := feats[k].(bool); !ok {
			t.Errorf("features.%s missing or not bool in %s", k, b)
		}
	}
	rt := m["runtimes"].(map[string]any)
	if rt["runc"] != "1.1.5" || rt["podman"] != nil || rt["lxc"] != nil {
		t.Errorf("runtimes = %v", rt)
	}
	if _, present := rt["podman"]; !present {
		t.Error("runtimes.podman must be present as null")
	}
	cg := m["cgroup"].(map[string]any)
	for _, k := range []string{"v1", "v2", "v2_path"} {
		if _, ok := cg[k]; !ok {
			t.Errorf("cgroup.%s missing", k)
		}
	}
	if ps, ok := m["problems"].([]any); !ok || len(ps) != 0 {
		t.Errorf("problems must be an empty array, got %v", m["problems"])
	}
}

func TestParseToolVersion(t *testing.T) {
	for in, want := range map[string]string{
		"runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n": "1.1.5",
		"podman version 4.3.1\n": "4.3.1",
		"5.0.2\n":                "5.0.2",
		"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n": "1.6.20",
		"Docker version 20.10.24+dfsg1, build 5d6db84\n":                                "20.10.24",
		"Docker version 20.10.24, build 5d6db84\n":                                      "20.10.24",
		"": "",
	} {
		if got := parseToolVersion(in); got != want {
			t.Errorf("parseToolVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestProbeCgroup(t *testing.T) {
	mk := func(t *testing.T, files ...string) string {
		root := t.TempDir()
		for _, f := range files {
			p := filepath.Join(root, f)
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, nil, 0o644)
		}
		return root
	}
	hybrid := mk(t, "freezer/tasks", "memory/tasks", "unified/cgroup.controllers")
	if c := ProbeCgroup(hybrid); !c.V1 || !c.V2 || c.V2Path != filepath.Join(hybrid, "unified") {
		t.Errorf("hybrid: %+v", c)
	}
	unified := mk(t, "cgroup.controllers", "system.slice/cgroup.procs")
	if c := ProbeCgroup(unified); c.V1 || !c.V2 || c.V2Path != unified {
		t.Errorf("unified: %+v", c)
	}
	legacy := mk(t, "freezer/tasks")
	if c := ProbeCgroup(legacy); !c.V1 || c.V2 || c.V2Path != "" {
		t.Errorf("legacy: %+v", c)
	}
	if c := ProbeCgroup(filepath.Join(legacy, "nope")); c.V1 || c.V2 {
		t.Errorf("missing: %+v", c)
	}
}

func TestText(t *testing.T) {
	p := goodHost()
	p.Features = func(context.Context) criu.Features { return criu.Features{UffdNoncoop: true, PipeMaxSize: 1 << 20} }
	p.RuntimeVersion = func(_ context.Context, name string) (string, bool) { return "1.1.5", name == "runc" }
	txt := p.Run(context.Background()).Text()
	for _, want := range []string{"OK", "✓ criu ", "4.2.1", "- podman", "not found", "! lazy pages", "Warnings:", "fix: sysctl -w fs.pipe-max-size=16777216"} {
		if !strings.Contains(txt, want) {
			t.Errorf("Text() lacks %q:\n%s", want, txt)
		}
	}
	p.CriuInfo = func(context.Context) (criu.Info, error) {
		return criu.Info{Version: criu.Version{Major: 3, Minor: 17, Sublevel: 1}}, nil
	}
	txt = p.Run(context.Background()).Text()
	for _, want := range []string{"NOT READY", "✗ criu ", "Problems:", "make setup"} {
		if !strings.Contains(txt, want) {
			t.Errorf("Text() lacks %q:\n%s", want, txt)
		}
	}
}

// TestRunHost checks this machine: root with CRIU 4.2.1 and runc must pass.
func TestRunHost(t *testing.T) {
	testroot.Require(t, "skipping: needs root")
	if _, err := criu.Binary(); err != nil {
		t.Skip("skipping: criu not in PATH")
	}
	start := time.Now()
	r := Run(context.Background())
	t.Logf("Run took %v", time.Since(start))
	b, _ := json.MarshalIndent(r, "", "  ")
	t.Logf("%s\n%s", b, r.Text())

	if !r.OK {
		t.Errorf("ok = false:\n%s", fixes(r.Problems))
	}
	v, err := criu.ParseVersion(r.CriuVersion)
	if err != nil || !v.AtLeast(4, 2, 1) {
		t.Errorf("criu_version = %q, want >= 4.2.1", r.CriuVersion)
	}
	soft, err := criu.KernelOption("CONFIG_MEM_SOFT_DIRTY")
	if err == nil && r.Features.DirtyTracking != (soft == "y") {
		t.Errorf("dirty_tracking = %v but kernel CONFIG_MEM_SOFT_DIRTY=%q", r.Features.DirtyTracking, soft)
	}
	// The machine has userfaultfd; lazy pages then hinge on the sysctl.
	if want := r.PipeMaxSize >= criu.MinLazyPipeSize; r.Features.LazyPages != want {
		t.Errorf("lazy_pages = %v with pipe_max_size %d", r.Features.LazyPages, r.PipeMaxSize)
	}
	if !r.Features.LazyPages {
		t.Logf("note: lazy_pages false because fs.pipe-max-size = %d", r.PipeMaxSize)
	}
	if b, err := os.ReadFile("/proc/sys/net/mptcp/enabled"); err == nil {
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if r.Features.MPTCP != (n == 1) {
			t.Errorf("mptcp = %v with net.mptcp.enabled = %d", r.Features.MPTCP, n)
		}
	}
	if !r.Features.TCPRepair {
		t.Error("tcp_repair = false as root")
	}
	if !r.Cgroup.V1 && !r.Cgroup.V2 {
		t.Error("no cgroup hierarchy found")
	}
}

// Modes follow each runtime's limits and the kernel's features, and list
// only runtimes that are installed.
func TestModesPerRuntime(t *testing.T) {
	r := goodHost().Run(context.Background())
	join := func(k string) string { return strings.Join(r.Modes[k], ",") }
	if got := join("runc"); got != "cold,cold/rebuild,precopy,precopy/rebuild,precopy/native,postcopy,hybrid" {
		t.Errorf("runc on a fully equipped host: %s", got)
	}
	for _, k := range []string{"podman", "lxc"} {
		if got := join(k); got != "cold,cold/rebuild,precopy,precopy/rebuild,postcopy,hybrid" {
			t.Errorf("%s %s (a lazy dump and restore, no pre-dump)", k, got)
		}
	}
	if got := join("docker"); got != "cold,cold/rebuild,precopy,precopy/rebuild,postcopy,hybrid" {
		t.Errorf("docker with ferry-runc: %s", got)
	}
	p := goodHost()
	p.DockerFerryRunc = func() bool { return false }
	r = p.Run(context.Background())
	if got := join("docker"); got != "cold,cold/rebuild,precopy,precopy/rebuild" || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0].Fix, "ferry-runc") {
		t.Errorf("docker without ferry-runc: modes %s, warnings %v", got, r.Warnings)
	}
	p = goodHost()
	p.Features = func(context.Context) criu.Features { return criu.Features{PipeMaxSize: 1 << 20} }
	p.RuntimeVersion = func(_ context.Context, name string) (string, bool) { return "1.1.5", name == "runc" }
	r = p.Run(context.Background())
	if got := join("runc"); got != "cold,precopy" {
		t.Errorf("runc without lazy pages or soft-dirty: %s", got)
	}
	if _, ok := r.Modes["podman"]; ok {
		t.Error("modes listed for a runtime that is not installed")
	}
	if !strings.Contains(r.Text(), "modes: cold, precopy") {
		t.Errorf("text lacks the modes:\n%s", r.Text())
	}
}

// ferry check says which ferry patches the CRIU carries and, for each
// technique, what the missing ones cost: a stock CRIU works, slower, but
// for the lazy rebuild restores and the images of a ferry CRIU.
func TestCRIUPatches(t *testing.T) {
	for _, c := range []struct {
		name      string
		out       string
		line      string
		modes     map[string]string // technique: what its line must say
		missing   []string
		warnsWith string
	}{
		{name: "ferry's", out: "Version: 4.2.1\nferry-patches: 0001,0002,0003,0004,0005,0006,0007,0008,0009,0010,0011,0012,0013,0014,0015,0016\n",
			line: "all 16 of ferry's", modes: map[string]string{"cold": "as ferry means it", "hybrid": "as ferry means it"}},
		{name: "stock", out: "Version: 4.2.1\n", line: "none (a stock CRIU",
			modes: map[string]string{
				"cold":            "fails as destination of a source whose CRIU has ferry's patches (lacks 0005, 0010); fails for some containers without 0003; slower without 0001, 0005,",
				"precopy/rebuild": "fails as destination without 0006, where the runtime restores lazily",
				"postcopy":        "slower without 0001, 0002, 0004,",
			},
			missing:   []string{"0001", "0006", "0016"},
			warnsWith: "names no ferry patches"},
		{name: "ferry's before a new patch", out: "Version: 4.2.1\nferry-patches: 0001,0002,0003,0004,0005,0006,0007,0008,0009,0010,0011,0012,0013,0014,0016\n",
			line: "15 of ferry's 16: lacks 0015", modes: map[string]string{"cold": "slower without 0015", "precopy/rebuild": "slower without 0015"},
			missing: []string{"0015"}, warnsWith: "lacks 1 of ferry's CRIU patches: migrations are slower"},
		{name: "without 0006", out: "Version: 4.2.1\nferry-patches: 0001,0002,0003,0004,0005,0007,0008,0009,0010,0011,0012,0013,0014,0015,0016\n",
			line: "lacks 0006", modes: map[string]string{"precopy/rebuild": "fails as destination without 0006", "precopy": "as ferry means it"},
			missing: []string{"0006"}, warnsWith: "some techniques fail or are refused (0006"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := goodHost()
			p.CriuInfo = func(context.Context) (criu.Info, error) { return criuFrom(c.out), nil }
			r := p.Run(context.Background())
			if !r.OK {
				t.Errorf("not OK: %s", fixes(r.Problems))
			}
			var ids []string
			for _, m := range r.CriuMissing {
				ids = append(ids, m.ID)
			}
			for _, id := range c.missing {
				if !slices.Contains(ids, id) {
					t.Errorf("missing %v, want %s among them", ids, id)
				}
			}
			for tech, want := range c.modes {
				if !strings.Contains(r.CriuModes[tech], want) {
					t.Errorf("%s: %q, want it to say %q", tech, r.CriuModes[tech], want)
				}
			}
			txt := r.Text()
			if !strings.Contains(txt, "criu patches") || !strings.Contains(txt, c.line) {
				t.Errorf("Text() lacks %q:\n%s", c.line, txt)
			}
			warned := strings.Contains(fixes(r.Warnings), c.warnsWith)
			if c.warnsWith == "" {
				warned = !strings.Contains(fixes(r.Warnings), "ferry-criu")
			}
			if !warned {
				t.Errorf("warnings, want one saying %q:\n%s", c.warnsWith, fixes(r.Warnings))
			}
			if c.warnsWith != "" && !strings.Contains(txt, "install ferry-criu or run `make setup`") {
				t.Errorf("Text() does not say what to do:\n%s", txt)
			}
		})
	}
}

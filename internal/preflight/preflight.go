// Package preflight answers `ferry check`: can this host take part in a
// migration, and which of the faster strategies can it use.
package preflight

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/runtime/docker"
	"github.com/ferry-migrate/ferry/internal/vmas"
)

// Report is the result of a check. Its JSON form is a public contract.
type Report struct {
	// OK means a cold migration is possible.
	OK          bool   `json:"ok"`
	CriuPath    string `json:"criu_path"`
	CriuVersion string `json:"criu_version"`
	CriuCheck   string `json:"criu_check"` // "ok" or CRIU's complaint
	// CriuPatches are the ferry patches (scripts/criu-patches) the CRIU
	// carries, as its `criu --version` names them (patch 0016): null for
	// a stock CRIU, or one ferry built before 0016. CriuMissing says what
	// each missing one costs, CriuModes what that makes of each technique.
	CriuPatches criu.Patches      `json:"criu_patches"`
	CriuMissing []MissingPatch    `json:"criu_missing"`
	CriuModes   map[string]string `json:"criu_modes"`
	Features    Features          `json:"features"`
	PipeMaxSize int64             `json:"pipe_max_size"`
	Runtimes    Runtimes          `json:"runtimes"`
	// Modes lists, per runtime installed, the techniques ferry can run
	// with it on this host (a runtime's own limits and the kernel's).
	Modes  map[string][]string `json:"modes"`
	Cgroup Cgroup              `json:"cgroup"`
	Root   bool                `json:"root"`
	// Problems prevent any migration; Warnings rule out a strategy or
	// cost downtime, and prevent none.
	Problems []Problem `json:"problems"`
	Warnings []Problem `json:"warnings"`
}

// Features are the optional capabilities in the report.
type Features struct {
	DirtyTracking bool `json:"dirty_tracking"`
	// WriteTracking: the kernel reports written pages to ferry itself
	// (userfaultfd write protection), so content pre-copy's rounds read
	// only those.
	WriteTracking bool `json:"write_tracking"`
	LazyPages     bool `json:"lazy_pages"`
	TCPRepair     bool `json:"tcp_repair"`
	MPTCP         bool `json:"mptcp"`
	// VMAFlags: the frozen dump reads the container's mappings from a
	// snapshot taken before the freeze, checked through a BPF iterator.
	VMAFlags bool `json:"vma_flags"`
}

// Runtimes holds, by kind, the versions of the container runtimes found:
// every registered runtime with a tool to ask is there, nil (JSON null)
// when not installed.
type Runtimes map[string]*string

// Cgroup says which cgroup hierarchies are mounted.
type Cgroup struct {
	V1     bool   `json:"v1"`
	V2     bool   `json:"v2"`
	V2Path string `json:"v2_path"`
	// FavorDynmods: a hierarchy is mounted with favordynmods, so moving a
	// process into a cgroup does not wait for an RCU grace period (each
	// restore moves the restored tasks, and runc moves CRIU). Remount is
	// the hierarchy to remount with it, where the kernel has the option
	// (Linux 6.0+) and no hierarchy has it yet.
	FavorDynmods bool   `json:"favordynmods"`
	Remount      string `json:"remount,omitempty"`
}

// MissingPatch is a ferry patch the CRIU lacks and what goes without it.
type MissingPatch struct {
	ID    string `json:"id"`
	Title string `json:"title"`
	// Side is the end of a migration whose CRIU needs it.
	Side string `json:"side"`
	// Effect: "slower", "fails for some containers" or "fails" (refused
	// before the freeze).
	Effect     string   `json:"effect"`
	Without    string   `json:"without"`
	Techniques []string `json:"techniques"`
}

// Problem is one failed condition and how to fix it.
type Problem struct {
	What string `json:"what"`
	Fix  string `json:"fix"`
}

// Probes are the questions Run asks the host. Tests swap them for fakes.
type Probes struct {
	IsRoot         func() bool
	CriuPath       func() (string, error)
	CriuInfo       func(context.Context) (criu.Info, error)
	CriuCheck      func(context.Context) error
	Features       func(context.Context) criu.Features
	WriteTracking  func() error
	VMAFlags       func() error
	RuntimeVersion func(ctx context.Context, kind string) (string, bool) // "runc", "podman", "lxc", ...
	Cgroup         func() Cgroup
	// DockerFerryRunc: the machine's dockerd runs and offers ferry's
	// ferry-runc runtime.
	DockerFerryRunc func() bool
	// Registry is the runtimes to look for (nil: all.Registry).
	Registry *runtime.Registry
}

// HostProbes asks the real host.
func HostProbes() Probes {
	return Probes{
		IsRoot:          func() bool { return os.Geteuid() == 0 },
		CriuPath:        criu.Binary,
		CriuInfo:        criu.Installed,
		CriuCheck:       criu.Check,
		Features:        criu.ProbeFeatures,
		WriteTracking:   dirty.Available,
		VMAFlags:        vmas.Available,
		RuntimeVersion:  RuntimeVersion,
		Cgroup:          func() Cgroup { return hostCgroup("/sys/fs/cgroup") },
		DockerFerryRunc: func() bool { return docker.HasStoppedRuntime("") },
	}
}

// Run checks this host.
func Run(ctx context.Context) Report { return HostProbes().Run(ctx) }

// probeTimeout bounds the whole check so a wedged tool cannot hang it.
const probeTimeout = 10 * time.Second

// Run asks every probe, concurrently since most of them start a process,
// and judges the answers.
func (p Probes) Run(ctx context.Context) Report {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var (
		r        Report
		wg       sync.WaitGroup
		criuErr  error
		verErr   error
		info     criu.Info
		checkErr error
		wtErr    error
		vmaErr   error
		feat     criu.Features
	)
	reg := cmp.Or(p.Registry, all.Registry)
	var kinds []runtime.Registration
	for _, g := range reg.All() {
		if len(g.Tools) > 0 {
			kinds = append(kinds, g)
		}
	}
	rt := make([]*string, len(kinds))
	r.Root = p.IsRoot()
	r.CriuPath, criuErr = p.CriuPath()
	if criuErr == nil {
		wg.Go(func() { info, verErr = p.CriuInfo(ctx) })
		wg.Go(func() { checkErr = p.CriuCheck(ctx) })
		wg.Go(func() { feat = p.Features(ctx) })
	}
	for i, g := range kinds {
		wg.Go(func() {
			if v, ok := p.RuntimeVersion(ctx, g.Kind); ok {
				rt[i] = &v
			}
		})
	}
	r.Cgroup = p.Cgroup()
	wtErr = p.WriteTracking()
	wg.Go(func() { vmaErr = p.VMAFlags() }) // loading the kernel's BTF takes ~100 ms
	var ferryRunc bool
	if p.DockerFerryRunc != nil {
		wg.Go(func() { ferryRunc = p.DockerFerryRunc() })
	}
	wg.Wait()

	r.Runtimes = Runtimes{}
	for i, g := range kinds {
		r.Runtimes[g.Kind] = rt[i]
	}
	r.Features = Features{
		DirtyTracking: feat.DirtyTracking,
		WriteTracking: wtErr == nil,
		LazyPages:     feat.LazyPages,
		TCPRepair:     feat.TCPRepair,
		MPTCP:         feat.MPTCP,
		VMAFlags:      vmaErr == nil,
	}
	r.PipeMaxSize = feat.PipeMaxSize
	r.Modes = map[string][]string{}
	hostFeats := runtime.Features{LazyPages: feat.LazyPages, DirtyTracking: feat.DirtyTracking, StoppedRestore: ferryRunc}
	for i, g := range kinds {
		if rt[i] != nil {
			r.Modes[g.Kind] = engine.Modes(g.Caps(hostFeats))
		}
	}
	if criuErr == nil && verErr == nil {
		r.CriuVersion = info.Version.String()
		r.CriuPatches = info.Patches
		r.CriuMissing, r.CriuModes = patchReport(info.Patches)
	}
	switch {
	case criuErr != nil:
		r.CriuCheck = "criu not found"
	case checkErr != nil:
		r.CriuCheck = checkErr.Error()
	default:
		r.CriuCheck = "ok"
	}
	r.judge(criuErr, verErr, info.Version, checkErr, feat, kinds)
	if r.Runtimes["docker"] != nil && !ferryRunc {
		r.Warnings = append(r.Warnings, Problem{
			"Docker's daemon is not running or has no ferry-runc runtime: a Docker copy restored here runs before the commit, and Docker containers move only cold and pre-copy",
			`add "runtimes": {"ferry-runc": {"path": "/usr/libexec/ferry/docker-runc"}} to /etc/docker/daemon.json and restart dockerd (docs/DEPLOY.md)`})
	}
	return r
}

const setupFix = "run `make setup` (builds CRIU 4.2.1 into /usr/local/sbin/criu)"

// judge fills OK, Problems and Warnings from the probe answers.
func (r *Report) judge(criuErr, verErr error, v criu.Version, checkErr error, f criu.Features, kinds []runtime.Registration) {
	r.Problems = []Problem{}
	r.Warnings = []Problem{}
	problem := func(what, fix string) { r.Problems = append(r.Problems, Problem{what, fix}) }
	warn := func(what, fix string) { r.Warnings = append(r.Warnings, Problem{what, fix}) }

	if !r.Root {
		problem("not running as root: CRIU needs full privileges to dump and restore",
			"run ferry as root (sudo ferry ...)")
	}
	min := criu.MinVersion
	switch {
	case criuErr != nil:
		problem("criu not found (at /usr/libexec/ferry/criu, /usr/local/sbin/criu, nor in PATH)", setupFix)
	case verErr != nil:
		problem(fmt.Sprintf("cannot tell the version of %s: %v", r.CriuPath, verErr), setupFix)
	case !v.AtLeast(min.Major, min.Minor, min.Sublevel):
		problem(fmt.Sprintf("%s is CRIU %v, need %v or newer (older versions fail on this kernel)", r.CriuPath, v, min),
			setupFix)
	}
	if criuErr == nil && verErr == nil && len(r.CriuMissing) > 0 {
		var fails []string
		for _, m := range r.CriuMissing {
			if m.Effect != criu.Slower.String() {
				fails = append(fails, m.ID)
			}
		}
		what := fmt.Sprintf("%s lacks %d of ferry's CRIU patches: migrations are slower", r.CriuPath, len(r.CriuMissing))
		if len(fails) > 0 || r.CriuPatches == nil {
			what += ", and some techniques fail or are refused (" + strings.Join(fails, ", ") + "; see below)"
		}
		if r.CriuPatches == nil {
			what = r.CriuPath + " names no ferry patches (a stock CRIU, or one built before patch 0016): " +
				"migrations are slower, a lazy rebuild restore (precopy/rebuild, cold/rebuild) is refused, and so is a container from a host with ferry's CRIU"
		}
		warn(what, "install the ferry-criu package, or run `make setup` (rebuilds CRIU with ferry's patches into /usr/local/sbin/criu)")
	}
	if criuErr == nil && checkErr != nil {
		fix := "fix what CRIU reports (`criu check --all` gives details)"
		if !r.Root {
			fix = "run as root; `criu check` needs root"
		}
		problem("criu check fails: "+checkErr.Error(), fix)
	}
	for _, g := range kinds {
		if g.Required && r.Runtimes[g.Kind] == nil {
			problem(g.Kind+" not found in PATH", cmp.Or(g.Install, "install "+g.Kind))
		}
	}
	r.OK = len(r.Problems) == 0

	if criuErr != nil {
		return // feature answers mean nothing without CRIU
	}
	switch {
	case f.DirtyTracking:
	case r.Features.WriteTracking:
		// Content pre-copy with the kernel's write tracking: no warning.
	default:
		warn("no soft-dirty and no userfaultfd write protection: every pre-copy round reads and hashes all of the container's memory",
			"use Linux 6.7 or newer (userfaultfd asynchronous write protection and PAGEMAP_SCAN), or a kernel built with CONFIG_MEM_SOFT_DIRTY=y")
	}
	switch {
	case !f.UffdNoncoop:
		warn("no userfaultfd (uffd-noncoop): post-copy (lazy pages) is unavailable",
			"use a kernel built with CONFIG_USERFAULTFD=y")
	case !f.LazyPages:
		warn(fmt.Sprintf("fs.pipe-max-size is %d, below %d: post-copy (lazy pages) would fail at the first fault",
			f.PipeMaxSize, criu.MinLazyPipeSize),
			"sysctl -w fs.pipe-max-size=16777216")
	}
	if !f.TCPRepair {
		warn("TCP repair mode unavailable: established TCP connections cannot be migrated",
			"run as root (TCP_REPAIR needs CAP_NET_ADMIN)")
	}
	if !f.MPTCP {
		warn("no MPTCP: migration streams use plain TCP, without multipath failover",
			"sysctl -w net.mptcp.enabled=1 (needs a kernel with CONFIG_MPTCP=y)")
	}
	if !r.Features.VMAFlags {
		warn("no BPF task_vma iterator: each frozen dump reads the container's smaps, for which the kernel walks every page table entry (13-20 ms of the downtime per GiB of memory)",
			"use a kernel with BPF iterators and its BTF (CONFIG_DEBUG_INFO_BTF=y, Linux 5.12+), and run the agent as root")
	}
	if !r.Cgroup.V1 && !r.Cgroup.V2 {
		warn("no cgroup hierarchy found under /sys/fs/cgroup: runc cannot create containers",
			"mount cgroup2 on /sys/fs/cgroup")
	}
	if r.Cgroup.Remount != "" {
		warn("cgroups are mounted without favordynmods: a restore's first move of a process into a cgroup waits for an RCU grace period, inside the downtime (5-16 ms on a 2-core VM)",
			"mount -o remount,favordynmods "+r.Cgroup.Remount+" (until the next boot; forks and exits then take a shared lock instead of a per-CPU one)")
	}
}

// RuntimeVersion runs `<tool> --version` for each of a registered
// runtime's Tools and returns the version from the first line that has
// one, without build metadata ("runc version 1.1.5+ds1" gives "1.1.5").
func RuntimeVersion(ctx context.Context, kind string) (string, bool) {
	g, ok := all.Registry.Get(kind)
	if !ok {
		return "", false
	}
	for _, tool := range g.Tools {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, tool, "--version").Output()
		if err != nil {
			continue
		}
		if v := parseToolVersion(string(out)); v != "" {
			return v, true
		}
	}
	return "", false
}

// parseToolVersion takes the first word of the first line that starts
// with a digit, without build metadata: "runc version 1.1.5+ds1", "podman
// version 4.3.1", lxc's bare "5.0.2" and "containerd
// github.com/containerd/containerd 1.6.20~ds1 ..." give 1.1.5, 4.3.1,
// 5.0.2 and 1.6.20.
func parseToolVersion(out string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	for _, f := range strings.Fields(line) {
		if f[0] >= '0' && f[0] <= '9' {
			v, _, _ := strings.Cut(f, "+")
			v, _, _ = strings.Cut(v, "~")
			return strings.TrimSuffix(v, ",")
		}
	}
	return ""
}

// ProbeCgroup looks at a cgroup mount point (normally /sys/fs/cgroup). A v1
// hierarchy is a subdirectory with a "tasks" file, which only v1 has; a v2
// hierarchy is the mount point itself or its "unified" subdirectory (hybrid
// layout) with a cgroup.controllers file.
func ProbeCgroup(root string) Cgroup {
	var c Cgroup
	for _, dir := range []string{root, filepath.Join(root, "unified")} {
		if fileExists(filepath.Join(dir, "cgroup.controllers")) {
			c.V2, c.V2Path = true, dir
			break
		}
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.IsDir() && fileExists(filepath.Join(root, e.Name(), "tasks")) {
			c.V1 = true
			break
		}
	}
	return c
}

// hostCgroup is ProbeCgroup, with favordynmods read from this host's
// mounts and kernel.
func hostCgroup(root string) Cgroup {
	c := ProbeCgroup(root)
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return c
	}
	var u unix.Utsname
	hasOption := unix.Uname(&u) == nil && kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 6, 0)
	c.FavorDynmods, c.Remount = favorDynmods(string(mounts), root, hasOption)
	return c
}

// favorDynmods reads a mount table (/proc/self/mounts): whether a cgroup
// hierarchy below root has favordynmods, and otherwise, where the kernel
// has the option, the hierarchy to remount with it (cgroup2's, else the
// first). The option is the kernel's, not a hierarchy's: one suffices.
func favorDynmods(mounts, root string, hasOption bool) (set bool, remount string) {
	var v1, v2 string
	for _, line := range strings.Split(mounts, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || (f[2] != "cgroup" && f[2] != "cgroup2") {
			continue
		}
		if f[1] != root && !strings.HasPrefix(f[1], root+"/") {
			continue
		}
		if slices.Contains(strings.Split(f[3], ","), "favordynmods") {
			return true, ""
		}
		switch {
		case f[2] == "cgroup2" && v2 == "":
			v2 = f[1]
		case f[2] == "cgroup" && v1 == "":
			v1 = f[1]
		}
	}
	if !hasOption {
		return false, ""
	}
	return false, cmp.Or(v2, v1)
}

// kernelAtLeast says whether a kernel release ("6.18.44-fc") is at least
// major.minor.
func kernelAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(release, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Text renders the report for a terminal: one aligned line per check, then
// the problems and warnings with their fixes.
func (r Report) Text() string {
	var b strings.Builder
	if r.OK {
		b.WriteString("ferry check: OK, cold migration possible\n\n")
	} else {
		b.WriteString("ferry check: NOT READY\n\n")
	}
	line := func(mark, name, value string) {
		fmt.Fprintf(&b, "  %s %-16s %s\n", mark, name, value)
	}
	// need marks a required item, opt an optional one.
	need := func(ok bool) string { return pick(ok, "✓", "✗") }
	opt := func(ok bool) string { return pick(ok, "✓", "!") }

	line(need(r.Root), "root", pick(r.Root, "yes", "no"))
	criuVal := "not found"
	if r.CriuPath != "" {
		criuVal = r.CriuPath + " " + pick(r.CriuVersion != "", r.CriuVersion, "(version unknown)")
	}
	v, err := criu.ParseVersion(r.CriuVersion)
	min := criu.MinVersion
	line(need(err == nil && v.AtLeast(min.Major, min.Minor, min.Sublevel)), "criu", criuVal)
	line(need(r.CriuCheck == "ok"), "criu check", firstLine(r.CriuCheck))
	if r.CriuVersion != "" {
		line(opt(len(r.CriuMissing) == 0), "criu patches", patchesLine(r.CriuPatches))
	}
	modes := func(kind string) string {
		if m, ok := r.Modes[kind]; ok {
			return "  modes: " + strings.Join(m, ", ")
		}
		return ""
	}
	for _, g := range r.runtimeOrder(all.Registry) {
		v := r.Runtimes[g.Kind]
		mark := pick(v != nil, "✓", "-")
		if g.Required {
			mark = need(v != nil)
		}
		line(mark, g.Kind, deref(v)+modes(g.Kind))
	}
	cg := []string{}
	if r.Cgroup.V1 {
		cg = append(cg, "v1")
	}
	if r.Cgroup.V2 {
		cg = append(cg, "v2 ("+r.Cgroup.V2Path+")")
	}
	if r.Cgroup.FavorDynmods {
		cg = append(cg, "favordynmods")
	}
	line(opt(len(cg) > 0), "cgroup", pick(len(cg) > 0, strings.Join(cg, ", "), "none"))
	f := r.Features
	line(opt(f.DirtyTracking), "dirty tracking", pick(f.DirtyTracking, "yes (CRIU pre-dump)", "no (pre-copy by hashing)"))
	line(opt(f.WriteTracking), "write tracking", pick(f.WriteTracking, "yes (rounds read only written pages)", "no (rounds read all memory)"))
	line(opt(f.LazyPages), "lazy pages", fmt.Sprintf("%s (pipe-max-size %d)", pick(f.LazyPages, "yes", "no"), r.PipeMaxSize))
	line(opt(f.TCPRepair), "tcp repair", pick(f.TCPRepair, "yes", "no"))
	line(opt(f.MPTCP), "mptcp", pick(f.MPTCP, "yes", "no"))
	line(opt(f.VMAFlags), "vma flags", pick(f.VMAFlags, "yes (the frozen dump reads a smaps snapshot)", "no (the frozen dump walks page tables)"))

	section := func(title, mark string, ps []Problem) {
		if len(ps) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s:\n", title)
		for _, p := range ps {
			fmt.Fprintf(&b, "  %s %s\n      fix: %s\n", mark, p.What, p.Fix)
		}
	}
	r.patchText(&b)
	section("Problems", "✗", r.Problems)
	section("Warnings", "!", r.Warnings)
	return b.String()
}

// runtimeOrder is the report's runtimes in reg's order, then any reg does
// not know (a report from another ferry, or from a test's registry).
func (r Report) runtimeOrder(reg *runtime.Registry) []runtime.Registration {
	var out []runtime.Registration
	for _, g := range reg.All() {
		if _, ok := r.Runtimes[g.Kind]; ok {
			out = append(out, g)
		}
	}
	var rest []string
	for k := range r.Runtimes {
		if _, ok := reg.Get(k); !ok {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		out = append(out, runtime.Registration{Kind: k})
	}
	return out
}

func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}

func deref(s *string) string {
	if s == nil {
		return "not found"
	}
	return *s
}

func firstLine(s string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	if sc.Scan() {
		return sc.Text()
	}
	return s
}

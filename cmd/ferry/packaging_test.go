package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// The example configuration is valid for the agent as it is.
func TestExampleAgentConfig(t *testing.T) {
	cmd := newAgentCmd()
	if err := applyConfig(cmd.Flags(), "../../packaging/agent.toml"); err != nil {
		t.Fatal(err)
	}
	if v, _ := cmd.Flags().GetStringSlice("listen"); len(v) != 1 || v[0] != "0.0.0.0:7070" {
		t.Errorf("listen = %v", v)
	}
}

// The systemd units pass systemd-analyze verify, with the unit's ferry
// binary replaced by the one built here.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("needs systemd-analyze")
	}
	bin := os.Getenv("FERRY_BIN")
	if bin == "" {
		t.Skip("needs FERRY_BIN, the ferry binary the unit starts (make test sets it)")
	}
	dir := t.TempDir()
	var units []string
	for _, name := range []string{"ferry-agent.service", "run-criu.mount"} {
		b, err := os.ReadFile(filepath.Join("../../packaging/systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "/usr/bin/ferry", bin)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// Every visible command gets a man page, and none of the hidden ones.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	root := newRootCmd()
	root.SetArgs([]string{"man", "--dir", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ferry.1", "ferry-migrate.1", "ferry-drain.1", "ferry-agent.1", "ferry-version.1", "ferry-calibrate.1"} {
		b, err := os.ReadFile(filepath.Join(dir, want))
		if err != nil || !strings.Contains(string(b), ".SH NAME") {
			t.Errorf("%s: %v", want, err)
		}
	}
	for _, hidden := range []string{"ferry-man.1", "ferry-lazyrelay.1"} {
		if _, err := os.Stat(filepath.Join(dir, hidden)); err == nil {
			t.Errorf("%s written for a hidden command", hidden)
		}
	}
	// The lab's commands are ferry-lab's: the package documents none.
	for _, lab := range []string{"ferry-lab.1", "ferry-bench.1", "ferry-bench-faults.1", "ferry-lab-tool.1"} {
		if _, err := os.Stat(filepath.Join(dir, lab)); err == nil {
			t.Errorf("%s written: the lab's commands are not ferry's", lab)
		}
	}
}

// ps prints a table: a running job with its phase, an ended one with its
// outcome and, for a failed one, what became of the source copy.
func TestPrintJobs(t *testing.T) {
	now := time.Unix(1000, 0)
	var b strings.Builder
	printJobs(&b, []engine.Job{
		{ID: "aaaaaaaaaaaa", Container: "web", To: "h2", Mode: "precopy", Started: now.Add(-2 * time.Second), Progress: engine.Progress{Phase: "round-2", Bytes: 3 << 20,
			Rounds: 2, DirtyRate: 120, PredictedDowntimeMs: 212.4}},
		{ID: "bbbbbbbbbbbb", Container: "db", To: "h2", Mode: "cold", Started: now.Add(-9 * time.Second), Ended: now.Add(-6 * time.Second),
			Report: &engine.Report{OK: false, FailedAt: "restore on h2", SourceState: "resumed"}},
		{ID: "cccccccccccc", Container: "kv", To: "h2", Mode: "hybrid", Started: now.Add(-5 * time.Second), Ended: now.Add(-4 * time.Second),
			Report: &engine.Report{OK: false, FailedAt: "dump on h1", SourceState: "lost"}},
	}, now)
	out := b.String()
	for _, want := range []string{"ID  ", "aaaaaaaaaaaa  web", "round-2 (2 rounds, 120 pages/s dirty, downtime now ~212 ms)", "3.0 MiB", "2s", "failed at restore on h2, source resumed", "3s", "failed at dump on h1, source lost"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	b.Reset()
	printJobs(&b, nil, now)
	if !strings.Contains(b.String(), "no migrations") {
		t.Errorf("empty: %q", b.String())
	}
}

// A report's exit status: ok, failed after the freeze (the source
// resumed), in doubt, lost, refused before anything froze.
func TestReportExit(t *testing.T) {
	frozeThenFailed := []engine.PhaseSpan{{Name: "prepare"}, {Name: "freeze"}, {Name: "dump"}}
	for _, c := range []struct {
		name string
		rep  engine.Report
		want int
	}{
		{"ok", engine.Report{OK: true, Phases: frozeThenFailed}, exitOK},
		{"failed, resumed", engine.Report{SourceState: "resumed", Phases: frozeThenFailed}, exitFailed},
		{"in doubt", engine.Report{SourceState: "frozen", InDoubtID: "0123456789ab", Phases: frozeThenFailed}, exitInDoubt},
		{"lost", engine.Report{SourceState: "lost", Phases: frozeThenFailed}, exitLost},
		{"refused at the offer", engine.Report{FailedAt: "offer", Phases: []engine.PhaseSpan{{Name: "prepare"}}}, exitRefused},
		{"cancelled during the rounds", engine.Report{SourceState: "resumed", Phases: []engine.PhaseSpan{{Name: "round-0"}}}, exitRefused},
	} {
		if got := reportExit(c.rep); got != c.want {
			t.Errorf("%s: exit %d, want %d", c.name, got, c.want)
		}
	}
}

// A wrong command line exits 2; other failures 1.
func TestUsageExit(t *testing.T) {
	for _, args := range [][]string{
		{"migrate"},                                            // no container
		{"migrate", "a", "b", "--to", "h2"},                    // too many
		{"migrate", "web"},                                     // --to missing
		{"migrate", "web", "--to", "h2", "--nope"},             // unknown flag
		{"ps", "--all=maybe"},                                  // bad flag value
		{"migrate", "web", "--to", "h2", "--json", "--events"}, // exclusive flags
		{"migrate", "web", "--to", "h2", "--min-round-bytes", "4 apples"},
		{"migrate", "web", "--to", "h2", "--namespace", "prod"}, // --namespace without containerd
		{"migrate", "web", "--to", "h2", "--id", "../x"},        // not an ID
		{"calibrate"}, // measuring is ferry-lab's
		{"lab", "up"}, // not ferry's
		{"teleport"},  // unknown command
	} {
		root := newRootCmd()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if err == nil || cli.ExitCode(err) != exitUsage {
			t.Errorf("%v: %v (exit %d), want a usage error (exit 2)", args, err, cli.ExitCode(err))
		}
	}
	if cli.ExitCode(errors.New("connect: connection refused")) != exitFailed {
		t.Error("a failure is not a usage error")
	}
}

// make package builds a .deb carrying what docs/DEPLOY.md installs by
// hand: the binary (which runs and knows its version), the units, the
// sysctl and tmpfiles settings, the example agent.toml as a conffile,
// man pages and completion; its maintainer scripts parse. It depends on
// the ferry-criu of its version (make release builds it; tools/package's
// tests check both packages further).
func TestDebPackage(t *testing.T) {
	for _, tool := range []string{"make", "dpkg-deb", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	tmp := t.TempDir()
	bin, dist := filepath.Join(tmp, "bin"), filepath.Join(tmp, "dist")
	mustRun(t, context.Background(), "make", "-C", "../..", "--no-print-directory", "package", "BIN="+bin, "DIST="+dist, "VERSION=v1.2.3")
	debs, _ := filepath.Glob(filepath.Join(dist, "*.deb"))
	if len(debs) != 1 || !strings.HasPrefix(filepath.Base(debs[0]), "ferry_1.2.3_") {
		t.Fatalf("make package wrote %v, want one ferry_1.2.3_ARCH.deb", debs)
	}
	deb := debs[0]
	dpkg := func(args ...string) string { t.Helper(); return mustRun(t, context.Background(), "dpkg-deb", args...) }
	fields := dpkg("--field", deb, "Package", "Version", "Depends")
	for _, want := range []string{"Package: ferry", "Version: 1.2.3", "Depends: ferry-criu (= 1.2.3) | criu (>= 4.2.1), runc"} {
		if !strings.Contains(fields, want) {
			t.Errorf("control fields lack %q:\n%s", want, fields)
		}
	}
	root, control := filepath.Join(tmp, "root"), filepath.Join(tmp, "control")
	dpkg("-x", deb, root)
	dpkg("-e", deb, control)
	for pkg, repo := range map[string]string{
		"lib/systemd/system/ferry-agent.service": "packaging/systemd/ferry-agent.service",
		"lib/systemd/system/run-criu.mount":      "packaging/systemd/run-criu.mount",
		"usr/lib/sysctl.d/50-ferry.conf":         "packaging/sysctl.d/50-ferry.conf",
		"usr/lib/tmpfiles.d/ferry.conf":          "packaging/tmpfiles.d/ferry.conf",
		"etc/ferry/agent.toml":                   "packaging/agent.toml",
		"usr/share/doc/ferry/copyright":          "LICENSE",
	} {
		got, err := os.ReadFile(filepath.Join(root, pkg))
		want, _ := os.ReadFile(filepath.Join("../..", repo))
		if err != nil || string(got) != string(want) {
			t.Errorf("/%s in the package differs from %s (%v)", pkg, repo, err)
		}
	}
	for _, f := range []string{"usr/share/man/man1/ferry-migrate.1", "usr/share/bash-completion/completions/ferry"} {
		if st, err := os.Stat(filepath.Join(root, f)); err != nil || st.Size() == 0 {
			t.Errorf("/%s: %v", f, err)
		}
	}
	// The lab is ferry-lab's, which the package does not carry.
	for _, f := range []string{"usr/bin/ferry-lab", "usr/share/man/man1/ferry-lab.1", "usr/share/man/man1/ferry-bench.1"} {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			t.Errorf("/%s in the package: the lab is not production's", f)
		}
	}
	if b, err := os.ReadFile(filepath.Join(control, "conffiles")); err != nil || strings.TrimSpace(string(b)) != "/etc/ferry/agent.toml" {
		t.Errorf("conffiles: %q %v", b, err)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		if out, err := exec.Command("sh", "-n", filepath.Join(control, s)).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", s, err, out)
		}
	}
	out, err := exec.Command(filepath.Join(root, "usr/bin/ferry"), "version", "--json").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"v1.2.3"`) {
		t.Errorf("the packaged ferry version --json: %v\n%s", err, out)
	}
	t.Run("installs", func(t *testing.T) { debInstalls(t, deb) })
}

// debInstalls installs the package with dpkg into a Debian 12 minbase
// root (the lab's cached one; its maintainer scripts run chrooted there),
// runs ferry --version there, and removes then purges it. Its
// dependencies are not in minbase: dpkg is told to go on without them.
func debInstalls(t *testing.T, deb string) {
	testroot.Require(t, "needs root: the root filesystem keeps its owners, dpkg chroots")
	for _, tool := range []string{"dpkg", "chroot", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	o := lab.DebianOptions{}
	if _, err := os.Stat(o.Path()); err != nil {
		if err := lab.DebianMirrorReachable(context.Background(), o, 5*time.Second); err != nil {
			t.Skipf("SKIP (not a pass): no cached Debian root filesystem and the mirror is unreachable: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	minbase, err := lab.EnsureDebianRootfs(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	run := func(name string, args ...string) string { t.Helper(); return mustRun(t, ctx, name, args...) }
	run("tar", "--numeric-owner", "--same-owner", "--exclude=./dev/*", "-C", root, "-xf", minbase.Tarball)
	run("dpkg", "--root="+root, "--force-depends", "-i", deb)
	if st := run("dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f=${Status} ${Version}", "ferry"); st != "install ok installed 1.2.3" {
		t.Errorf("dpkg-query after install: %q", st)
	}
	if v := run("chroot", root, "/usr/bin/ferry", "--version"); !strings.Contains(v, "v1.2.3") {
		t.Errorf("ferry --version in the installed root: %q", v)
	}
	run("dpkg", "--root="+root, "-r", "ferry")
	if _, err := os.Stat(filepath.Join(root, "usr/bin/ferry")); err == nil {
		t.Error("dpkg -r left /usr/bin/ferry")
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ferry/agent.toml")); err != nil {
		t.Errorf("dpkg -r removed the configuration: %v", err)
	}
	run("dpkg", "--root="+root, "-P", "ferry")
	if _, err := os.Stat(filepath.Join(root, "etc/ferry/agent.toml")); err == nil {
		t.Error("dpkg -P left /etc/ferry/agent.toml")
	}
}

// --log-format and --log-level shape the agent's log; bad values are refused.
func TestNewLogger(t *testing.T) {
	var b strings.Builder
	l, err := newLogger(&b, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "migration", "m1")
	if out := b.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown","migration":"m1"`) {
		t.Errorf("json at warn wrote %q", out)
	}
	b.Reset()
	if l, err = newLogger(&b, "text", "debug"); err != nil {
		t.Fatal(err)
	}
	l.Debug("seen")
	if !strings.Contains(b.String(), "level=DEBUG msg=seen") {
		t.Errorf("text at debug wrote %q", b.String())
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"text", "loud"}} {
		if _, err := newLogger(&b, bad[0], bad[1]); err == nil {
			t.Errorf("newLogger(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

// No flag's help names its value with backticks by accident: pflag takes
// a `quoted` word in a usage string for the value's name (--tls-dir
// ferry certs).
func TestFlagUsageHasNoQuotedNames(t *testing.T) {
	for _, bad := range cli.QuotedUsages(newRootCmd()) {
		t.Errorf("usage has backticks: %s", bad)
	}
}

// mustRun runs a command and returns its output, failing the test with
// that output if it fails.
func mustRun(t *testing.T, ctx context.Context, name string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

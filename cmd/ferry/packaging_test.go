package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/engine"
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
	for _, want := range []string{"ferry.1", "ferry-migrate.1", "ferry-drain.1", "ferry-agent.1", "ferry-version.1", "ferry-bench-faults.1"} {
		b, err := os.ReadFile(filepath.Join(dir, want))
		if err != nil || !strings.Contains(string(b), ".SH NAME") {
			t.Errorf("%s: %v", want, err)
		}
	}
	for _, hidden := range []string{"ferry-lab-tool.1", "ferry-man.1"} {
		if _, err := os.Stat(filepath.Join(dir, hidden)); err == nil {
			t.Errorf("%s written for a hidden command", hidden)
		}
	}
}

// ps prints a table: a running job with its phase, an ended one with its
// outcome.
func TestPrintJobs(t *testing.T) {
	now := time.Unix(1000, 0)
	var b strings.Builder
	printJobs(&b, []engine.Job{
		{ID: "aaaaaaaaaaaa", Container: "web", To: "h2", Mode: "precopy", Started: now.Add(-2 * time.Second), Progress: engine.Progress{Phase: "round-1", Bytes: 3 << 20}},
		{ID: "bbbbbbbbbbbb", Container: "db", To: "h2", Mode: "cold", Started: now.Add(-9 * time.Second), Ended: now.Add(-6 * time.Second),
			Report: &engine.Report{OK: false, FailedAt: "restore on h2"}},
	}, now)
	out := b.String()
	for _, want := range []string{"ID  ", "aaaaaaaaaaaa  web", "round-1", "3.0 MiB", "2s", "failed at restore on h2", "3s"} {
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
// resumed), in doubt, refused before anything froze.
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
		{"migrate"},                                // no container
		{"migrate", "a", "b", "--to", "h2"},        // too many
		{"migrate", "web"},                         // --to missing
		{"migrate", "web", "--to", "h2", "--nope"}, // unknown flag
		{"ps", "--all=maybe"},                      // bad flag value
		{"teleport"},                               // unknown command
	} {
		root := newRootCmd()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if err == nil || exitCode(err) != exitUsage {
			t.Errorf("%v: %v (exit %d), want a usage error (exit 2)", args, err, exitCode(err))
		}
	}
	if exitCode(errors.New("connect: connection refused")) != exitFailed {
		t.Error("a failure is not a usage error")
	}
}

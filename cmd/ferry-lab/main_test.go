package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// A wrong command line exits 2.
func TestUsageExit(t *testing.T) {
	for _, args := range [][]string{
		{"lab", "run", "h1", "x", "--runtime", "docker", "--ip", "10.79.0.9", "--", "sleep", "1"}, // no own address under Docker
		{"bench", "migrate", "--nope"},
		{"migrate", "app", "--to", "h2"}, // production's, not the lab's
	} {
		root := newRootCmd()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		if err := root.Execute(); err == nil || cli.ExitCode(err) != cli.ExitUsage {
			t.Errorf("%v: %v (exit %d), want a usage error (exit 2)", args, err, cli.ExitCode(err))
		}
	}
}

// No flag's help names its value with backticks by accident.
func TestFlagUsageHasNoQuotedNames(t *testing.T) {
	for _, bad := range cli.QuotedUsages(newRootCmd()) {
		t.Errorf("usage has backticks: %s", bad)
	}
}

// ferry takes the lab's host names from its state file ($FERRY_HOSTS, as
// ferry-lab lab up says): each host's name, agent_addr and control_sock
// are where ferry's agentflags.go reads them.
func TestStateFileIsAHostsFile(t *testing.T) {
	b, err := json.Marshal(lab.Lab{Hosts: []lab.Host{{Config: host.Config{Name: "h1"}, AgentAddr: "10.77.0.1:7070", ControlSock: "/run/ferry/lab/h1.sock"}}})
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Hosts []map[string]any `json:"hosts"`
	}
	if err := json.Unmarshal(b, &f); err != nil || len(f.Hosts) != 1 {
		t.Fatalf("%s: %v", b, err)
	}
	for k, want := range map[string]string{"name": "h1", "agent_addr": "10.77.0.1:7070", "control_sock": "/run/ferry/lab/h1.sock"} {
		if got, _ := f.Hosts[0][k].(string); got != want {
			t.Errorf("hosts[0].%s = %q, want %q (in %s)", k, got, want, strings.TrimSpace(string(b)))
		}
	}
}

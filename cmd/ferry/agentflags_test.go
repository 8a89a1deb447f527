package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/pki"
)

func TestAgentFlagsEndpoints(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca")
	if err := pki.NewCA(ca, ""); err != nil {
		t.Fatal(err)
	}
	alice := filepath.Join(ca, "alice")
	if err := pki.IssueOperator(ca, alice, "alice", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := pki.Issue(ca, filepath.Join(ca, "h1"), "h1", nil, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FERRY_TLS_DIR", "")
	t.Setenv("FERRY_OPERATOR", "")

	// A control socket passes through, the destination as given.
	for _, from := range []string{"/run/ferry/agent.sock", "unix:///run/ferry/agent.sock", "./agent.sock"} {
		ep, to, err := agentFlags{from: from}.endpoints("10.0.0.2:7070")
		if err != nil || ep.Socket == "" || ep.Operator != nil || to != "10.0.0.2:7070" {
			t.Errorf("--from %s: %+v %q %v", from, ep, to, err)
		}
	}

	// An address needs an operator's certificate, and says where to get one.
	if _, _, err := (agentFlags{from: "node1@192.0.2.1:7070"}).endpoints(""); err == nil || !strings.Contains(err.Error(), "ferry certs operator") {
		t.Errorf("no --tls-dir: %v", err)
	}
	ep, _, err := agentFlags{from: "node1@192.0.2.1:7070", tlsDir: alice}.endpoints("")
	if err != nil {
		t.Fatal(err)
	}
	if ep.Addr != "192.0.2.1:7070" || ep.Name != "node1" || ep.Operator == nil || ep.Operator.Name != "alice" || ep.String() != "node1@192.0.2.1:7070" {
		t.Errorf("--from node1@192.0.2.1:7070: %+v", ep)
	}
	// From the environment, and without a name to prove.
	t.Setenv("FERRY_TLS_DIR", alice)
	if ep, _, err := (agentFlags{from: "192.0.2.1:7070"}).endpoints(""); err != nil || ep.Name != "" || ep.Operator == nil {
		t.Errorf("$FERRY_TLS_DIR: %+v %v", ep, err)
	}
	t.Setenv("FERRY_TLS_DIR", "")

	// A host's certificate is not an operator's; a directory of several
	// needs --operator.
	if _, _, err := (agentFlags{from: "192.0.2.1:7070", tlsDir: filepath.Join(ca, "h1")}).endpoints(""); err == nil || !strings.Contains(err.Error(), "not an operator's") {
		t.Errorf("a host's certificate: %v", err)
	}
	shared := filepath.Join(t.TempDir(), "ops")
	for _, n := range []string{"alice", "bob"} {
		if err := pki.IssueOperator(ca, shared, n, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := (agentFlags{from: "192.0.2.1:7070", tlsDir: shared}).endpoints(""); err == nil || !strings.Contains(err.Error(), "(alice, bob): name one with --operator") {
		t.Errorf("a directory of several: %v", err)
	}
	if ep, _, err := (agentFlags{from: "192.0.2.1:7070", tlsDir: ca, operator: "alice"}).endpoints(""); err != nil || ep.Operator == nil {
		t.Errorf("--operator alice in the CA's directory: %v", err)
	}
	if _, _, err := (agentFlags{from: "192.0.2.1:7070", tlsDir: t.TempDir()}).endpoints(""); err == nil || !strings.Contains(err.Error(), "no operator's certificate") {
		t.Errorf("an empty directory: %v", err)
	}
}

// Host names come from the hosts file $FERRY_HOSTS names (the lab's state
// file has its shape), and only from there.
func TestAgentFlagsHostNames(t *testing.T) {
	t.Setenv(hostsEnv, "")
	if _, _, err := (agentFlags{from: "h1"}).endpoints(""); err == nil || !strings.Contains(err.Error(), "FERRY_HOSTS") {
		t.Errorf("a host name without a hosts file: %v", err)
	}
	path := filepath.Join(t.TempDir(), "hosts.json")
	hosts := `{"hosts": [{"name": "h1", "agent_addr": "10.77.0.1:7070", "control_sock": "/run/ferry/lab/h1.sock", "agent_pid": 7},
		{"name": "h2", "agent_addr": "10.77.0.2:7070"}], "bandwidth_bps": 0}`
	if err := os.WriteFile(path, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(hostsEnv, path)
	ep, to, err := agentFlags{from: "h1"}.endpoints("h2")
	if err != nil || ep.Socket != "/run/ferry/lab/h1.sock" || to != "h2@10.77.0.2:7070" {
		t.Errorf("--from h1 --to h2: %+v %q %v", ep, to, err)
	}
	if _, _, err := (agentFlags{from: "h2"}).endpoints(""); err == nil || !strings.Contains(err.Error(), "no control socket") {
		t.Errorf("--from a host without a socket here: %v", err)
	}
	if _, _, err := (agentFlags{from: "h1"}).endpoints("h9"); err == nil || !strings.Contains(err.Error(), `no host "h9"`) {
		t.Errorf("--to an unknown host: %v", err)
	}
}

package main

import (
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

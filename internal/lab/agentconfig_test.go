package lab

import (
	"testing"

	"github.com/BurntSushi/toml"
)

// AgentConfig says, as TOML settings, what the lab's command line says:
// each flag with its value, a flag without one as true.
func TestAgentConfigIsTheCommandLine(t *testing.T) {
	l := &Lab{Hosts: []Host{newHost(1), newHost(2), newHost(3)}, Paths: 2, Streams: 4}
	h := &l.Hosts[0]
	b, err := l.AgentConfig(h)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if _, err := toml.Decode(string(b), &got); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	args := agentArgs(h, l)
	want := map[string]string{
		"name": h.Name, "control": h.ControlSock, "state": h.StateDir, "netns": h.NetNS,
		"listen": h.AgentAddr + ",10.78.0.1:7070", "allow": "h1,h2,h3",
		"allow-faults": "true", "mptcp": "false", "streams": "4",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// Every flag of the command line, no more.
	flags := 0
	for _, a := range args[1:] {
		if len(a) > 2 && a[:2] == "--" {
			flags++
		}
	}
	if len(got) != flags {
		t.Errorf("%d settings for %d flags:\n%s", len(got), flags, b)
	}
}

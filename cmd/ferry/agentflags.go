package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/pki"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// agentFlags say which agent a command asks: --from, and for one reached
// over the network, the operator's certificate.
type agentFlags struct {
	from, tlsDir, operator string
}

// fromHelp is --from's help, shared by every command that asks an agent.
const fromHelp = `%s: its control socket on this host, a host name from $FERRY_HOSTS, or NAME@ADDR (or ADDR) of its listen address to ask it from another machine with an operator's certificate (--tls-dir)`

func (a *agentFlags) add(cmd *cobra.Command, which string) {
	f := cmd.Flags()
	f.StringVar(&a.from, "from", agent.DefaultControl, fmt.Sprintf(fromHelp, which))
	f.StringVar(&a.tlsDir, "tls-dir", "", "with --from NAME@ADDR: directory holding the operator's certificate and the CA, from ferry certs operator (default $FERRY_TLS_DIR)")
	f.StringVar(&a.operator, "operator", "", "with --from NAME@ADDR: the operator certificate's name (default $FERRY_OPERATOR, or the only certificate in --tls-dir)")
}

// hostsEnv names a hosts file, by which commands take host names (h2)
// for agents: JSON with a "hosts" list, each host's "name", "agent_addr"
// (its listen address) and, for an agent on this machine,
// "control_sock". ferry-lab's state file is one
// (FERRY_HOSTS=/run/ferry/lab/state.json names the lab's hosts); ferry
// reads nothing of the lab unless told to.
const hostsEnv = "FERRY_HOSTS"

// namedHost is one host of a hosts file.
type namedHost struct {
	Name        string `json:"name"`
	AgentAddr   string `json:"agent_addr"`
	ControlSock string `json:"control_sock"`
}

// hostsFile reads the hosts file $FERRY_HOSTS names.
func hostsFile() (map[string]namedHost, error) {
	path := os.Getenv(hostsEnv)
	if path == "" {
		return nil, fmt.Errorf("no hosts file: set $%s to one (ferry-lab's: /run/ferry/lab/state.json), or give NAME@ADDR or a control socket", hostsEnv)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", hostsEnv, err)
	}
	var f struct {
		Hosts []namedHost `json:"hosts"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("$%s: %s: %w", hostsEnv, path, err)
	}
	out := map[string]namedHost{}
	for _, h := range f.Hosts {
		out[h.Name] = h
	}
	return out, nil
}

// endpoints resolves --from into the agent to ask, and to (a destination:
// host names become NAME@ADDR) into the address the source dials.
func (a agentFlags) endpoints(to string) (client.Endpoint, string, error) {
	from := a.from
	isHostName := func(s string) bool { return s != "" && !strings.ContainsAny(s, ":/") }
	var hosts map[string]namedHost
	host := func(name string) (namedHost, error) {
		if hosts == nil {
			var err error
			if hosts, err = hostsFile(); err != nil {
				return namedHost{}, fmt.Errorf("%q looks like a host name, but: %w", name, err)
			}
		}
		h, ok := hosts[name]
		if !ok {
			return namedHost{}, fmt.Errorf("no host %q in $%s (%s)", name, hostsEnv, os.Getenv(hostsEnv))
		}
		return h, nil
	}
	if isHostName(to) {
		h, err := host(to)
		if err != nil {
			return client.Endpoint{}, "", err
		}
		to = h.Name + "@" + h.AgentAddr // the destination must prove it is h
	}
	switch network, _ := transport.SplitAddr(from); {
	case isHostName(from):
		h, err := host(from)
		if err != nil {
			return client.Endpoint{}, "", err
		}
		if h.ControlSock == "" {
			return client.Endpoint{}, "", fmt.Errorf("host %q in $%s has no control socket on this machine: give NAME@ADDR", from, hostsEnv)
		}
		return client.Socket(h.ControlSock), to, nil
	case network == "unix":
		return client.Socket(from), to, nil
	}
	name, addr, named := strings.Cut(from, "@")
	if !named {
		name, addr = "", from
	}
	sec, err := a.operatorTLS(from)
	if err != nil {
		return client.Endpoint{}, "", err
	}
	return client.Endpoint{Addr: addr, Name: name, Operator: sec}, to, nil
}

// operatorTLS loads the operator's certificate for reaching from.
func (a agentFlags) operatorTLS(from string) (*client.Operator, error) {
	dir, name := a.tlsDir, a.operator
	if dir == "" {
		dir = os.Getenv("FERRY_TLS_DIR")
	}
	if name == "" {
		name = os.Getenv("FERRY_OPERATOR")
	}
	if dir == "" {
		return nil, fmt.Errorf("--from %s asks an agent over the network: give --tls-dir, a directory with an operator's certificate (ferry certs operator --help)", from)
	}
	if name == "" {
		var err error
		if name, err = onlyCertificate(dir); err != nil {
			return nil, fmt.Errorf("--tls-dir: %w", err)
		}
	}
	sec, err := client.LoadOperator(dir, name)
	if err != nil {
		return nil, fmt.Errorf("--tls-dir: %w", err)
	}
	return sec, nil
}

// onlyCertificate names the one certificate besides the CA's in dir.
func onlyCertificate(dir string) (string, error) {
	certs, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return "", err
	}
	var names []string
	for _, c := range certs {
		if n := strings.TrimSuffix(filepath.Base(c), ".crt"); n+".crt" != pki.CACertFile {
			names = append(names, n)
		}
	}
	switch len(names) {
	case 1:
		return names[0], nil
	case 0:
		return "", fmt.Errorf("no operator's certificate in %s (ferry certs operator --help)", dir)
	}
	return "", fmt.Errorf("%s holds several certificates (%s): name one with --operator", dir, strings.Join(names, ", "))
}

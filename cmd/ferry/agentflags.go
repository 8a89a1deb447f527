package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/pki"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// agentFlags say which agent a command asks: --from, and for one reached
// over the network, the operator's certificate.
type agentFlags struct {
	from, tlsDir, operator string
}

// fromHelp is --from's help, shared by every command that asks an agent.
const fromHelp = `%s: its control socket on this host, a lab host name, or NAME@ADDR (or ADDR) of its listen address to ask it from another machine with an operator's certificate (--tls-dir)`

func (a *agentFlags) add(cmd *cobra.Command, which string) {
	f := cmd.Flags()
	f.StringVar(&a.from, "from", agent.DefaultControl, fmt.Sprintf(fromHelp, which))
	f.StringVar(&a.tlsDir, "tls-dir", "", "with --from NAME@ADDR: directory holding the operator's certificate and the CA, from ferry certs operator (default $FERRY_TLS_DIR)")
	f.StringVar(&a.operator, "operator", "", "with --from NAME@ADDR: the operator certificate's name (default $FERRY_OPERATOR, or the only certificate in --tls-dir)")
}

// endpoints resolves --from into the agent to ask, and to (a destination:
// lab host names become NAME@ADDR) into the address the source dials.
func (a agentFlags) endpoints(to string) (client.Endpoint, string, error) {
	from := a.from
	isLabName := func(s string) bool { return s != "" && !strings.ContainsAny(s, ":/") }
	var l *lab.Lab
	if isLabName(from) || isLabName(to) {
		var err error
		if l, err = lab.Load(); err != nil {
			name := from
			if !isLabName(from) {
				name = to
			}
			return client.Endpoint{}, "", fmt.Errorf("%q looks like a lab host name, but: %w", name, err)
		}
	}
	if isLabName(to) {
		h, err := l.Host(to)
		if err != nil {
			return client.Endpoint{}, "", err
		}
		to = h.Name + "@" + h.AgentAddr // the destination must prove it is h
	}
	switch network, _ := transport.SplitAddr(from); {
	case isLabName(from):
		h, err := l.Host(from)
		if err != nil {
			return client.Endpoint{}, "", err
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
func (a agentFlags) operatorTLS(from string) (*transport.Security, error) {
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
	sec, err := transport.LoadOperator(dir, name)
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

package main

import (
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/pki"
)

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make the certificates agents use to authenticate each other",
		Long: `certs runs a small certificate authority for ferry hosts. Agents talk to
each other over mutual TLS 1.3: each presents a certificate signed by the CA,
and a host is known by its certificate's name (its CommonName).

Files (keys and certificates 0600, directories 0700):
  DIR/ca.crt, DIR/ca.key        the CA; ca.key never needs to leave DIR
  DIR/NAME/NAME.crt, NAME.key   host NAME's certificate and key
  DIR/NAME/ca.crt               a copy of the CA certificate

Copy DIR/NAME/ to host NAME and point its agent at that directory. Keep
DIR/ca.key somewhere safe: whoever holds it can mint hosts.

An operator's certificate (certs operator) lets a person's CLI ask agents
from another machine (ferry ps --from NAME@ADDR --tls-dir DIR/PERSON). It
serves only as a client and no agent accepts it as a host.`,
		Example: `  ferry certs init --dir /etc/ferry/ca
  ferry certs issue --dir /etc/ferry/ca --host h1 --ip 10.0.0.1
  ferry certs issue --dir /etc/ferry/ca --host h2 --ip 10.0.0.2 --dns h2.example.com
  scp -rp /etc/ferry/ca/h2 root@10.0.0.2:/etc/ferry/tls
  ferry certs operator --dir /etc/ferry/ca --name alice`,
	}
	cmd.AddCommand(newCertsInitCmd(), newCertsIssueCmd(), newCertsOperatorCmd())
	return cmd
}

func newCertsInitCmd() *cobra.Command {
	var dir, name string
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a certificate authority for ferry hosts",
		Long: `init creates a CA in --dir: ca.crt and ca.key (ECDSA P-256, valid ten
years). It refuses to overwrite an existing CA, since every host certificate
it signed depends on it.`,
		Example: `  ferry certs init --dir /etc/ferry/ca
  ferry certs init --dir ./ca --name "ferry CA, lab"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := pki.NewCA(dir, name); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CA %q created in %s\nnext: ferry certs issue --dir %s --host NAME --ip ADDRESS\n", name, dir, dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the CA (created 0700)")
	cmd.Flags().StringVar(&name, "name", "ferry CA", "the CA's name in its certificate")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

func newCertsIssueCmd() *cobra.Command {
	var (
		dir, host string
		ips       []net.IP
		dnsNames  []string
		validFor  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue a host certificate signed by the CA",
		Long: `issue signs a certificate for host --host with the CA in --dir and writes
it with its key and a copy of the CA certificate into DIR/HOST/. The
certificate serves both when the host receives a migration and when it sends
one. Its name is HOST; --ip and --dns add the host's addresses as subject
alternative names (for other TLS tools; ferry checks the name).

It refuses to overwrite an existing certificate: remove DIR/HOST/HOST.crt and
HOST.key first to issue a new one.`,
		Example: `  ferry certs issue --dir /etc/ferry/ca --host h1 --ip 10.0.0.1
  ferry certs issue --dir /etc/ferry/ca --host h2 --ip 10.0.0.2 --ip fd00::2 --dns h2.example.com
  ferry certs issue --dir /etc/ferry/ca --host h3 --valid-for 720h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := filepath.Join(dir, host)
			if err := pki.ValidHost(host); err != nil {
				return fmt.Errorf("--host: %w", err)
			}
			if err := pki.Issue(dir, out, host, ips, dnsNames, validFor); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "certificate for %s written to %s (valid for %s)\ncopy %s to host %s; it holds no CA key\n",
				host, out, validFor, out, host)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the CA's directory (from 'ferry certs init')")
	f.StringVar(&host, "host", "", "the host's name, as its agent calls itself (--name)")
	f.IPSliceVar(&ips, "ip", nil, "an IP address of the host (repeatable)")
	f.StringSliceVar(&dnsNames, "dns", nil, "a DNS name of the host (repeatable)")
	f.DurationVar(&validFor, "valid-for", 365*24*time.Hour, "how long the certificate is valid (never beyond the CA)")
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagRequired("host")
	return cmd
}

func newCertsOperatorCmd() *cobra.Command {
	var (
		dir, name string
		validFor  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Issue an operator's certificate, to run the CLI away from the source host",
		Long: `operator signs a certificate for a person (or a script) named --name with the
CA in --dir and writes it with its key and a copy of the CA certificate into
DIR/NAME/. With it, the CLI asks an agent over the network instead of its
control socket: --from NAME@ADDR names the agent's listen address (and the
host it must prove to be), --tls-dir the directory with this certificate.

Every agent that trusts the CA lets an operator do what its control socket
allows: migrate, drain, list, wait and cancel. The certificate is good for
client authentication only: no agent takes it for a host, and it cannot
stand in for one. Keep it as you would root's password on those hosts, and
give it a short --valid-for.`,
		Example: `  ferry certs operator --dir /etc/ferry/ca --name alice --valid-for 720h
  scp -rp /etc/ferry/ca/alice laptop:.ferry/alice
  ferry ps --from node1@192.0.2.1:7070 --tls-dir ~/.ferry/alice      # on the laptop`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := pki.ValidHost(name); err != nil {
				return fmt.Errorf("--name: %w", err)
			}
			out := filepath.Join(dir, name)
			if err := pki.IssueOperator(dir, out, name, validFor); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "operator certificate for %s written to %s (valid for %s)\nuse it with: ferry ps --from HOST@ADDR:PORT --tls-dir %s\n",
				name, out, validFor, out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the CA's directory (from 'ferry certs init')")
	f.StringVar(&name, "name", "", "the operator's name, as agents log it")
	f.DurationVar(&validFor, "valid-for", 30*24*time.Hour, "how long the certificate is valid (never beyond the CA)")
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

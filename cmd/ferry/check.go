package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/api/client"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/preflight"
	"github.com/ferry-migrate/ferry/internal/transport"
)

func newCheckCmd() *cobra.Command {
	var (
		asJSON   bool
		stateDir string
		peer     agentFlags
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check that this host can migrate containers",
		Long: `check inspects this host: CRIU (path, version, 'criu check', and which of
ferry's CRIU patches it carries, with what each technique loses without
the missing ones), the kernel features that decide which techniques work
(dirty-page tracking for CRIU pre-dump, userfaultfd and pipe size for
post-copy, TCP repair, MPTCP), the container runtimes installed, the
cgroup layout and privileges.

ferry uses the CRIU at /usr/libexec/ferry/criu (the ferry-criu package),
else /usr/local/sbin/criu (make setup), else criu from PATH; $FERRY_CRIU
names another.

With --peer it also asks another host's agent for its ferry, protocol and
CRIU versions, and says whether the two can migrate to each other (an
older ferry on either side is named, with what to upgrade).

Where the host's agent kept migrations to learn from (under --state), it
also says whether its model drifts: a term whose recent predictions are
off by more than 25 % (ferry calibrate --status for the whole picture).

It exits 0 when a cold migration is possible here (and with --peer, when
the peer's agent answers in this ferry's protocol), 1 otherwise, and names
each problem with its fix.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := preflight.Run(cmd.Context())
			mc := checkModel(stateDir)
			var pc *peerCheck
			if peer.from != "" {
				pc = checkPeer(cmd.Context(), peer, r)
			}
			if asJSON {
				if err := cli.PrintJSON(struct {
					preflight.Report
					Ferry    string      `json:"ferry"`
					Protocol int         `json:"protocol"`
					Model    *modelCheck `json:"model,omitempty"`
					Peer     *peerCheck  `json:"peer,omitempty"`
				}{r, version, transport.ProtocolVersion, mc, pc}); err != nil {
					return err
				}
			} else {
				fmt.Print(r.Text())
				if mc != nil {
					fmt.Print(mc.text())
				}
				if pc != nil {
					pc.text(os.Stdout, r)
				}
			}
			if !r.OK || (pc != nil && !pc.OK) {
				return cli.ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().StringVar(&stateDir, "state", "/var/lib/ferry", "the agent's state directory, whose model history says whether its profile drifts from what its migrations measure")
	cmd.Flags().StringVar(&peer.from, "peer", "", "another host's agent to compare versions with: its control socket, a lab host name, or NAME@ADDR with an operator's certificate (--tls-dir)")
	cmd.Flags().StringVar(&peer.tlsDir, "tls-dir", "", "with --peer NAME@ADDR: directory holding the operator's certificate and the CA (default $FERRY_TLS_DIR)")
	cmd.Flags().StringVar(&peer.operator, "operator", "", "with --peer NAME@ADDR: the operator certificate's name (default $FERRY_OPERATOR)")
	return cmd
}

// peerCheck is what ferry check --peer learned of the other host.
type peerCheck struct {
	// OK: the peer's agent answered in this ferry's protocol.
	OK     bool        `json:"ok"`
	Host   string      `json:"host,omitempty"`
	Status *api.Status `json:"status,omitempty"`
	Error  string      `json:"error,omitempty"`
	// To and From say why a migration to or from the peer would be
	// refused for its CRIU or this one's ("" : it would not).
	To   string `json:"to,omitempty"`
	From string `json:"from,omitempty"`
}

// checkPeer asks the peer's agent for its status: its versions. A peer of
// another protocol fails the handshake, whose error names the side to
// upgrade.
func checkPeer(ctx context.Context, peer agentFlags, r preflight.Report) *peerCheck {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pc := &peerCheck{Host: peer.from}
	ep, _, err := peer.endpoints("")
	if err == nil {
		var st api.Status
		if st, err = client.Status(ctx, ep); err == nil {
			pc.OK, pc.Status, pc.Host = true, &st, st.Host
		}
	}
	if err != nil {
		pc.Error = err.Error()
		return pc
	}
	if c := pc.Status.CRIU; c != nil && r.CriuVersion != "" {
		theirs := criu.Patches(c.Patches)
		if m := criu.Unreadable(r.CriuPatches, theirs); len(m) > 0 {
			pc.To = fmt.Sprintf("refused: %s's CRIU lacks %s to restore what this host's dumps", pc.Host, criu.IDs(m))
		}
		if m := criu.Unreadable(theirs, r.CriuPatches); len(m) > 0 {
			pc.From = fmt.Sprintf("refused: this host's CRIU lacks %s to restore what %s's dumps", criu.IDs(m), pc.Host)
		}
	}
	return pc
}

func (pc *peerCheck) text(w io.Writer, r preflight.Report) {
	fmt.Fprintf(w, "\nVersions:\n")
	criuOf := func(path, v string, p criu.Patches) string {
		if v == "" {
			return "CRIU unknown"
		}
		return fmt.Sprintf("CRIU %s %s (ferry patches: %s)", path, v, p)
	}
	fmt.Fprintf(w, "  %-16s ferry %s, protocol %d, %s\n", "this host", version, transport.ProtocolVersion, criuOf(r.CriuPath, r.CriuVersion, r.CriuPatches))
	if !pc.OK {
		fmt.Fprintf(w, "  ✗ %-14s %s\n", pc.Host, pc.Error)
		return
	}
	st := pc.Status
	if st.Protocol == 0 {
		fmt.Fprintf(w, "  %-16s an older ferry that does not tell its versions: upgrade ferry on %s\n", st.Host, st.Host)
		return
	}
	c := "CRIU unknown"
	if st.CRIU != nil {
		c = criuOf(st.CRIU.Path, st.CRIU.Version, st.CRIU.Patches)
	}
	fmt.Fprintf(w, "  %-16s ferry %s, protocol %d, %s\n", st.Host, st.Ferry, st.Protocol, c)
	if pc.To != "" {
		fmt.Fprintf(w, "  ! to %-11s %s (install ferry-criu or run `make setup` there)\n", st.Host, pc.To)
	}
	if pc.From != "" {
		fmt.Fprintf(w, "  ! from %-9s %s (install ferry-criu or run `make setup` here)\n", st.Host, pc.From)
	}
}

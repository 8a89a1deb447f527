package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/probe"
)

// newLabToolCmd holds the small programs the lab runs inside its hosts'
// network namespaces on ferry's behalf (a probe client, a file copy). They
// talk to their parent over stdin and stdout and are not meant for users.
func newLabToolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "lab-tool", Hidden: true, Short: "helpers the lab runs inside its hosts"}
	cmd.AddCommand(newProbeToolCmd(), newRecvToolCmd(), newSendToolCmd())
	return cmd
}

// probe: wait until the workload is ready (print its stat), poll until stdin
// closes, then print the result.
func newProbeToolCmd() *cobra.Command {
	var (
		addrs    []string
		interval time.Duration
		ready    time.Duration
	)
	cmd := &cobra.Command{
		Use: "probe",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			st, err := probe.WaitReady(ctx, addrs, ready)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(os.Stdout)
			p := probe.Start(addrs, interval)
			_ = enc.Encode(st)
			_, _ = io.Copy(io.Discard, os.Stdin)
			return enc.Encode(p.Stop(ctx))
		},
	}
	cmd.Flags().StringSliceVar(&addrs, "addr", nil, "workload address (repeat for each host it may be on)")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Millisecond, "poll interval")
	cmd.Flags().DurationVar(&ready, "wait-ready", 2*time.Minute, "how long to wait for the workload to be ready")
	return cmd
}

func newRecvToolCmd() *cobra.Command {
	var (
		listen, out string
		mptcp       bool
	)
	cmd := &cobra.Command{
		Use: "recv",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lc net.ListenConfig
			lc.SetMultipathTCP(mptcp)
			l, err := lc.Listen(cmd.Context(), "tcp", listen)
			if err != nil {
				return err
			}
			defer l.Close()
			fmt.Println("listening")
			conn, err := l.Accept()
			if err != nil {
				return err
			}
			defer conn.Close()
			f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, conn); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "address to receive on")
	cmd.Flags().StringVar(&out, "out", "", "file to write")
	cmd.Flags().BoolVar(&mptcp, "mptcp", false, "accept MPTCP")
	return cmd
}

func newSendToolCmd() *cobra.Command {
	var (
		to, in string
		limit  int64
		mptcp  bool
	)
	cmd := &cobra.Command{
		Use: "send",
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := os.Open(in)
			if err != nil {
				return err
			}
			defer f.Close()
			d := net.Dialer{Timeout: 5 * time.Second}
			d.SetMultipathTCP(mptcp)
			conn, err := d.DialContext(cmd.Context(), "tcp", to)
			if err != nil {
				return err
			}
			defer conn.Close()
			var src io.Reader = f
			if limit > 0 {
				src = io.LimitReader(f, limit)
			}
			start := time.Now()
			n, err := io.Copy(conn, src)
			if err != nil {
				return err
			}
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				return err
			}
			// The receiver closes once it has everything: time the delivery,
			// not the handing over to the socket buffer.
			_, _ = io.Copy(io.Discard, conn)
			fmt.Printf("%d %f\n", n, time.Since(start).Seconds())
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "receiver address")
	cmd.Flags().StringVar(&in, "in", "", "file to send")
	cmd.Flags().Int64Var(&limit, "bytes", 0, "send at most this many bytes")
	cmd.Flags().BoolVar(&mptcp, "mptcp", false, "connect with MPTCP")
	return cmd
}

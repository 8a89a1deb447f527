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
	var listen, out string
	cmd := &cobra.Command{
		Use: "recv",
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := net.Listen("tcp", listen)
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
	return cmd
}

func newSendToolCmd() *cobra.Command {
	var to, in string
	cmd := &cobra.Command{
		Use: "send",
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := os.Open(in)
			if err != nil {
				return err
			}
			defer f.Close()
			conn, err := net.DialTimeout("tcp", to, 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			if _, err := io.Copy(conn, f); err != nil {
				return err
			}
			return conn.(*net.TCPConn).CloseWrite()
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "receiver address")
	cmd.Flags().StringVar(&in, "in", "", "file to send")
	return cmd
}

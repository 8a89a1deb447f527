package main

import (
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/labtool"
)

// newLabToolCmd holds the small programs the lab runs inside its hosts'
// network namespaces on ferry's behalf (package labtool). They talk to
// their parent over stdin and stdout and are not meant for users.
func newLabToolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "lab-tool", Hidden: true, Short: "helpers the lab runs inside its hosts"}
	cmd.AddCommand(newProbeToolCmd(), newRecvToolCmd(), newSendToolCmd(), newStreamToolCmd(), newRedisToolCmd())
	return cmd
}

func newProbeToolCmd() *cobra.Command {
	var (
		addrs           []string
		interval, ready time.Duration
	)
	cmd := &cobra.Command{
		Use: "probe",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return labtool.Probe(cmd.Context(), addrs, interval, ready, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringSliceVar(&addrs, "addr", nil, "workload address (repeat for each host it may be on)")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Millisecond, "poll interval")
	cmd.Flags().DurationVar(&ready, "wait-ready", 2*time.Minute, "how long to wait for the workload to be ready")
	return cmd
}

func newRecvToolCmd() *cobra.Command {
	var (
		listen  []string
		out     string
		mptcp   bool
		streams int
	)
	cmd := &cobra.Command{
		Use: "recv",
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			if err := labtool.Recv(cmd.Context(), listen, mptcp, streams, os.Stdout, f); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		},
	}
	cmd.Flags().StringSliceVar(&listen, "listen", nil, "address to receive on (repeat for several)")
	cmd.Flags().StringVar(&out, "out", "", "file to write")
	cmd.Flags().BoolVar(&mptcp, "mptcp", false, "accept MPTCP")
	cmd.Flags().IntVar(&streams, "streams", 1, "accept this many TCP connections, striped into one stream (ferry's fallback without MPTCP)")
	return cmd
}

func newSendToolCmd() *cobra.Command {
	var (
		to      []string
		in      string
		limit   int64
		mptcp   bool
		streams int
	)
	cmd := &cobra.Command{
		Use: "send",
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := os.Open(in)
			if err != nil {
				return err
			}
			defer f.Close()
			var src io.Reader = f
			if limit > 0 {
				src = io.LimitReader(f, limit)
			}
			return labtool.Send(cmd.Context(), to, mptcp, streams, src, os.Stdout)
		},
	}
	cmd.Flags().StringSliceVar(&to, "to", nil, "receiver address (repeat for several: striped streams spread over them)")
	cmd.Flags().StringVar(&in, "in", "", "file to send")
	cmd.Flags().Int64Var(&limit, "bytes", 0, "send at most this many bytes")
	cmd.Flags().BoolVar(&mptcp, "mptcp", false, "connect with MPTCP")
	cmd.Flags().IntVar(&streams, "streams", 1, "stripe over this many TCP connections, round-robin over --to")
	return cmd
}

func newStreamToolCmd() *cobra.Command {
	var (
		addr     string
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use: "stream",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return labtool.Stream(cmd.Context(), addr, interval, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "echo server address")
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Millisecond, "one numbered line every interval")
	return cmd
}

func newRedisToolCmd() *cobra.Command {
	var (
		addr, key string
		interval  time.Duration
	)
	cmd := &cobra.Command{
		Use: "redis",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return labtool.Redis(cmd.Context(), addr, key, interval, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "Redis server address")
	cmd.Flags().StringVar(&key, "key", "ferry:counter", "counter key")
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Millisecond, "one INCR every interval")
	return cmd
}

package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/delayline"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/units"
)

// newLabToolCmd holds the small programs the lab runs inside its hosts'
// network namespaces on ferry's behalf (package labtool). They talk to
// their parent over stdin and stdout and are not meant for users.
func newLabToolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "lab-tool", Hidden: true, Short: "helpers the lab runs inside its hosts"}
	cmd.AddCommand(newProbeToolCmd(), newRecvToolCmd(), newSendToolCmd(), newStreamToolCmd(), newRedisToolCmd(),
		newLoadToolCmd(), newFillToolCmd(), newDelayLineToolCmd())
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

func newLoadToolCmd() *cobra.Command {
	var o labtool.LoadOptions
	cmd := &cobra.Command{
		Use:   "load --service S --addr A [--rate N] [--conns N] [--bucket 100ms] [--tool]",
		Short: "drive a real service and time what its clients feel while it moves",
		Long: `Load drives a real service as its clients would, at --rate requests per
second in total over --conns kept connections, while the server's
container is migrated. It prints "connected" once its connections are up,
sends until its stdin closes, checks the service's state, then prints one
JSON line (labtool.LoadResult).

A frozen server shows as a stall, not an error: a request waits up to a
minute for its answer. longest_stall_ms is the longest any one connection
waited with a request outstanding and no answer (for a request-response
client, its slowest request); timeline has one bucket per --bucket, by
send time, with ops, errors and p50/p99/max latency. A lost connection
counts an error, is dialed again (reconnects) and the load goes on.

Services, what a request is, and what the state check demands:
  redis      SET w:<run>:<i> on the first connection, GET of the newest
             acknowledged key on the others: every acknowledged write
             present with its value, every read found it, the fill intact.
  memcached  the same with set and get: every acknowledged set present;
             evictions are reported (start memcached with -m above the
             fill and the load).
  mqtt       (or mosquitto) one QoS 1 publisher per connection and one
             QoS 1 subscriber, persistent sessions, on load/<run>; the
             latency is publish to delivery: every message the broker
             acknowledged delivered exactly once (lost, duplicated).
  postgres   (or postgresql) one INSERT per transaction into ferry_load on
             every connection: the run's row count and a checksum the
             server computes equal what was acknowledged.
             --addr: a URL (postgres://user:pass@host:port/db?sslmode=
             disable), key=value settings, or host:port (user and
             database postgres, no TLS).

--tool also runs the service's own benchmark beside the client, at half
its rate, its summary in the result's "tool": redis-benchmark (a round a
second), pgbench (-R, after pgbench -i -s 1), mosquitto_pub (-q 1).

Example:
  ferry-lab lab-tool fill --service redis --addr 10.0.0.2:6379 --bytes 64M
  ferry-lab lab-tool load --service redis --addr 10.0.0.2:6379 --rate 500 --conns 2
  (close its stdin after the migration)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Service == "" || o.Addr == "" {
				return fmt.Errorf("--service (one of %s) and --addr are required", strings.Join(labtool.LoadServices(), ", "))
			}
			return labtool.Load(cmd.Context(), o, os.Stdin, os.Stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Service, "service", "", "redis, memcached, mqtt (mosquitto) or postgres (postgresql)")
	f.StringVar(&o.Addr, "addr", "", "the server: host:port (postgres: also a URL or key=value settings)")
	f.Float64Var(&o.Rate, "rate", 100, "requests per second, in total over the connections")
	f.IntVar(&o.Conns, "conns", 1, "connections to keep (redis, memcached: the first writes, the others read; mqtt: publishers)")
	f.DurationVar(&o.Bucket, "bucket", 100*time.Millisecond, "width of a timeline bucket")
	f.BoolVar(&o.Tool, "tool", false, "also run the service's benchmark tool beside the client (not memcached)")
	f.StringVar(&o.Run, "run", "", "name of this run's keys, rows and topics (default: random)")
	return cmd
}

func newFillToolCmd() *cobra.Command {
	var (
		service, addr, size string
		check               bool
	)
	cmd := &cobra.Command{
		Use:   "fill --service S --addr A --bytes SIZE",
		Short: "preload a service with state a migration must carry intact",
		Long: `Fill writes about --bytes of state into a service, every value derived
from its key alone, so that a migration moves real state and a check can
tell whether it arrived whole:
  redis, memcached  keys fill:<n> with 4 KiB values
  postgres          rows of about 1 KiB in table ferry_fill
  mqtt              retained QoS 1 messages of 4 KiB on topics fill/<n>
It also records how much it wrote (key fill:count, table ferry_fill_meta,
retained topic fill/count). "ferry-lab lab-tool load" reads all of it back at
its end (every item, not a sample); so does fill --check, alone.

Example:
  ferry-lab lab-tool fill --service postgres --addr postgres://postgres@10.0.0.2:5432/postgres --bytes 256M`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if service == "" || addr == "" {
				return fmt.Errorf("--service (one of %s) and --addr are required", strings.Join(labtool.LoadServices(), ", "))
			}
			if check {
				ok, summary, err := labtool.CheckFill(cmd.Context(), service, addr)
				if err != nil {
					return err
				}
				fmt.Println(summary)
				if !ok {
					return fmt.Errorf("the fill is damaged")
				}
				return nil
			}
			n, err := units.ParseBytes(size)
			if err != nil {
				return fmt.Errorf("--bytes: %w", err)
			}
			return labtool.Fill(cmd.Context(), service, addr, n)
		},
	}
	f := cmd.Flags()
	f.StringVar(&service, "service", "", "redis, memcached, mqtt (mosquitto) or postgres (postgresql)")
	f.StringVar(&addr, "addr", "", "the server: host:port (postgres: also a URL or key=value settings)")
	f.StringVar(&size, "bytes", "64M", "how much state: 64M, 1GiB, 4096")
	f.BoolVar(&check, "check", false, "only read back what a fill wrote and say whether it is intact")
	return cmd
}

// newDelayLineToolCmd is the relay that gives a lab host's link its round
// trip (package delayline), run in the switch's namespace.
func newDelayLineToolCmd() *cobra.Command {
	var (
		c       delayline.Config
		pairs   []string
		control string
	)
	cmd := &cobra.Command{
		Use:  "delay-line",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, p := range pairs {
				a, b, ok := strings.Cut(p, ":")
				if !ok || a == "" || b == "" {
					return fmt.Errorf("--pair %q: want A:B, two interfaces", p)
				}
				c.Pairs = append(c.Pairs, delayline.Pair{A: a, B: b})
			}
			return delayline.Main(cmd.Context(), c, control)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&pairs, "pair", nil, "interfaces A:B to join (repeat for several links)")
	f.DurationVar(&c.RTT, "rtt", 0, "round trip to add, half each way")
	f.StringVar(&control, "control", "", "unix socket to take commands on (rtt [DURATION], stats)")
	f.StringVar(&c.NetNS, "netns", "", "network namespace (path) of the interfaces; default this process's")
	f.IntVar(&c.MaxFrames, "max-frames", delayline.DefaultMaxFrames, "frames each direction holds at most")
	f.IntVar(&c.MaxBytes, "max-bytes", delayline.DefaultMaxBytes, "bytes each direction holds at most")
	_ = cmd.MarkFlagRequired("pair")
	return cmd
}

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/probe"
)

// newLabToolCmd holds the small programs the lab runs inside its hosts'
// network namespaces on ferry's behalf (a probe client, a file copy). They
// talk to their parent over stdin and stdout and are not meant for users.
func newLabToolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "lab-tool", Hidden: true, Short: "helpers the lab runs inside its hosts"}
	cmd.AddCommand(newProbeToolCmd(), newRecvToolCmd(), newSendToolCmd(), newStreamToolCmd(), newRedisToolCmd())
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

// streamResult is what `lab-tool stream` prints when its stdin closes.
type streamResult struct {
	Sent     int     `json:"sent"`
	Received int     `json:"received"`
	MaxGapMs float64 `json:"max_gap_ms"`
	OK       bool    `json:"ok"`
	Error    string  `json:"error,omitempty"`
}

// stream keeps one TCP connection to an echo server and numbers a line
// every interval: every answer must be the next number, on the same
// connection, until stdin closes. A migration that kept the connection
// shows as a gap; one that lost it, as an error.
func newStreamToolCmd() *cobra.Command {
	var (
		addr     string
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use: "stream",
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			fmt.Println("connected")
			var res streamResult
			stop := make(chan struct{})
			go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
			sent := make(chan int, 1<<16)
			go func() {
				t := time.NewTicker(interval)
				defer t.Stop()
				for i := 1; i < 1<<16; i++ {
					select {
					case <-stop:
						close(sent)
						return
					case <-t.C:
					}
					if _, err := fmt.Fprintf(conn, "%d\n", i); err != nil {
						close(sent)
						return
					}
					sent <- i
				}
				close(sent)
			}()
			sc := bufio.NewScanner(conn)
			last := time.Now()
			for want := range sent {
				res.Sent = want
				_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
				if !sc.Scan() {
					res.Error = fmt.Sprintf("connection lost after %d answers: %v", res.Received, sc.Err())
					break
				}
				if got := sc.Text(); got != fmt.Sprint(want) {
					res.Error = fmt.Sprintf("answer %q where %d was due", got, want)
					break
				}
				res.Received++
				now := time.Now()
				res.MaxGapMs = max(res.MaxGapMs, float64(now.Sub(last).Microseconds())/1000)
				last = now
			}
			res.OK = res.Error == "" && res.Received == res.Sent && res.Received > 0
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "echo server address")
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Millisecond, "one numbered line every interval")
	return cmd
}

// newRedisToolCmd keeps one connection to a Redis server and sends INCR
// every interval until stdin closes: each reply must be one more than the
// last (nothing lost, nothing doubled) and the connection must stay the
// same one. It prints a streamResult.
func newRedisToolCmd() *cobra.Command {
	var (
		addr, key string
		interval  time.Duration
	)
	cmd := &cobra.Command{
		Use: "redis",
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			fmt.Println("connected")
			stop := make(chan struct{})
			go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
			rd := bufio.NewReader(conn)
			req := fmt.Sprintf("*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n", len(key), key)
			var res streamResult
			var prev int64
			last := time.Now()
			t := time.NewTicker(interval)
			defer t.Stop()
		loop:
			for res.Sent < 1<<20 {
				select {
				case <-stop:
					break loop
				case <-t.C:
				}
				_ = conn.SetDeadline(time.Now().Add(time.Minute))
				if _, err := io.WriteString(conn, req); err != nil {
					res.Error = fmt.Sprintf("send: %v", err)
					break
				}
				res.Sent++
				line, err := rd.ReadString('\n')
				if err != nil {
					res.Error = fmt.Sprintf("connection lost after %d replies: %v", res.Received, err)
					break
				}
				var n int64
				if _, err := fmt.Sscanf(line, ":%d", &n); err != nil {
					res.Error = fmt.Sprintf("reply %q", strings.TrimSpace(line))
					break
				}
				if prev != 0 && n != prev+1 {
					res.Error = fmt.Sprintf("counter went from %d to %d", prev, n)
					break
				}
				prev = n
				res.Received++
				now := time.Now()
				res.MaxGapMs = max(res.MaxGapMs, float64(now.Sub(last).Microseconds())/1000)
				last = now
			}
			res.OK = res.Error == "" && res.Received == res.Sent && res.Received > 0
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "Redis server address")
	cmd.Flags().StringVar(&key, "key", "ferry:counter", "counter key")
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Millisecond, "one INCR every interval")
	return cmd
}

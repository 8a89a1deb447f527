package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/probe"
	"github.com/ferry-migrate/ferry/internal/transport/stripe"
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
		listen  []string
		out     string
		mptcp   bool
		streams int
	)
	cmd := &cobra.Command{
		Use: "recv",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ls []net.Listener
			for _, a := range listen {
				var lc net.ListenConfig
				lc.SetMultipathTCP(mptcp)
				l, err := lc.Listen(cmd.Context(), "tcp", a)
				if err != nil {
					return err
				}
				defer l.Close()
				ls = append(ls, l)
			}
			fmt.Println("listening")
			conn, err := acceptStreams(ls, streams)
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
	cmd.Flags().StringSliceVar(&listen, "listen", nil, "address to receive on (repeat for several)")
	cmd.Flags().StringVar(&out, "out", "", "file to write")
	cmd.Flags().BoolVar(&mptcp, "mptcp", false, "accept MPTCP")
	cmd.Flags().IntVar(&streams, "streams", 1, "accept this many TCP connections, striped into one stream (ferry's fallback without MPTCP)")
	return cmd
}

// acceptStreams accepts one connection from ls[0], or, for n > 1, n
// connections from any of ls, striped into one.
func acceptStreams(ls []net.Listener, n int) (net.Conn, error) {
	if n <= 1 {
		return ls[0].Accept()
	}
	conns := make(chan net.Conn, n)
	errs := make(chan error, len(ls))
	for _, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					errs <- err
					return
				}
				conns <- c
			}
		}()
	}
	sc := stripe.New(stripe.Options{})
	for range n {
		select {
		case c := <-conns:
			if err := sc.Add(c); err != nil {
				return nil, err
			}
		case err := <-errs:
			sc.Close()
			return nil, err
		}
	}
	return sc, nil
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
			dial := func(ctx context.Context, addr string) (net.Conn, error) {
				d := net.Dialer{Timeout: 5 * time.Second}
				d.SetMultipathTCP(mptcp)
				return d.DialContext(ctx, "tcp", addr)
			}
			var src io.Reader = f
			if limit > 0 {
				src = io.LimitReader(f, limit)
			}
			if streams > 1 {
				return sendStriped(cmd.Context(), dial, to, streams, src)
			}
			conn, err := dial(cmd.Context(), to[0])
			if err != nil {
				return err
			}
			defer conn.Close()
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
	cmd.Flags().StringSliceVar(&to, "to", nil, "receiver address (repeat for several: striped streams spread over them)")
	cmd.Flags().StringVar(&in, "in", "", "file to send")
	cmd.Flags().Int64Var(&limit, "bytes", 0, "send at most this many bytes")
	cmd.Flags().BoolVar(&mptcp, "mptcp", false, "connect with MPTCP")
	cmd.Flags().IntVar(&streams, "streams", 1, "stripe over this many TCP connections, round-robin over --to")
	return cmd
}

// sendStriped sends src over n striped connections and prints the bytes
// and the seconds until the receiver had them all.
func sendStriped(ctx context.Context, dial func(context.Context, string) (net.Conn, error), to []string, n int, src io.Reader) error {
	sc := stripe.New(stripe.Options{})
	for i := range n {
		c, err := dial(ctx, to[i%len(to)])
		if err != nil {
			sc.Close()
			return err
		}
		if err := sc.Add(c); err != nil {
			return err
		}
	}
	start := time.Now()
	written, err := io.Copy(sc, src)
	if err != nil {
		sc.Close()
		return err
	}
	// Close delivers what is left, then Done closes; Err is nil once the
	// receiver has read everything.
	sc.Close()
	<-sc.Done()
	if err := sc.Err(); err != nil {
		return err
	}
	fmt.Printf("%d %f\n", written, time.Since(start).Seconds())
	return nil
}

// streamResult is what `lab-tool stream` prints when its stdin closes.
type streamResult struct {
	Sent     int     `json:"sent"`
	Received int     `json:"received"`
	MaxGapMs float64 `json:"max_gap_ms"`
	OK       bool    `json:"ok"`
	Error    string  `json:"error,omitempty"`
}

// exchangeLoop holds one TCP connection to addr and runs one exchange per
// interval on it until stdin closes: the shared body of the lab's
// connection-keeping clients. A migration that kept the connection shows as
// a gap between answers; one that lost it, as an error.
func exchangeLoop(addr string, interval time.Duration, exchange func(rd *bufio.Reader, w io.Writer, i int) error) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Println("connected")
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	rd := bufio.NewReader(conn)
	var res streamResult
	last := time.Now()
	t := time.NewTicker(interval)
	defer t.Stop()
loop:
	for i := 1; i < 1<<20; i++ {
		select {
		case <-stop:
			break loop
		case <-t.C:
		}
		_ = conn.SetDeadline(time.Now().Add(time.Minute))
		res.Sent++
		if err := exchange(rd, conn, i); err != nil {
			res.Error = fmt.Sprintf("after %d answers: %v", res.Received, err)
			break
		}
		res.Received++
		now := time.Now()
		res.MaxGapMs = max(res.MaxGapMs, float64(now.Sub(last).Microseconds())/1000)
		last = now
	}
	res.OK = res.Error == "" && res.Received == res.Sent && res.Received > 0
	return json.NewEncoder(os.Stdout).Encode(res)
}

// newStreamToolCmd numbers a line every interval to memhog's echo port:
// every answer must be the same number.
func newStreamToolCmd() *cobra.Command {
	var (
		addr     string
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use: "stream",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return exchangeLoop(addr, interval, func(rd *bufio.Reader, w io.Writer, i int) error {
				if _, err := fmt.Fprintf(w, "%d\n", i); err != nil {
					return err
				}
				line, err := rd.ReadString('\n')
				if err != nil {
					return fmt.Errorf("connection lost: %w", err)
				}
				if got := strings.TrimSpace(line); got != fmt.Sprint(i) {
					return fmt.Errorf("answer %q where %d was due", got, i)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "echo server address")
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Millisecond, "one numbered line every interval")
	return cmd
}

// newRedisToolCmd sends INCR every interval to a Redis server: each reply
// must be one more than the last (nothing lost, nothing doubled).
func newRedisToolCmd() *cobra.Command {
	var (
		addr, key string
		interval  time.Duration
	)
	cmd := &cobra.Command{
		Use: "redis",
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := fmt.Sprintf("*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n", len(key), key)
			var prev int64
			return exchangeLoop(addr, interval, func(rd *bufio.Reader, w io.Writer, _ int) error {
				if _, err := io.WriteString(w, req); err != nil {
					return err
				}
				line, err := rd.ReadString('\n')
				if err != nil {
					return fmt.Errorf("connection lost: %w", err)
				}
				var n int64
				if _, err := fmt.Sscanf(line, ":%d", &n); err != nil {
					return fmt.Errorf("reply %q", strings.TrimSpace(line))
				}
				if prev != 0 && n != prev+1 {
					return fmt.Errorf("counter went from %d to %d", prev, n)
				}
				prev = n
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "Redis server address")
	cmd.Flags().StringVar(&key, "key", "ferry:counter", "counter key")
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Millisecond, "one INCR every interval")
	return cmd
}

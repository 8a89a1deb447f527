// Package labtool holds the small programs the lab runs inside its hosts'
// network namespaces on ferry's behalf (`ferry-lab lab-tool ...`, hidden): the
// workload's probe, a file sent over one or several connections (to
// measure a link), and clients that hold one TCP connection to a service
// and time its answers across a migration. Each talks to its parent over
// stdin and stdout: the first line says it is ready; closing stdin stops
// it; the last line is its result.
package labtool

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ferry-migrate/ferry/internal/probe"
	"github.com/ferry-migrate/ferry/internal/transport/stripe"
)

// Probe waits until the workload at one of addrs is ready and prints its
// stat, polls it every interval until stdin closes, then prints the
// probe's result.
func Probe(ctx context.Context, addrs []string, interval, ready time.Duration, stdin io.Reader, stdout io.Writer) error {
	st, err := probe.WaitReady(ctx, addrs, ready)
	if err != nil {
		return err
	}
	// The round trip to the workload, so that a far one's answers are
	// waited for (the lab's delay lines).
	t0 := time.Now()
	if _, _, err := probe.QueryAny(ctx, addrs, probe.ReqStat, time.Second); err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	p := probe.StartFar(addrs, interval, time.Since(t0))
	_ = enc.Encode(st)
	_, _ = io.Copy(io.Discard, stdin)
	return enc.Encode(p.Stop(ctx))
}

// Recv listens on every address of listen, says "listening", takes one
// stream (one connection on the first address, or streams connections on
// any of them, striped into one) and copies it to out.
func Recv(ctx context.Context, listen []string, mptcp bool, streams int, stdout io.Writer, out io.Writer) error {
	if len(listen) == 0 {
		return fmt.Errorf("recv: no address to listen on")
	}
	var ls []net.Listener
	for _, a := range listen {
		var lc net.ListenConfig
		lc.SetMultipathTCP(mptcp)
		l, err := lc.Listen(ctx, "tcp", a)
		if err != nil {
			return err
		}
		defer l.Close()
		ls = append(ls, l)
	}
	fmt.Fprintln(stdout, "listening")
	conn, err := acceptStreams(ls, streams)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.Copy(out, conn); err != nil {
		return err
	}
	if sc, ok := conn.(*stripe.Conn); ok {
		// The sender's Close waits for our acknowledgment of its end, which
		// our path writers send in the background: stay until they have,
		// or the sender fails once this process exits.
		sc.Close()
		<-sc.Done()
		return sc.Err()
	}
	return nil
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

// Send sends src to the receiver at to (streams > 1: striped over that
// many connections, round-robin over to) and prints the bytes and the
// seconds until the receiver had them all.
func Send(ctx context.Context, to []string, mptcp bool, streams int, src io.Reader, stdout io.Writer) error {
	if len(to) == 0 {
		return fmt.Errorf("send: no receiver")
	}
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(mptcp)
		return d.DialContext(ctx, "tcp", addr)
	}
	if streams > 1 {
		return sendStriped(ctx, dial, to, streams, src, stdout)
	}
	conn, err := dial(ctx, to[0])
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
	// The receiver closes once it has everything: time the delivery, not
	// the handing over to the socket buffer.
	_, _ = io.Copy(io.Discard, conn)
	fmt.Fprintf(stdout, "%d %f\n", n, time.Since(start).Seconds())
	return nil
}

func sendStriped(ctx context.Context, dial func(context.Context, string) (net.Conn, error), to []string, n int, src io.Reader, stdout io.Writer) error {
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
	fmt.Fprintf(stdout, "%d %f\n", written, time.Since(start).Seconds())
	return nil
}

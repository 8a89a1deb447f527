package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// iperfPort is the port the one-off iperf3 server listens on.
const iperfPort = 5201

// MeasureLinkThroughput measures plain TCP throughput from one lab host to
// another over their (shaped) links with iperf3, in bits per second as
// received. The duration is rounded up to whole seconds.
func MeasureLinkThroughput(ctx context.Context, l *Lab, from, to string, dur time.Duration) (float64, error) {
	src, err := l.Host(from)
	if err != nil {
		return 0, err
	}
	dst, err := l.Host(to)
	if err != nil {
		return 0, err
	}
	if src.Index == dst.Index {
		return 0, fmt.Errorf("measure throughput between two different hosts, not %s and itself", src.Name)
	}
	secs := max(1, int(math.Ceil(dur.Seconds())))
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+20*time.Second)
	defer cancel()

	port := strconv.Itoa(iperfPort)
	var srvOut bytes.Buffer
	srv := dst.Command(ctx, "iperf3", "--server", "--one-off", "--bind", dst.Addr, "--port", port)
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("start iperf3 server on %s: %w", dst.Name, err)
	}
	srvDone := make(chan struct{})
	go func() { _ = srv.Wait(); close(srvDone) }()
	defer func() {
		select {
		case <-srvDone: // a one-off server ends after its test
		case <-time.After(2 * time.Second):
			_ = srv.Process.Kill()
			<-srvDone
		}
	}()
	if err := waitListening(ctx, srv.Process.Pid, iperfPort, srvDone); err != nil {
		_ = srv.Process.Kill()
		<-srvDone // srvOut is complete only after Wait
		return 0, fmt.Errorf("iperf3 server on %s: %w: %s", dst.Name, err, strings.TrimSpace(srvOut.String()))
	}

	cli := src.Command(ctx, "iperf3", "--client", dst.Addr, "--port", port, "--time", strconv.Itoa(secs), "--json")
	var stderr bytes.Buffer
	cli.Stderr = &stderr
	out, runErr := cli.Output()
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return 0, fmt.Errorf("iperf3 client on %s: %v, output not JSON (%v): %s", src.Name, runErr, err, strings.TrimSpace(stderr.String()))
	}
	if res.Error != "" || runErr != nil {
		return 0, fmt.Errorf("iperf3 client on %s: %v %s", src.Name, runErr, res.Error)
	}
	if res.End.SumReceived.BitsPerSecond <= 0 {
		return 0, errors.New("iperf3 reported no throughput")
	}
	return res.End.SumReceived.BitsPerSecond, nil
}

// waitListening waits until process pid has a TCP socket listening on
// port, read from /proc/PID/net/tcp, which shows the process's own network
// namespace. Probing with a connection instead would use up a one-off
// iperf3 server.
func waitListening(ctx context.Context, pid, port int, exited <-chan struct{}) error {
	want := fmt.Sprintf(":%04X ", port)
	for {
		for _, f := range []string{"tcp", "tcp6"} {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
			for _, line := range strings.Split(string(b), "\n") {
				fields := strings.Fields(line)
				// local_address is field 1, the state field 3; 0A is LISTEN.
				if len(fields) > 3 && strings.HasSuffix(fields[1]+" ", want) && fields[3] == "0A" {
					return nil
				}
			}
		}
		select {
		case <-exited:
			return errors.New("exited before listening")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

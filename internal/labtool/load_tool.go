package labtool

import (
	"bufio"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/units"
)

// A benchmark tool runs beside the observing client at half its rate, for
// the client's lifetime, as a second opinion from a program people know.

// benchTool is a running tool; stop ends it and returns its summary.
type benchTool struct {
	stop func() string
}

// toolRate is the tool's requests per second: modest beside the client.
func toolRate(o LoadOptions) float64 { return max(o.Rate/2, 1) }

// toolBinary finds a tool on PATH or at the distribution's place for it.
func toolBinary(name string, fallbacks ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, p := range fallbacks {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed", name)
}

// interrupt ends a tool as a user would, with ^C, then waits for it.
func interrupt(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// startRedisBenchmark runs redis-benchmark once a second (it has no rate
// of its own): SET and GET of 256-byte values on one connection, each
// round's requests spread over the second by nothing but the round's
// brevity. The summary is its own CSV figures, over the rounds.
func startRedisBenchmark(ctx context.Context, o LoadOptions) (*benchTool, error) {
	bin, err := toolBinary("redis-benchmark")
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, err
	}
	perTest := max(int(toolRate(o)/2), 1)
	args := []string{"-h", host, "-p", port, "-c", "1", "-n", strconv.Itoa(perTest), "-t", "set,get", "-d", "256", "--csv"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sum redisBenchSummary
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			start := time.Now()
			out, err := exec.CommandContext(ctx, bin, args...).Output()
			sum.add(out, err, time.Since(start))
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return &benchTool{stop: func() string {
		close(stop)
		wg.Wait()
		return fmt.Sprintf("redis-benchmark %s, once a second: %s", strings.Join(args, " "), sum.String())
	}}, nil
}

// redisBenchSummary gathers redis-benchmark's CSV rounds.
type redisBenchSummary struct {
	rounds, failed int
	maxLatencyMs   float64
	longestRound   time.Duration
	lastErr        string
}

func (s *redisBenchSummary) add(out []byte, err error, took time.Duration) {
	s.rounds++
	s.longestRound = max(s.longestRound, took)
	if err != nil {
		s.failed++
		s.lastErr = err.Error()
		return
	}
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(recs) < 2 {
		s.failed++
		s.lastErr = fmt.Sprintf("unreadable output %q", out)
		return
	}
	for _, r := range recs[1:] {
		if len(r) < 8 {
			continue
		}
		if v, err := strconv.ParseFloat(r[7], 64); err == nil {
			s.maxLatencyMs = max(s.maxLatencyMs, v)
		}
	}
}

func (s *redisBenchSummary) String() string {
	out := fmt.Sprintf("%d rounds, %d failed; longest round %.1f ms; max latency %.3f ms",
		s.rounds, s.failed, units.Millis(s.longestRound), s.maxLatencyMs)
	if s.lastErr != "" {
		out += "; last failure: " + s.lastErr
	}
	return out
}

// startPgbench initializes pgbench's tables (scale 1, about 15 MB more
// state) and runs its TPC-B-like transactions on one connection at a
// fixed rate (-R), reporting progress every second (-P 1): the summary is
// drawn from those lines, since an interrupted pgbench prints no other.
func startPgbench(ctx context.Context, o LoadOptions) (*benchTool, error) {
	bin, err := toolBinary("pgbench", "/usr/lib/postgresql/15/bin/pgbench")
	if err != nil {
		return nil, err
	}
	conninfo := o.Addr
	if !strings.Contains(conninfo, "://") && !strings.Contains(conninfo, "=") {
		conninfo = "postgres://postgres@" + conninfo + "/postgres?sslmode=disable"
	}
	if out, err := exec.CommandContext(ctx, bin, "-i", "-s", "1", "-q", conninfo).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgbench -i: %v: %s", err, lastLines(string(out), 3))
	}
	rate := strconv.FormatFloat(toolRate(o), 'f', -1, 64)
	cmd := exec.Command(bin, "-n", "-c", "1", "-R", rate, "-T", "86400", "-P", "1", conninfo)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var sum pgbenchSummary
	read := make(chan struct{})
	go func() { sum.read(stderr); close(read) }()
	return &benchTool{stop: func() string {
		interrupt(cmd)
		<-read
		return fmt.Sprintf("pgbench -n -c 1 -R %s -P 1 (TPC-B-like, scale 1): %s", rate, sum.String())
	}}, nil
}

// pgbenchSummary gathers pgbench's progress lines:
// "progress: 3.0 s, 50.0 tps, lat 1.234 ms stddev 0.5, 0 failed, lag 0.1 ms".
type pgbenchSummary struct {
	seconds, idle int
	txns, maxLat  float64
	failed        int
	other         []string
}

func (s *pgbenchSummary) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "progress:") {
			s.other = append(s.other, line)
			continue
		}
		s.seconds++
		var tps, lat float64
		for _, f := range strings.Split(strings.TrimPrefix(line, "progress:"), ",") {
			w := strings.Fields(f)
			switch {
			case len(w) >= 2 && w[1] == "tps":
				tps, _ = strconv.ParseFloat(w[0], 64)
			case len(w) >= 2 && w[0] == "lat":
				lat, _ = strconv.ParseFloat(w[1], 64)
			case len(w) >= 2 && w[1] == "failed":
				n, _ := strconv.Atoi(w[0])
				s.failed += n
			}
		}
		s.txns += tps
		s.maxLat = max(s.maxLat, lat)
		if tps == 0 {
			s.idle++
		}
	}
}

func (s *pgbenchSummary) String() string {
	out := fmt.Sprintf("%d progress seconds, about %.0f transactions, %d failed; %d seconds without one; worst second's mean latency %.3f ms",
		s.seconds, s.txns, s.failed, s.idle, s.maxLat)
	if len(s.other) > 0 {
		out += "; said: " + lastLines(strings.Join(s.other, "\n"), 3)
	}
	return out
}

// startMosquittoPub publishes one QoS 1 message every 1/rate seconds on
// one connection (--repeat, --repeat-delay) with a persistent session,
// and times its PUBACKs from its debug output (-d), as the client times
// its answers.
func startMosquittoPub(_ context.Context, o LoadOptions) (*benchTool, error) {
	bin, err := toolBinary("mosquitto_pub")
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, err
	}
	delay := strconv.FormatFloat(1/toolRate(o), 'f', 3, 64)
	topic := "load/" + o.Run + "/tool"
	args := []string{bin, "-h", host, "-p", port, "-i", "ferry-" + o.Run + "-tool", "-c", "-q", "1",
		"-t", topic, "-m", string(value(topic, mqttPayloadSize)),
		"--repeat", "2000000000", "--repeat-delay", delay, "-d"}
	// Its stdout is a pipe, which stdio buffers: without a line at a
	// time, the lines would come in bursts and their times mean nothing.
	timed := false
	if stdbuf, err := exec.LookPath("stdbuf"); err == nil {
		args, timed = append([]string{stdbuf, "-oL"}, args...), true
	}
	cmd := exec.Command(args[0], args[1:]...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sum := mosquittoPubSummary{timed: timed}
	read := make(chan struct{})
	go func() { sum.read(stdout); close(read) }()
	return &benchTool{stop: func() string {
		interrupt(cmd)
		<-read
		return fmt.Sprintf("mosquitto_pub -q 1 -c --repeat-delay %s -d: %s", delay, sum.String())
	}}, nil
}

// mosquittoPubSummary reads mosquitto_pub's debug lines ("Client ...
// sending PUBLISH ...", "Client ... received PUBACK ...",
// "Client ... sending CONNECT") as they come.
type mosquittoPubSummary struct {
	published, acked, connects int
	clock                      stallClock
	timed                      bool // lines came as written (stdbuf)
	other                      []string
}

func (s *mosquittoPubSummary) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, now := sc.Text(), time.Now()
		switch {
		case strings.Contains(line, "sending PUBLISH"):
			s.published++
			s.clock.sent(now)
		case strings.Contains(line, "received PUBACK"):
			s.acked++
			s.clock.answered(now)
		case strings.Contains(line, "sending CONNECT"):
			s.connects++
		case strings.Contains(line, "sending PINGREQ"), strings.Contains(line, "received PINGRESP"),
			strings.Contains(line, "received CONNACK"), strings.Contains(line, "sending DISCONNECT"):
		default:
			s.other = append(s.other, line)
		}
	}
}

func (s *mosquittoPubSummary) String() string {
	out := fmt.Sprintf("%d published, %d acknowledged, %d connections", s.published, s.acked, s.connects)
	if s.timed {
		out += fmt.Sprintf("; longest wait for a PUBACK %.1f ms", units.Millis(s.clock.longest))
	}
	if len(s.other) > 0 {
		out += "; said: " + lastLines(strings.Join(s.other, "\n"), 3)
	}
	return out
}

// lastLines is the last n lines of s, joined by " | ".
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], " | ")
}

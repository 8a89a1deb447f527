package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/probe"
)

// Lab addresses exist only inside the lab's network namespaces, so the
// probe and the file copy run as ferry child processes inside a lab host
// (`ferry lab-tool ...`, hidden commands), talking to the parent over pipes.

// ProbeProc is a running client-side probe on a lab host.
type ProbeProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// StartProbe starts a probe in client's netns, polling addrs, and returns
// once memhog answers with its memory filled.
func StartProbe(ctx context.Context, client *lab.Host, ferry string, addrs []string, ready time.Duration) (*ProbeProc, probe.Stat, error) {
	args := []string{"lab-tool", "probe", "--wait-ready", ready.String()}
	for _, a := range addrs {
		args = append(args, "--addr", a)
	}
	cmd := client.Command(ctx, ferry, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, probe.Stat{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, probe.Stat{}, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, probe.Stat{}, err
	}
	p := &ProbeProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	var st probe.Stat
	line, err := p.out.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &st)
	}
	if err != nil {
		p.kill()
		return nil, st, fmt.Errorf("probe: workload never became ready: %v %s", err, strings.TrimSpace(stderr.String()))
	}
	return p, st, nil
}

// Stop ends polling and returns the probe's verdict.
func (p *ProbeProc) Stop() (probe.Result, error) {
	p.stdin.Close()
	var r probe.Result
	line, err := p.out.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &r)
	}
	werr := p.cmd.Wait()
	if err != nil {
		return r, fmt.Errorf("probe: %v (%v)", err, werr)
	}
	return r, nil
}

func (p *ProbeProc) kill() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	_ = p.cmd.Wait()
}

// copyOverLink copies a file from one lab host to another through the lab's
// (shaped) network: a receiver in to's netns, a sender in from's.
func copyOverLink(ctx context.Context, ferry string, from, to *lab.Host, src, dst string) error {
	_, err := sendOverLink(ctx, ferry, from, to, 7100, src, dst, nil, nil)
	return err
}

// sendOverLink runs `lab-tool recv` on to (writing dst) and `lab-tool send`
// on from (reading src) over the lab's network, and returns what the
// sender printed (the bytes and seconds it took).
func sendOverLink(ctx context.Context, ferry string, from, to *lab.Host, port int, src, dst string, recvArgs, sendArgs []string) ([]byte, error) {
	listen := fmt.Sprintf("%s:%d", to.Addr, port)
	recv := to.Command(ctx, ferry, append([]string{"lab-tool", "recv", "--listen", listen, "--out", dst}, recvArgs...)...)
	rout, err := recv.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var rerr strings.Builder
	recv.Stderr = &rerr
	if err := recv.Start(); err != nil {
		return nil, err
	}
	stop := func() { _ = recv.Process.Kill(); _ = recv.Wait() }
	// The receiver prints one line once it listens.
	if _, err := bufio.NewReader(rout).ReadString('\n'); err != nil {
		stop()
		return nil, fmt.Errorf("receiver on %s: %v %s", to.Name, err, rerr.String())
	}
	out, err := from.Command(ctx, ferry, append([]string{"lab-tool", "send", "--to", listen, "--in", src}, sendArgs...)...).CombinedOutput()
	if err != nil {
		stop()
		return out, fmt.Errorf("sender on %s: %v %s", from.Name, err, out)
	}
	if err := recv.Wait(); err != nil {
		return out, fmt.Errorf("receiver on %s: %v %s", to.Name, err, rerr.String())
	}
	return out, nil
}

// measurePaths times 256 MiB from one lab host to another over plain TCP on
// the first path, then over MPTCP across every path, then striped over one
// TCP connection per path (ferry's fallback without MPTCP).
func measurePaths(ctx context.Context, ferry string, from, to *lab.Host, paths int) (PathsBaseline, error) {
	var b PathsBaseline
	var err error
	if b.SinglePathBps, err = transferRate(ctx, ferry, from, to, "--mptcp=false"); err != nil {
		return b, err
	}
	if b.MultipathBps, err = transferRate(ctx, ferry, from, to, "--mptcp=true"); err != nil {
		return b, err
	}
	striped := []string{"--streams", fmt.Sprint(paths)}
	for p := 1; p < paths; p++ {
		striped = append(striped, "--to", fmt.Sprintf("%s:%d", to.PathAddr(p), pathProbePort))
	}
	if b.StripedBps, err = transferRate(ctx, ferry, from, to, striped...); err != nil {
		return b, err
	}
	b.Ratio = b.MultipathBps / b.SinglePathBps
	b.StripedRatio = b.StripedBps / b.SinglePathBps
	return b, nil
}

const (
	pathProbeBytes = 256 << 20
	pathProbePort  = 7101
)

// transferRate sends pathProbeBytes from /dev/zero and returns bits/s.
// args go to both ends; "--to ADDR" becomes "--listen ADDR" at the receiver.
func transferRate(ctx context.Context, ferry string, from, to *lab.Host, args ...string) (float64, error) {
	recvArgs := slices.Clone(args)
	for i, a := range recvArgs {
		if a == "--to" {
			recvArgs[i] = "--listen"
		}
	}
	out, err := sendOverLink(ctx, ferry, from, to, pathProbePort, "/dev/zero", "/dev/null",
		recvArgs, append([]string{"--bytes", fmt.Sprint(pathProbeBytes)}, args...))
	if err != nil {
		return 0, err
	}
	var n int64
	var secs float64
	if _, err := fmt.Sscanf(string(out), "%d %f", &n, &secs); err != nil || secs <= 0 {
		return 0, fmt.Errorf("sender said %q", out)
	}
	return float64(n) * 8 / secs, nil
}

// StreamClient is `lab-tool stream` on a lab host: one TCP connection to
// memhog's echo port, a numbered line every 10 ms, each echoed back.
type StreamClient struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// StreamResult is what the stream client saw.
type StreamResult struct {
	Sent     int `json:"sent"`
	Received int `json:"received"`
	// MaxGapMs is the longest the connection went without an echo.
	MaxGapMs float64 `json:"max_gap_ms"`
	OK       bool    `json:"ok"`
	Error    string  `json:"error,omitempty"`
}

// StartStream connects the stream client on host to addr and returns once
// the connection is up.
func StartStream(ctx context.Context, host *lab.Host, ferry, addr string) (*StreamClient, error) {
	cmd := host.Command(ctx, ferry, "lab-tool", "stream", "--addr", addr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &StreamClient{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	if line, err := c.out.ReadString('\n'); err != nil || !strings.Contains(line, "connected") {
		c.kill()
		return nil, fmt.Errorf("stream client: %q %v %s", line, err, strings.TrimSpace(stderr.String()))
	}
	return c, nil
}

// Stop ends the stream and returns what the client saw.
func (c *StreamClient) Stop() (StreamResult, error) {
	c.stdin.Close()
	var r StreamResult
	line, err := c.out.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &r)
	}
	werr := c.cmd.Wait()
	if err != nil {
		return r, fmt.Errorf("stream client: %v (%v)", err, werr)
	}
	return r, nil
}

func (c *StreamClient) kill() {
	if c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
	}
	_ = c.cmd.Wait()
}

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
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/probe"
)

// Lab addresses exist only inside the lab's network namespaces, so the
// probe and the file copy run as ferry child processes inside a lab host
// (`ferry-lab lab-tool ...`, hidden commands), talking to the parent over pipes.

// labTool is a `ferry-lab lab-tool` child on a lab host that prints a first
// line once it is ready, and its verdict as one JSON line once its stdin
// closes.
type labTool struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr strings.Builder
}

// startLabTool starts lab-tool args on host and returns its first line.
func startLabTool(ctx context.Context, host *lab.Host, ferry string, args ...string) (*labTool, []byte, error) {
	t := &labTool{cmd: host.Command(ctx, lab.ToolBin(ferry), append([]string{"lab-tool"}, args...)...)}
	stdin, err := t.cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := t.cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	t.cmd.Stderr = &t.stderr
	if err := t.cmd.Start(); err != nil {
		return nil, nil, err
	}
	t.stdin, t.out = stdin, bufio.NewReader(stdout)
	line, err := t.out.ReadBytes('\n')
	if err != nil {
		t.kill()
		return nil, line, fmt.Errorf("%v %s", err, strings.TrimSpace(t.stderr.String()))
	}
	return t, line, nil
}

// stop closes the tool's stdin and reads its verdict into v.
func (t *labTool) stop(v any) error {
	t.stdin.Close()
	line, err := t.out.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, v)
	}
	werr := t.cmd.Wait()
	if err != nil {
		return fmt.Errorf("%v (%v)", err, werr)
	}
	return nil
}

func (t *labTool) kill() {
	if t.cmd.Process != nil {
		_ = t.cmd.Process.Kill()
	}
	_ = t.cmd.Wait()
}

// ProbeProc is a running client-side probe on a lab host.
type ProbeProc struct{ t *labTool }

// StartProbe starts a probe in client's netns, polling addrs, and returns
// once memhog answers with its memory filled.
func StartProbe(ctx context.Context, client *lab.Host, ferry string, addrs []string, ready time.Duration) (*ProbeProc, probe.Stat, error) {
	args := []string{"probe", "--wait-ready", ready.String()}
	for _, a := range addrs {
		args = append(args, "--addr", a)
	}
	var st probe.Stat
	t, line, err := startLabTool(ctx, client, ferry, args...)
	if err == nil {
		if err = json.Unmarshal(line, &st); err != nil {
			t.kill()
		}
	}
	if err != nil {
		return nil, st, fmt.Errorf("probe: workload never became ready: %w", err)
	}
	return &ProbeProc{t}, st, nil
}

// Stop ends polling and returns the probe's verdict.
func (p *ProbeProc) Stop() (probe.Result, error) {
	var r probe.Result
	if err := p.t.stop(&r); err != nil {
		return r, fmt.Errorf("probe: %w", err)
	}
	return r, nil
}

// StreamClient is a lab-tool client on a lab host that holds one TCP
// connection: stream (to memhog's echo port, a numbered line every 10 ms,
// each echoed back) or redis (an INCR at a time).
type StreamClient struct{ t *labTool }

// StartStream starts lab-tool args (stream --addr ..., redis ...) on host
// and returns once its connection is up.
func StartStream(ctx context.Context, host *lab.Host, ferry string, args ...string) (*StreamClient, error) {
	t, line, err := startLabTool(ctx, host, ferry, args...)
	if err == nil && !strings.Contains(string(line), "connected") {
		t.kill()
		err = fmt.Errorf("said %q", line)
	}
	if err != nil {
		return nil, fmt.Errorf("%s client: %w", args[0], err)
	}
	return &StreamClient{t}, nil
}

// Stop ends the stream and returns what the client saw.
func (c *StreamClient) Stop() (labtool.StreamResult, error) {
	var r labtool.StreamResult
	if err := c.t.stop(&r); err != nil {
		return r, fmt.Errorf("stream client: %w", err)
	}
	return r, nil
}

// LoadClient is `ferry-lab lab-tool load` on a lab host: a real service's
// client, on connections it keeps, at a steady rate.
type LoadClient struct{ t *labTool }

// StartLoad starts lab-tool load args (--service ..., --addr ...) on host
// and returns once its connections are up.
func StartLoad(ctx context.Context, host *lab.Host, ferry string, args ...string) (*LoadClient, error) {
	c, err := StartStream(ctx, host, ferry, append([]string{"load"}, args...)...)
	if err != nil {
		return nil, err
	}
	return &LoadClient{c.t}, nil
}

// Stop ends the load and returns what the client felt and checked.
func (c *LoadClient) Stop() (labtool.LoadResult, error) {
	var r labtool.LoadResult
	if err := c.t.stop(&r); err != nil {
		return r, fmt.Errorf("load client: %w", err)
	}
	return r, nil
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
	recv := to.Command(ctx, lab.ToolBin(ferry), append([]string{"lab-tool", "recv", "--listen", listen, "--out", dst}, recvArgs...)...)
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
	out, err := from.Command(ctx, lab.ToolBin(ferry), append([]string{"lab-tool", "send", "--to", listen, "--in", src}, sendArgs...)...).CombinedOutput()
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

package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ferry-migrate/ferry/internal/procs"
)

const (
	agentStartTimeout = 10 * time.Second
	stopGrace         = 3 * time.Second
)

// agent is an agent process started by this process.
type agent struct {
	host   *Host
	pid    int
	exited <-chan error // receives the process's end
}

// agentArgs is the agent's command line after the binary. It listens on
// its address on every path; with l.Streams its sessions stripe over TCP
// connections instead of MPTCP.
func agentArgs(h *Host, l *Lab) []string {
	listen := []string{h.AgentAddr}
	for p := 1; p < l.Paths; p++ {
		listen = append(listen, net.JoinHostPort(h.PathAddr(p), fmt.Sprint(AgentPort)))
	}
	args := []string{"agent", "--name", h.Name, "--listen", strings.Join(listen, ","), "--control", h.ControlSock,
		"--state", h.StateDir, "--cgroup-parent", h.CgroupParent, "--netns", h.NetNS, "--scratch", h.ScratchDir, "--bundles", h.BundlesDir,
		"--tls-dir", h.TLSDir(), "--allow", strings.Join(l.hostNames(), ","), "--segment-bridge", SegmentBridge,
		"--segment-range", SegmentSubnet + "0/" + fmt.Sprint(segmentPrefixLen), "--allow-bind", SharedStorage, "--allow-faults"}
	for _, rt := range Runtimes() {
		if rt.AgentArgs != nil {
			args = append(args, rt.AgentArgs(h)...)
		}
	}
	if l.OutageTimeout > 0 {
		args = append(args, "--outage-timeout", l.OutageTimeout.String())
	}
	if l.Streams > 0 {
		args = append(args, "--mptcp=false", "--streams", fmt.Sprint(l.Streams))
	}
	return args
}

// AgentLog is where the host's agent writes its output.
func (h *Host) AgentLog() string { return filepath.Join(h.StateDir, "agent.log") }

// startAgent starts host h's agent inside its namespace, in a session of
// its own so that it outlives the caller. nsenter execs the agent,
// so the PID is the agent's.
func startAgent(l *Lab, h *Host) (*agent, error) {
	if err := os.Remove(h.ControlSock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	p, err := procs.StartDetached(append([]string{l.FerryBin}, agentArgs(h, l)...), h.NetNS, h.AgentLog(), nil)
	if err != nil {
		return nil, fmt.Errorf("start agent of %s: %w", h.Name, err)
	}
	return &agent{host: h, pid: p.PID, exited: p.Exited}, nil
}

// waitReady waits until the agent's control socket accepts a connection.
func (a *agent) waitReady(ctx context.Context, timeout time.Duration) error {
	h := a.host
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("unix", h.ControlSock, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case werr := <-a.exited:
			return fmt.Errorf("agent of %s exited (%v) before serving %s; its log %s says:\n%s",
				h.Name, werr, h.ControlSock, h.AgentLog(), logTail(h.AgentLog(), 10))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent of %s (pid %d) did not accept connections on %s within %v; see %s:\n%s",
				h.Name, a.pid, h.ControlSock, timeout, h.AgentLog(), logTail(h.AgentLog(), 10))
		}
	}
}

func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// isAgentOf says whether pid runs host h's agent (or is nsenter
// about to become it). Checked before signalling a recorded PID, which
// may have been reused since.
func isAgentOf(pid int, h *Host) bool {
	args := cmdline(pid)
	i := slices.Index(args, "--control")
	return slices.Contains(args, "agent") && i >= 0 && i+1 < len(args) && args[i+1] == h.ControlSock
}

// AgentAlive says whether the host's recorded agent is running.
func (h *Host) AgentAlive() bool {
	return h.AgentPID > 0 && procs.Alive(h.AgentPID) && isAgentOf(h.AgentPID, h)
}

// RestartAgent starts a lab host's agent again after it died (a test's
// crash fault), and waits until it serves.
func (l *Lab) RestartAgent(ctx context.Context, hostName string) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	if h.AgentPID > 0 && procs.Alive(h.AgentPID) && isAgentOf(h.AgentPID, h) {
		return fmt.Errorf("the agent of %s still runs (pid %d)", h.Name, h.AgentPID)
	}
	a, err := startAgent(l, h)
	if err != nil {
		return err
	}
	if err := a.waitReady(ctx, 30*time.Second); err != nil {
		return err
	}
	h.AgentPID = a.pid
	return l.save()
}

// StopAgent stops a lab host's agent (SIGTERM, then SIGKILL after the
// grace), and waits until it is gone; RestartAgent starts it again.
func (l *Lab) StopAgent(hostName string) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	if h.AgentPID > 0 && procs.Alive(h.AgentPID) && isAgentOf(h.AgentPID, h) {
		if err := procs.Terminate([]int{h.AgentPID}, stopGrace); err != nil {
			return fmt.Errorf("stop the agent of %s: %w", h.Name, err)
		}
	}
	h.AgentPID = 0
	return l.save()
}

// AgentConfig is host h's agent's command line as `ferry agent --config`
// reads it (TOML, keys named like the flags): the settings of an agent run
// elsewhere than by the lab, e.g. in a pod of deploy/kubernetes's
// DaemonSet.
func (l *Lab) AgentConfig(h *Host) ([]byte, error) {
	args := agentArgs(h, l)[1:] // after "agent"
	settings := map[string]string{}
	for i := 0; i < len(args); i++ {
		key, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			return nil, fmt.Errorf("agent argument %q is no flag", args[i])
		}
		if k, v, ok := strings.Cut(key, "="); ok {
			settings[k] = v
			continue
		}
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			settings[key] = args[i+1]
			i++
			continue
		}
		settings[key] = "true"
	}
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(settings); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

package kubelab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cgroups"
)

// daemon is a process Up started and watches until it is ready.
type daemon struct {
	process
	// exited is closed when the process ends; err then says how.
	exited chan struct{}
	err    error
}

// startDaemon starts argv as component name: in the network namespace
// netns through nsenter (which execs it, so the PID is the daemon's; and
// unlike `ip netns exec`, it leaves the mount namespace and with it the
// cgroup mounts alone), in a session of its own so that it outlives the
// caller, its output appended to DIR/logs/NAME.log. It is born in the
// cluster's daemons cgroup where the machine has cgroup v2, so that Down
// finds it (and what it forks, such as containerd's shims) whatever
// happens; elsewhere it joins that cgroup right after it starts.
func startDaemon(c Config, l layout, st *state, name, netns string, argv []string, env ...string) (*daemon, error) {
	logPath := l.log(name)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "# %s kubelab: starting %s in %s\n", time.Now().Format(time.RFC3339), commandLine(argv), netns)
	if netns != "" {
		argv = append([]string{"nsenter", "--net=" + netns, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(daemonEnv(c), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if dir := cgroup2Dir(daemonsCgroup(c)); dir != "" {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open cgroup %s: %w", dir, err)
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{process: process{Name: name, PID: cmd.Process.Pid, Start: processStart(cmd.Process.Pid), Log: logPath}, exited: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	err = st.update(func(s *state) { s.Processes = append(s.Processes, d.process) })
	if !cmd.SysProcAttr.UseCgroupFD {
		err = errors.Join(err, cgroups.Join(daemonsCgroup(c), d.PID))
	}
	if err != nil {
		return d, fmt.Errorf("record %s (pid %d): %w", name, d.PID, err)
	}
	return d, nil
}

// daemonEnv is the caller's environment with the cache's binaries first
// on PATH, ahead of the machine's own containerd and ctr.
func daemonEnv(c Config) []string {
	path := c.Bin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	env := []string{"PATH=" + path}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PATH=") && !strings.HasPrefix(e, "KUBECONFIG=") {
			env = append(env, e)
		}
	}
	return env
}

// pollInterval is how often waits look again.
const pollInterval = 250 * time.Millisecond

// waitReady polls check until it succeeds, one of the daemons ends, ctx
// ends or timeout passes. The error names what was awaited and the
// daemons' logs, with their last lines.
func waitReady(ctx context.Context, what string, timeout time.Duration, daemons []*daemon, check func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		for _, d := range daemons {
			select {
			case <-d.exited:
				return fmt.Errorf("%s: %s exited (%v) before it was ready%s", what, d.Name, d.err, logHints(daemons))
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready after %s: %v%s", what, timeout, err, logHints(daemons))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %v)%s", what, ctx.Err(), err, logHints(daemons))
		case <-time.After(pollInterval):
		}
	}
}

// logHints names each daemon's log and quotes its last lines.
func logHints(daemons []*daemon) string {
	var b strings.Builder
	for _, d := range daemons {
		fmt.Fprintf(&b, "\n  %s log: %s", d.Name, d.Log)
		for _, line := range lastLines(d.Log, 6) {
			fmt.Fprintf(&b, "\n    | %s", line)
		}
	}
	return b.String()
}

// lastLines is up to n last lines of the file at path, each cut to 300
// bytes (the components log long lines).
func lastLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	const window = 16 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		_, _ = f.Seek(fi.Size()-window, 0)
	}
	buf := make([]byte, window)
	k, _ := f.Read(buf)
	lines := strings.Split(strings.TrimRight(string(bytes.ToValidUTF8(buf[:k], nil)), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 300 {
			lines[i] = l[:300] + "..."
		}
	}
	return lines
}

// stopProcesses ends ps (those still the processes Up started): SIGTERM,
// then SIGKILL for whatever is left after grace.
func stopProcesses(ps []process, grace time.Duration) error {
	var live []process
	for _, p := range ps {
		if p.alive() {
			live = append(live, p)
			_ = syscall.Kill(p.PID, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(grace)
	for len(live) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		live = stillAlive(live)
	}
	for _, p := range live {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(5 * time.Second); len(live) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		live = stillAlive(live)
	}
	if len(live) > 0 {
		return fmt.Errorf("processes survived SIGKILL: %v", live)
	}
	return nil
}

func stillAlive(ps []process) []process {
	var out []process
	for _, p := range ps {
		if p.alive() {
			out = append(out, p)
		}
	}
	return out
}

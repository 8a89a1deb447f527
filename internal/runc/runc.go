// Package runc drives the runc binary for one host: running, freezing,
// checkpointing and restoring containers under that host's own runc root and
// cgroup parent, so that several emulated hosts can share one machine. The
// runtimes whose containers runc runs use it: runc's own adapter
// (internal/runtime/runc), Podman's, containerd's, Docker's and
// Kubernetes'.
//
// ferry drives CRIU through runc rather than through CRIU's RPC directly:
// runc already knows how to prepare a container's mounts, cgroups and
// namespaces for a restore, and re-implementing that would duplicate the
// runtime. CRIU-level details (features, stats) live in internal/criu.
package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	occgroups "github.com/opencontainers/cgroups"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/privnet"
	"github.com/ferry-migrate/ferry/internal/tail"
)

// Host is one host's view of runc: where its state lives and which cgroup
// parent and network namespace its containers use.
type Host struct {
	// Root is runc's --root (container state) for this host.
	Root string
	// Binary is the runc executable; empty means "runc" from PATH.
	Binary string
}

// State is the subset of `runc state` that ferry uses.
type State struct {
	ID      string `json:"id"`
	Pid     int    `json:"pid"`
	Status  string `json:"status"` // created, running, paused, stopped
	Bundle  string `json:"bundle"`
	Created string `json:"created"`
}

// ErrNotFound is returned when runc does not know the container.
var ErrNotFound = errors.New("container not found")

func (h Host) bin() string {
	if h.Binary != "" {
		return h.Binary
	}
	return "runc"
}

// cmd builds a runc command with this host's root. Output not consumed by
// the caller is captured for error messages.
func (h Host) run(ctx context.Context, stdout *bytes.Buffer, args ...string) error {
	full := append([]string{"--root", h.Root}, args...)
	c := exec.CommandContext(ctx, h.bin(), full...)
	var stderr bytes.Buffer
	if stdout != nil { // a nil *bytes.Buffer in the interface would panic
		c.Stdout = stdout
	}
	c.Stderr = &stderr
	if err := c.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "does not exist") || strings.Contains(msg, "container not found") {
			return fmt.Errorf("runc %s: %w", args[0], ErrNotFound)
		}
		return fmt.Errorf("runc %s: %v: %s", args[0], err, tail.Lines(msg, 6))
	}
	return nil
}

// State returns the container's state, or ErrNotFound.
func (h Host) State(ctx context.Context, id string) (State, error) {
	var out bytes.Buffer
	if err := h.run(ctx, &out, "state", id); err != nil {
		return State{}, err
	}
	var st State
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		return State{}, fmt.Errorf("runc state %s: %w", id, err)
	}
	return st, nil
}

// List returns every container under this host's root.
func (h Host) List(ctx context.Context) ([]State, error) {
	var out bytes.Buffer
	if err := h.run(ctx, &out, "list", "--format", "json"); err != nil {
		return nil, err
	}
	var sts []State
	if b := bytes.TrimSpace(out.Bytes()); len(b) > 0 && string(b) != "null" {
		if err := json.Unmarshal(b, &sts); err != nil {
			return nil, fmt.Errorf("runc list: %w", err)
		}
	}
	return sts, nil
}

// Run starts a container detached from bundle. runc's own messages go to
// logPath.
func (h Host) Run(ctx context.Context, id, bundle, logPath string) error {
	return h.detached(ctx, logPath, "run", "--detach", "--bundle", bundle, id)
}

// detached runs a runc command that leaves a container behind. The
// container inherits runc's stdin, stdout and stderr, so they are /dev/null:
// a pipe would keep the command waiting as long as the container lives, and
// a host file outside the container's mounts is something CRIU cannot dump.
// runc's own messages go to logPath (--log); the error quotes their tail.
func (h Host) detached(ctx context.Context, logPath string, args ...string) error {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return err
	}
	var start int64
	if st, err := os.Stat(logPath); err == nil {
		start = st.Size()
	}
	full := append([]string{"--root", h.Root, "--log", logPath}, args...)
	c := exec.CommandContext(ctx, h.bin(), full...)
	if err := c.Run(); err != nil {
		b, _ := os.ReadFile(logPath)
		if int64(len(b)) >= start {
			b = b[start:]
		}
		return fmt.Errorf("runc %s %s: %v: %s", args[0], args[len(args)-1], err, tail.Lines(strings.TrimSpace(string(b)), 4))
	}
	return nil
}

// FreezerDir is the freezer cgroup runc made for container id, from
// runc's own record of it (state.json in its root, as runc pause reads
// it).
func (h Host) FreezerDir(id string) (string, error) {
	b, err := os.ReadFile(filepath.Join(h.Root, id, "state.json"))
	if err != nil {
		return "", err
	}
	var st struct {
		CgroupPaths map[string]string `json:"cgroup_paths"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return "", err
	}
	key := "freezer"
	if occgroups.IsCgroup2UnifiedMode() {
		key = ""
	}
	if dir := st.CgroupPaths[key]; dir != "" {
		return dir, nil
	}
	return "", fmt.Errorf("runc's record of %s names no freezer cgroup", id)
}

// Pause freezes every process of the container (cgroup freezer).
func (h Host) Pause(ctx context.Context, id string) error { return h.run(ctx, nil, "pause", id) }

// ContinueAll sends every process of the container SIGCONT: a container
// CRIU restored stopped (leave-stopped) runs; one that runs is unaffected.
func (h Host) ContinueAll(ctx context.Context, id string) error {
	return h.run(ctx, nil, "kill", "--all", id, "CONT")
}

// Resume thaws a paused container.
func (h Host) Resume(ctx context.Context, id string) error { return h.run(ctx, nil, "resume", id) }

// Delete removes the container, killing it first.
func (h Host) Delete(ctx context.Context, id string) error {
	err := h.run(ctx, nil, "delete", "--force", id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// CheckpointOptions are the runc/CRIU options ferry sets for a dump.
type CheckpointOptions struct {
	ImagePath  string // CRIU images (all but pages when PageServer is set)
	WorkPath   string // CRIU logs
	ParentPath string // previous images, for native pre-dump chains
	PageServer string // ADDR:PORT receiving the pages
	// LeaveRunning keeps the container after the dump. A paused container
	// stays paused, which is how ferry keeps the source resumable until the
	// destination confirms.
	LeaveRunning   bool
	TCPEstablished bool
	// TCPClose dumps established connections to be restored closed
	// (runc has no flag: CRIU's configuration file).
	TCPClose  bool
	PreDump   bool
	LazyPages bool
	// NoNetworkLock leaves the network as it is: CRIU's own lock (iptables
	// rules added and removed inside the dump, and again inside the
	// restore, about 70 ms each) is for callers that keep the network
	// quiet themselves.
	NoNetworkLock bool
	// StatusFD, with LazyPages, receives a byte from CRIU once the images
	// are written and its page server listens. Checkpoint closes it.
	StatusFD *os.File
	// Netns, when set, is the network namespace runc (and so CRIU, and a
	// lazy dump's page server) runs in.
	Netns *privnet.NS
	// ActionScript is a script CRIU runs at each of its actions, or only
	// at ScriptActions when set (ferry's CRIU, scripts/criu-patches/0013:
	// a script's fork and exec at every other action cost the frozen dump
	// 1-4 ms each; a stock CRIU runs it at every action still).
	ActionScript  string
	ScriptActions []string
	// SmapsSnapshot is a directory of the tasks' smaps read before the
	// freeze, which ferry's CRIU reads where their mappings are unchanged
	// (scripts/criu-patches/0014).
	SmapsSnapshot string
	// IrmapScanPaths: see CRIUConfig.
	IrmapScanPaths []string
}

// Checkpoint dumps the container with CRIU through runc.
func (h Host) Checkpoint(ctx context.Context, id string, o CheckpointOptions) error {
	args := []string{"checkpoint", "--image-path", o.ImagePath, "--file-locks", "--manage-cgroups-mode", "soft"}
	if o.WorkPath != "" {
		args = append(args, "--work-path", o.WorkPath)
	}
	if o.ParentPath != "" {
		args = append(args, "--parent-path", o.ParentPath)
	}
	if o.PageServer != "" {
		args = append(args, "--page-server", o.PageServer)
	}
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	if o.TCPEstablished {
		args = append(args, "--tcp-established")
	}
	if o.PreDump {
		args = append(args, "--pre-dump")
	}
	if o.LazyPages {
		args = append(args, "--lazy-pages")
	}
	full := append([]string{"--root", h.Root}, append(args, id)...)
	c := exec.CommandContext(ctx, h.bin(), full...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	// What runc has no flag for goes to CRIU through its environment: a
	// configuration file it reads before runc's requests (which leave
	// these unset), and what ferry's CRIU patches read.
	var env []string
	if conf := (CRIUConfig{NoNetworkLock: o.NoNetworkLock, ActionScript: o.ActionScript, TCPClose: o.TCPClose, IrmapScanPaths: o.IrmapScanPaths}).WithYard(o.WorkPath); conf.String() != "" {
		path := filepath.Join(o.WorkPath, "criu-dump.conf")
		if o.WorkPath == "" {
			path = filepath.Join(o.ImagePath, "criu-dump.conf")
		}
		if err := conf.Write(path); err != nil {
			return err
		}
		env = append(env, "CRIU_CONFIG_FILE="+path)
		if o.ActionScript != "" && len(o.ScriptActions) > 0 {
			env = append(env, "CRIU_ACTION_SCRIPT_ACTIONS="+strings.Join(o.ScriptActions, ","))
		}
	}
	if o.SmapsSnapshot != "" {
		env = append(env, criu.SmapsSnapshotEnv+"="+o.SmapsSnapshot)
	}
	if len(env) > 0 {
		c.Env = append(os.Environ(), env...)
	}
	if o.StatusFD != nil {
		c.ExtraFiles = []*os.File{o.StatusFD}
		c.Args = append(c.Args[:len(c.Args)-1], "--status-fd", "3", id)
	}
	var err error
	if o.Netns != nil {
		err = o.Netns.Do(c.Start)
	} else {
		err = c.Start()
	}
	if o.StatusFD != nil {
		// runc and CRIU hold their own copy now; closing ours lets the
		// reader see EOF if CRIU dies before it is ready.
		o.StatusFD.Close()
	}
	if err == nil {
		err = c.Wait()
	}
	if err != nil {
		return fmt.Errorf("runc checkpoint %s: %v: %s%s", id, err, tail.Lines(strings.TrimSpace(stderr.String()), 4), criuErrors(o.WorkPath, "dump.log"))
	}
	return nil
}

// RestoreOptions are the runc/CRIU options ferry sets for a restore.
type RestoreOptions struct {
	ImagePath      string
	WorkPath       string
	Bundle         string
	LogPath        string // runc's own messages
	TCPEstablished bool
	LazyPages      bool
	// PidFile, when set, receives the restored init's PID from runc.
	PidFile string
}

// Restore restores a container from images, detached, under id.
func (h Host) Restore(ctx context.Context, id string, o RestoreOptions) error {
	args := []string{"restore", "--detach", "--image-path", o.ImagePath,
		"--bundle", o.Bundle, "--file-locks", "--manage-cgroups-mode", "soft"}
	if o.WorkPath != "" {
		args = append(args, "--work-path", o.WorkPath)
	}
	if o.TCPEstablished {
		args = append(args, "--tcp-established")
	}
	if o.LazyPages {
		args = append(args, "--lazy-pages")
	}
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	args = append(args, id)
	err := h.detached(ctx, o.LogPath, args...)
	if err != nil && o.WorkPath != "" {
		// CRIU's log is written during the restore: quote it now.
		err = fmt.Errorf("%w%s", err, criuErrors(o.WorkPath, "restore.log"))
	}
	return err
}

// criuErrors quotes what CRIU's log in dir says went wrong.
func criuErrors(dir, name string) string {
	if dir == "" {
		return ""
	}
	return criu.LogErrors(filepath.Join(dir, name))
}

// WaitStatus polls until the container reaches want or the timeout passes.
func (h Host) WaitStatus(ctx context.Context, id, want string, timeout time.Duration) (State, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := h.State(ctx, id)
		if err == nil && st.Status == want {
			return st, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return st, err
			}
			return st, fmt.Errorf("container %s is %s, not %s", id, st.Status, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

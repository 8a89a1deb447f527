// Package lab emulates a small network of ferry hosts on one machine: one
// network namespace per host, all plugged into a bridge in a "switch"
// namespace, each link optionally shaped with tbf, one ferry agent per
// host. Every name is derived from the host's index, so `Down` can clean up
// after a crash even when the state file is gone.
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/units"

	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/pki"
	"github.com/google/renameio/v2"
)

const (
	// StateDir holds each lab host's state directory (hN).
	StateDir = "/var/lib/ferry/lab"
	// SharedStorage is a directory every lab host has as the same
	// storage, as hosts that mount one network filesystem do: containers
	// may bind-mount from it (the agents' --allow-bind), and it follows
	// them, never copied.
	SharedStorage = StateDir + "/shared"
	// RunDir holds the state file and the agents' control sockets.
	RunDir = "/run/ferry/lab"
	// ScratchDir holds, on tmpfs, the hosts' migration images (hN) and
	// their runc containers' bundles (bundles/hN). The bundles are not on
	// the disk because the development machines' ext4 has no journal, and
	// without one ext4 scans past every inode freed in the last 30 s for
	// each file it creates: a migration's root filesystem sync after the
	// lab had removed a few containers took 150-180 ms of system time at
	// the destination, against 6-47 ms here (docs/BENCHMARKS.md, "A
	// root filesystem on ext4 without a journal").
	ScratchDir = "/dev/shm/ferry-lab"
	// StateFile records the running lab.
	StateFile = RunDir + "/state.json"
	// SwitchNetNS is the namespace holding the bridge all hosts plug into.
	SwitchNetNS = "ferry-sw"
	// BridgeName is the bridge inside SwitchNetNS.
	BridgeName = "br0" // path 0's; path p's is brP
	// MaxPaths bounds Options.Paths.
	MaxPaths = 4
	// MaxHosts bounds a lab's size; Down looks for at least this many.
	MaxHosts = 16
	// AgentPort is the TCP port each agent listens on.
	AgentPort = 7070

	hostIfName = "eth0"
	subnet     = "10.77.0."
	prefixLen  = 24

	minRate = 100_000         // tbf's bucket time overflows below this
	maxRate = 100_000_000_000 // and its queue size above this
)

// ErrNoLab is returned (wrapped) by Load when no lab is up.
var ErrNoLab = errors.New("no ferry lab is up")

// Options configure Up.
type Options struct {
	// Hosts is the number of hosts, 1 to MaxHosts; 0 means 2.
	Hosts int
	// BandwidthBps shapes every host's link, both directions, in bits per
	// second; 0 leaves links unshaped.
	BandwidthBps int64
	// Paths is the number of independent paths between hosts (separate
	// bridges and subnets), each shaped to BandwidthBps; 0 means 1. With
	// more than one, hosts get MPTCP endpoints on every path.
	Paths int
	// OutageTimeout is the agents' --outage-timeout (0: their default).
	OutageTimeout time.Duration
	// Streams, when set, has the agents stripe sessions over that many TCP
	// connections instead of using MPTCP (--mptcp=false --streams N).
	Streams int
	// FerryBin is the ferry binary agents run, and next to which the
	// workload binaries are found; empty means this executable.
	FerryBin string
	// NoAgents sets up the network and state only.
	NoAgents bool
	// Kubernetes brings up a Kubernetes cluster over the hosts (kube.go):
	// h1 and h2 its nodes, h3 its control plane.
	Kubernetes bool
	// DelayLines puts a delay line on every host's links (delayline.go),
	// so that SetRTT can give them a round trip while the lab runs.
	DelayLines bool
	// RTT is the round trip each named host's link adds ("h1": 20ms),
	// half each way; between two hosts the round trip is the sum of
	// theirs. Any entry implies DelayLines; hosts not named start at 0.
	RTT map[string]time.Duration
}

// Host is one lab host.
type Host struct {
	host.Config
	Index       int    `json:"index"`
	Addr        string `json:"addr"`         // 10.77.0.i
	AgentAddr   string `json:"agent_addr"`   // 10.77.0.i:7070
	ControlSock string `json:"control_sock"` // /run/ferry/lab/h{i}.sock
	NetNSName   string `json:"netns_name"`   // ferry-h{i}
	AgentPID    int    `json:"agent_pid"`    // 0 without an agent
	// DelayLinePID is the process of the host's delay line (0: none);
	// RTT the round trip it adds now.
	DelayLinePID int           `json:"delay_line_pid,omitempty"`
	RTT          time.Duration `json:"rtt,omitempty"`
}

// PodmanDir holds the host's own Podman instance (storage, run, network).
func (h *Host) PodmanDir() string { return filepath.Join(h.StateDir, "podman") }

// LXCPath holds the host's LXC containers.
func (h *Host) LXCPath() string { return filepath.Join(h.StateDir, "lxc") }

// Lab is a running lab, as recorded in StateFile.
type Lab struct {
	Hosts         []Host        `json:"hosts"`
	BandwidthBps  int64         `json:"bandwidth_bps"`
	Paths         int           `json:"paths,omitempty"`
	OutageTimeout time.Duration `json:"outage_timeout,omitempty"`
	Streams       int           `json:"streams,omitempty"`
	FerryBin      string        `json:"ferry_bin"`
	// Kubeconfig is the admin's kubeconfig of the lab's Kubernetes
	// cluster, when it has one (Options.Kubernetes).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// DelayLines: every host's links pass a delay line (Options.DelayLines).
	DelayLines bool `json:"delay_lines,omitempty"`
}

// PathAddr is the host's address on path p (path 0: Addr).
func (h *Host) PathAddr(p int) string {
	return fmt.Sprintf("10.%d.0.%d", 77+p, h.Index)
}

// newHost derives every name and path of host i.
func newHost(i int) Host {
	name := "h" + strconv.Itoa(i)
	ns := "ferry-" + name
	return Host{
		Config: host.Config{
			Name:         name,
			StateDir:     filepath.Join(StateDir, name),
			CgroupParent: ns,
			NetNS:        "/var/run/netns/" + ns,
			ScratchDir:   filepath.Join(ScratchDir, name),
			BundlesDir:   filepath.Join(ScratchDir, "bundles", name),
		},
		Index:       i,
		Addr:        subnet + strconv.Itoa(i),
		AgentAddr:   subnet + strconv.Itoa(i) + ":" + strconv.Itoa(AgentPort),
		ControlSock: filepath.Join(RunDir, name+".sock"),
		NetNSName:   ns,
	}
}

// parseHostIndex accepts "h1", "1" or "ferry-h1".
func parseHostIndex(name string) (int, error) {
	s := strings.TrimPrefix(strings.TrimPrefix(name, "ferry-"), "h")
	i, err := strconv.Atoi(s)
	if err != nil || i < 1 || s != strconv.Itoa(i) {
		return 0, fmt.Errorf("bad host name %q: want h1, 1 or ferry-h1", name)
	}
	return i, nil
}

// Host finds a host by "h1", "1" or "ferry-h1".
func (l *Lab) Host(name string) (*Host, error) {
	i, err := parseHostIndex(name)
	if err != nil {
		return nil, err
	}
	for k := range l.Hosts {
		if l.Hosts[k].Index == i {
			return &l.Hosts[k], nil
		}
	}
	return nil, fmt.Errorf("no host %q in the lab (it has h1..h%d)", name, len(l.Hosts))
}

// Command runs a program inside the host's network namespace.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	// nsenter joins only the network namespace; `ip netns exec` would also
	// remount /sys in a private mount namespace, hiding the cgroup mounts
	// that runc needs.
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + h.NetNS, "--", name}, args...)...)
}

// PKIDir holds the lab's CA and one certificate directory per host.
const PKIDir = StateDir + "/pki"

// TLSDir is host h's certificate directory.
func (h *Host) TLSDir() string { return filepath.Join(PKIDir, h.Name) }

// issueCerts makes the lab's CA and a certificate for each host, so the
// agents talk over mutual TLS like real ones.
func (l *Lab) issueCerts() error {
	if err := pki.NewCA(PKIDir, "ferry lab CA"); err != nil {
		return fmt.Errorf("lab CA: %w", err)
	}
	for k := range l.Hosts {
		h := &l.Hosts[k]
		if err := pki.Issue(PKIDir, h.TLSDir(), h.Name, []net.IP{net.ParseIP(h.Addr)}, nil, 7*24*time.Hour); err != nil {
			return fmt.Errorf("certificate for %s: %w", h.Name, err)
		}
	}
	return nil
}

// hostNames lists the lab's hosts: each may send migrations to any other.
func (l *Lab) hostNames() []string {
	var names []string
	for _, h := range l.Hosts {
		names = append(names, h.Name)
	}
	return names
}

// ferryBin is the binary agents run and workloads are found next to.
func (l *Lab) ferryBin() (string, error) {
	if l.FerryBin != "" {
		return l.FerryBin, nil
	}
	return FerryBin()
}

// Load reads the running lab's state.
func Load() (*Lab, error) {
	b, err := os.ReadFile(StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w (no %s); start one with `ferry-lab lab up`", ErrNoLab, StateFile)
	}
	if err != nil {
		return nil, err
	}
	var l Lab
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("parse %s: %w (run `ferry-lab lab down` to clear it)", StateFile, err)
	}
	return &l, nil
}

func (l *Lab) save() error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return err
	}
	return renameio.WriteFile(StateFile, append(b, '\n'), 0o644)
}

// existing says why a lab (or a crashed one's remains) is already there.
func existing() string {
	if _, err := os.Stat(StateFile); err == nil {
		return StateFile + " exists"
	}
	if netnsExists(SwitchNetNS) {
		return "network namespace " + SwitchNetNS + " exists"
	}
	if idx := leftoverIndexes(); len(idx) > 0 {
		return fmt.Sprintf("remains of host h%d exist", idx[0])
	}
	return ""
}

// Up builds a lab: the switch, Hosts hosts with their links and state
// directories, and one agent per host. On failure it removes what it made.
func Up(ctx context.Context, o Options) (*Lab, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("ferry lab needs root (network namespaces, cgroups, runc)")
	}
	if o.Hosts == 0 {
		o.Hosts = 2
	}
	if o.Hosts < 1 || o.Hosts > MaxHosts {
		return nil, fmt.Errorf("a lab has 1 to %d hosts, not %d", MaxHosts, o.Hosts)
	}
	if o.BandwidthBps != 0 && (o.BandwidthBps < minRate || o.BandwidthBps > maxRate) {
		return nil, fmt.Errorf("bandwidth %s out of range (%s to %s, or 0 for unshaped)",
			units.FormatRate(o.BandwidthBps), units.FormatRate(minRate), units.FormatRate(maxRate))
	}
	if o.Paths == 0 {
		o.Paths = 1
	}
	if o.Paths < 1 || o.Paths > MaxPaths {
		return nil, fmt.Errorf("a lab has 1 to %d paths between hosts, not %d", MaxPaths, o.Paths)
	}
	if o.Kubernetes && o.Hosts < 3 {
		return nil, fmt.Errorf("a lab with Kubernetes has 3 hosts at least (h1 and h2 its nodes, h3 its control plane), not %d", o.Hosts)
	}
	if err := checkRTTs(o.RTT, o.Hosts); err != nil {
		return nil, err
	}
	if len(o.RTT) > 0 {
		o.DelayLines = true
	}
	if why := existing(); why != "" {
		return nil, fmt.Errorf("a ferry lab is already up (%s); run `ferry-lab lab down` first", why)
	}
	if o.FerryBin == "" {
		exe, err := FerryBin()
		if err != nil {
			return nil, err
		}
		o.FerryBin = exe
	}
	bin, err := filepath.Abs(o.FerryBin)
	if err != nil {
		return nil, err
	}
	l := &Lab{BandwidthBps: o.BandwidthBps, Paths: o.Paths, OutageTimeout: o.OutageTimeout, Streams: o.Streams, FerryBin: bin, DelayLines: o.DelayLines}
	for i := 1; i <= o.Hosts; i++ {
		l.Hosts = append(l.Hosts, newHost(i))
	}
	for name, d := range o.RTT {
		h, err := l.Host(name)
		if err != nil {
			return nil, err
		}
		h.RTT = d
	}
	if err := l.up(ctx, o); err != nil {
		if derr := Down(context.WithoutCancel(ctx)); derr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up the partial lab: %w", derr))
		}
		return nil, err
	}
	return l, nil
}

func (l *Lab) up(ctx context.Context, o Options) error {
	for _, d := range []string{RunDir, StateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Saved first, so that even a crash during Up leaves Down a record.
	if err := l.save(); err != nil {
		return err
	}
	if err := buildSwitch(max(l.Paths, 1)); err != nil {
		return err
	}
	if err := buildSegment(); err != nil {
		return err
	}
	if err := os.MkdirAll(SharedStorage, 0o755); err != nil {
		return err
	}
	for k := range l.Hosts {
		h := &l.Hosts[k]
		if err := os.MkdirAll(h.RuncRoot(), 0o700); err != nil {
			return err
		}
		if err := plugHost(h, l.BandwidthBps, max(l.Paths, 1), l.DelayLines); err != nil {
			return err
		}
		if err := plugSegment(h, l.DelayLines); err != nil {
			return err
		}
		if err := addHostBridge(h); err != nil {
			return err
		}
		if err := h.writeCNIConfig(); err != nil {
			return err
		}
	}
	if l.DelayLines {
		if err := l.startDelayLines(ctx); err != nil {
			return err
		}
	}
	if o.NoAgents {
		if o.Kubernetes {
			if err := l.upKubernetes(ctx); err != nil {
				return err
			}
		}
		return l.save()
	}
	if err := l.issueCerts(); err != nil {
		return err
	}
	var agents []*agent
	for k := range l.Hosts {
		a, err := startAgent(l, &l.Hosts[k])
		if err != nil {
			return err
		}
		agents = append(agents, a)
		l.Hosts[k].AgentPID = a.pid
	}
	if err := l.save(); err != nil {
		return err
	}
	for _, a := range agents {
		if err := a.waitReady(ctx, agentStartTimeout); err != nil {
			return err
		}
	}
	if o.Kubernetes {
		return l.upKubernetes(ctx)
	}
	return nil
}

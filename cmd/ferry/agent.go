package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/nodens"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

func newAgentCmd() *cobra.Command {
	a := &agent.Agent{Version: version}
	var (
		tlsDir, profile string
		allow           []string
		insecure        bool
		outage          time.Duration
		segmentRanges   []string
		configPath      string
		inPod           bool
		logFormat       string
		logLevel        string
		costs           costFlags
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the per-host agent that sends and receives migrations",
		Long: `agent is ferry's daemon, one per host. It receives migrations from other
agents on --listen (TCP) and takes requests from the ferry CLI on --control
(a unix socket only root can open). Each agent has its own state directory
and runc root, so several agents on one machine behave like separate hosts.

Settings can come from a file (--config, TOML, keys named like the flags);
flags on the command line override it. packaging/ has a systemd unit that
runs the agent with /etc/ferry/agent.toml, and the example file; in a
Kubernetes cluster, deploy/kubernetes/agent.yaml runs it on every node
(--in-pod, settings from a ConfigMap: docs/KUBERNETES.md).`,
		Example: `  ferry agent --config /etc/ferry/agent.toml
  ferry agent --listen 0.0.0.0:7070 --tls-dir /etc/ferry/tls
  ferry agent --listen 10.0.1.5:7070,10.0.2.5:7070 --mptcp=false --streams 4 --tls-dir /etc/ferry/tls
  ferry agent --name h2 --listen 10.77.0.2:7070 --control /run/ferry/lab/h2.sock \
      --state /var/lib/ferry/lab/h2 --cgroup-parent ferry-h2 --netns /var/run/netns/ferry-h2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath != "" {
				if err := applyConfigPath(cmd.Flags(), configPath); err != nil {
					return err
				}
			}
			if inPod {
				// The configuration and certificates are the pod's
				// (a ConfigMap, a Secret); every other path is the node's.
				if err := nodens.Enter(os.Args[1:], nodens.Paths{"config": configPath, "tls-dir": tlsDir}); err != nil {
					return fmt.Errorf("--in-pod: %w", err)
				}
				if err := nodens.LeavePod(filepath.Join(a.Host.CgroupParent, "ferry-agent")); err != nil {
					return fmt.Errorf("--in-pod: leave the pod's cgroups: %w", err)
				}
			}
			if a.Host.Name == "" {
				n, err := os.Hostname()
				if err != nil {
					return err
				}
				a.Host.Name = n
			}
			if !filepath.IsAbs(a.Host.StateDir) {
				return fmt.Errorf("--state must be an absolute path, got %q", a.Host.StateDir)
			}
			if a.Host.BundlesDir != "" && !filepath.IsAbs(a.Host.BundlesDir) {
				return fmt.Errorf("--bundles must be an absolute path, got %q", a.Host.BundlesDir)
			}
			for _, r := range segmentRanges {
				p, err := netip.ParsePrefix(r)
				if err != nil {
					return fmt.Errorf("--segment-range %q: %w", r, err)
				}
				a.Admission.Addresses = append(a.Admission.Addresses, p.Masked())
			}
			logger, err := newLogger(os.Stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			// The engine logs through slog's default: the same settings.
			slog.SetDefault(logger)
			a.Log = logger.With("host", a.Host.Name)
			a.OutageTimeout = outage
			if a.Costs, err = costs.apply(); err != nil {
				return err
			}
			if profile != "" {
				p, _, err := cli.LoadProfile(profile)
				if err != nil {
					return err
				}
				a.Profile = &p
			}
			if tlsDir != "" {
				sec, err := transport.LoadSecurity(tlsDir, a.Host.Name, allow)
				if err != nil {
					return fmt.Errorf("--tls-dir: %w", err)
				}
				a.Security = sec
			} else if !insecure {
				return fmt.Errorf("agents talk over mutual TLS: pass --tls-dir (make one with `ferry certs`), or --insecure on a network you trust")
			}
			return a.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&a.Metrics, "metrics", "", "serve Prometheus metrics (GET /metrics, plain HTTP) on this TCP address, e.g. 127.0.0.1:9170; empty: none")
	f.StringVar(&configPath, "config", "", "TOML file of settings, named like these flags without the dashes (listen = [\"0.0.0.0:7070\"], tls-dir = \"/etc/ferry/tls\"); flags given here win (packaging/agent.toml is an example); or a directory of agent.toml (every host's settings) and NAME.toml (this host's, which win), as a ConfigMap holds them")
	f.BoolVar(&inPod, "in-pod", false, "the agent runs in a Kubernetes pod, privileged with hostPID (deploy/kubernetes/agent.yaml): it joins the node's mount namespace and leaves the pod's cgroups for CGROUP-PARENT/ferry-agent, so that it works on the node's files and what it starts outlives the pod; --config and --tls-dir are read from the pod's files, every other path from the node's")
	f.StringVar(&a.Host.Name, "name", "", "host name used in reports (default: the hostname)")
	f.StringSliceVar(&a.Listen, "listen", nil, "TCP address to receive migrations on, e.g. 0.0.0.0:7070; repeat (or comma-separate) for one address per network path: sessions striped over --streams spread over them")
	f.StringVar(&a.Control, "control", agent.DefaultControl, "unix socket for the ferry CLI")
	f.StringVar(&a.Host.StateDir, "state", "/var/lib/ferry", "state directory: the journal and, unless given apart, runc root, bundles, migration scratch")
	f.StringVar(&a.Host.BundlesDir, "bundles", "", "directory of the OCI bundles (config.json, root filesystem) of runc containers restored here (default: STATE/bundles); on ext4 without a journal keep it on another filesystem, since ext4 then scans past every inode freed in the last 30 s for each file it creates")
	f.BoolVar(&a.Admission.Privileged, "allow-privileged", false, "accept incoming containers whatever their config.json asks: OCI hooks (run as root here), host namespaces, bind mounts of any host path, extra capabilities, devices")
	f.BoolVar(&a.Admission.HostNetwork, "allow-host-network", false, "accept incoming containers that share the host's network namespace")
	f.StringSliceVar(&a.Admission.BindSources, "allow-bind", nil, "host directories incoming containers may bind-mount from (repeatable)")
	f.IntVar(&a.Limits.MaxPeerSessions, "max-peer-sessions", agent.DefaultLimits().MaxPeerSessions, "peers' sessions open at once; more are closed after the handshake")
	f.IntVar(&a.Limits.MaxIncoming, "max-incoming", agent.DefaultLimits().MaxIncoming, "migrations coming in at once; more offers are refused as busy")
	f.DurationVar(&a.Limits.IdleTimeout, "idle-timeout", agent.DefaultLimits().IdleTimeout, "close a peer's session with no migration or query open for this long")
	f.Var(units.BytesVar(&a.Admission.MaxMemoryBytes), "max-incoming-memory", "refuse offers announcing more memory than this (8G, 512M; 0: this host's RAM)")
	f.StringSliceVar(&segmentRanges, "segment-range", nil, "address ranges (CIDR) containers keeping their address may claim on --segment-bridge (repeatable); none: such containers are refused")
	// Each runtime's own flags (runc's --runc-root, containerd's --containerd, ...).
	a.Runtimes = all.Registry.Makers(f)
	f.StringVar(&a.Host.CgroupParent, "cgroup-parent", "ferry", "cgroup under which restored containers live")
	f.StringVar(&a.Host.NetNS, "netns", "", "network namespace path that restored containers join when their source joined one")
	f.StringVar(&a.Host.ScratchDir, "scratch", "/dev/shm/ferry", "where migrations keep CRIU images while they run; a tmpfs makes restores fast")
	f.BoolVar(&a.KeepWork, "keep-work", false, "keep received CRIU images and logs under --state/work (debugging)")
	f.BoolVar(&a.NoPrewarm, "no-prewarm", false, "do not touch the incoming container's amount of memory before restoring (helps on VMs whose balloon reclaims free pages)")
	f.StringVar(&tlsDir, "tls-dir", "", "directory with this host's certificate and the CA (made by ferry certs); sessions with other agents use mutual TLS 1.3")
	f.StringSliceVar(&allow, "allow", nil, "hosts (certificate names) allowed to send migrations here; empty: any host the CA signed")
	f.StringVar(&profile, "profile", "", "host profile from 'ferry-lab calibrate', used by --mode auto (default: built-in defaults)")
	f.BoolVar(&insecure, "insecure", false, "accept and make plaintext agent connections (trusted test networks only)")
	f.DurationVar(&outage, "outage-timeout", transport.DefaultOutageTimeout, "how long a migration waits out a network outage (every path down) before it aborts; within it the transfer resumes where it stopped")
	f.StringVar(&a.SegmentBridge, "segment-bridge", "", "bridge on this host to the L2 segment that containers with addresses of their own live on; they keep their address and TCP connections when they move here")
	f.BoolVar(&a.Multipath, "mptcp", true, "use MPTCP between agents where the kernel has it (falls back to TCP)")
	f.IntVar(&a.Streams, "streams", 4, "when a session does not run over MPTCP (the kernel or the peer lacks it, or --mptcp=false): stripe it over this many TCP connections, spread over the destination's --listen addresses, re-dialed when lost (1: a single connection)")
	costs.add(f)
	f.BoolVar(&a.AllowFaults, "allow-faults", false, "honour fault injection in requests (tests only)")
	f.StringVar(&logFormat, "log-format", "text", "log lines as text (key=value) or json, on standard error")
	f.StringVar(&logLevel, "log-level", "info", "least severe log level written: debug, info, warn or error")
	return cmd
}

// newLogger is the agent's logger: text or JSON lines on w, from level up.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// costFlags are the host's prices (api.Costs), given per GiB where the
// model counts bytes; the defaults are thesis 000's Table 7.2.
type costFlags struct{ cpu, cpuOffset, mem, storage, net float64 }

func (c *costFlags) add(f *pflag.FlagSet) {
	f.Float64Var(&c.cpu, "cost-cpu", 40, "price of a core a container keeps busy here, euros (ferry follow's cost model, C_CPU)")
	f.Float64Var(&c.cpuOffset, "cost-cpu-offset", 0.1, "load added to this host's own in the CPU price (O_CPU)")
	f.Float64Var(&c.mem, "cost-memory", 4.6, "price of a GiB of memory, euros (C_MEM)")
	f.Float64Var(&c.storage, "cost-storage", 0.1, "price of a GiB stored, euros (C_HDD)")
	f.Float64Var(&c.net, "cost-network", 0.0023, "price of a GiB received, euros (C_NET)")
}

func (c costFlags) apply() (api.Costs, error) {
	for name, v := range map[string]float64{"cost-cpu": c.cpu, "cost-cpu-offset": c.cpuOffset, "cost-memory": c.mem, "cost-storage": c.storage, "cost-network": c.net} {
		if !(v >= 0) {
			return api.Costs{}, fmt.Errorf("--%s %v: a price must not be negative", name, v)
		}
	}
	const gib = 1 << 30
	return api.Costs{CPUEurPerCore: c.cpu, CPUOffset: c.cpuOffset, MemEurPerByte: c.mem / gib, StorageEurPerByte: c.storage / gib, NetEurPerByte: c.net / gib}, nil
}

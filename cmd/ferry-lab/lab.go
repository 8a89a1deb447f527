package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/units"
)

func newLabCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Emulate several ferry hosts on this machine",
		Long: `lab builds a small network of emulated hosts on this machine, one network
namespace per host (ferry-h1, ferry-h2, ...), each with an address 10.77.0.N
on a bridge in the namespace ferry-sw, its own state directory under
/var/lib/ferry/lab/hN, its own cgroup parent (ferry-hN) and its own ferry
agent. Links can be shaped to a bandwidth in both directions. Nothing is
added to this machine's own network namespace.

Needs root.`,
		Example: `  ferry-lab lab up --hosts 3 --bandwidth 1gbit
  ferry-lab lab run h1 app -- memhog --memory 64M
  ferry-lab lab status
  ferry-lab lab down`,
	}
	cmd.AddCommand(newLabUpCmd(), newLabDownCmd(), newLabRunCmd(), newLabStatusCmd(), newLabExperimentCmd(), newLabSetRTTCmd())
	return cmd
}

func newLabUpCmd() *cobra.Command {
	var (
		o         lab.Options
		bandwidth string
		rtt       string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the lab's hosts, links and agents",
		Long: `up creates the switch, --hosts hosts plugged into it and one agent per host
(started from this ferry binary inside the host's namespace, logging to
/var/lib/ferry/lab/hN/agent.log), and waits until every agent answers on its
control socket /run/ferry/lab/hN.sock.

--bandwidth shapes each host's link with tbf in both directions. RATE is in
bits per second: 1gbit, 100mbit, 500M, 2.5g (k, M, G are decimal).

--rtt gives hosts' links a round trip through a delay line in user space
(this kernel has no netem): a relay process per host in ferry-sw holds
frames half the round trip each way, on every path and on the service
segment's uplink, so between hA and hB the round trip is the sum of
theirs. "20ms" for every host, or "h1=20ms,h2=50ms" (others
0). 'ferry-lab lab set-rtt' changes a host's while traffic flows; with
--delay-lines the relays start at 0 for it.

--kubernetes also brings up a Kubernetes 1.37 cluster over the hosts: h1 and
h2 are its nodes (a containerd 2.4 and a kubelet each, in the host's
namespace, pods on a CNI bridge of their own: 10.92.1.0/24, 10.92.2.0/24),
h3 runs etcd and the control plane (the apiserver at h3's address). Its
binaries come from scripts/kube-build.sh's cache (/var/cache/ferry/kube;
make test and make demo build it: about 10 minutes the first time on two
cores). The admin's kubeconfig is printed; run kubectl or clients inside a
lab host's namespace (nsenter --net=/run/netns/ferry-h3). Images come from
no registry: load them into the nodes' containerd (namespace k8s.io) and use
imagePullPolicy: Never. No kube-proxy, Services or DNS.

It fails if a lab is already up: run 'ferry-lab lab down' first.`,
		Example: `  ferry-lab lab up
  ferry-lab lab up --hosts 3 --bandwidth 1gbit
  ferry-lab lab up --bandwidth 100mbit
  ferry-lab lab up --kubernetes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Kubernetes && !cmd.Flags().Changed("hosts") {
				o.Hosts = 3
			}
			if bandwidth != "" {
				var err error
				if o.BandwidthBps, err = units.ParseRate(bandwidth); err != nil {
					return fmt.Errorf("--bandwidth: %w", err)
				}
			}
			if rtt != "" {
				rtts, err := lab.ParseRTTs(rtt)
				if err != nil {
					return fmt.Errorf("--rtt: %w", err)
				}
				o.RTT = lab.ExpandRTTs(rtts, o.Hosts)
				o.DelayLines = true
			}
			l, err := lab.Up(cmd.Context(), o)
			if err != nil {
				return err
			}
			link := "unshaped links"
			if l.BandwidthBps > 0 {
				link = "links shaped to " + units.FormatRate(l.BandwidthBps)
			}
			if l.Paths > 1 {
				link = fmt.Sprintf("%d paths, %s", l.Paths, link)
			}
			if l.DelayLines {
				link += ", delay lines"
			}
			fmt.Printf("lab up: %d hosts, %s\n", len(l.Hosts), link)
			for _, h := range l.Hosts {
				agent := "no agent"
				if h.AgentPID > 0 {
					agent = fmt.Sprintf("agent pid %d at %s, control %s", h.AgentPID, h.AgentAddr, h.ControlSock)
				}
				if l.DelayLines {
					agent += fmt.Sprintf(", rtt %v (delay line pid %d)", h.RTT, h.DelayLinePID)
				}
				fmt.Printf("  %s  %s  %s\n", h.Name, h.Addr, agent)
			}
			if l.Kubeconfig != "" {
				fmt.Printf("kubernetes: nodes h1, h2; control plane on h3; kubeconfig %s\n", l.Kubeconfig)
			}
			// ferry reads no lab state of its own accord: the state file
			// is a hosts file it takes host names from when told.
			fmt.Printf("agents run %s; to name the hosts in ferry's commands (ferry migrate app --from h1 --to h2):\n  export FERRY_HOSTS=%s\n", l.FerryBin, lab.StateFile)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Hosts, "hosts", 2, fmt.Sprintf("number of hosts (1-%d)", lab.MaxHosts))
	f.StringVar(&bandwidth, "bandwidth", "", "link rate, e.g. 1gbit, 100mbit, 500M (default unshaped)")
	f.IntVar(&o.Paths, "paths", 1, fmt.Sprintf("independent paths between hosts, each shaped to --bandwidth (1-%d); with 2 or more, agents use MPTCP over all", lab.MaxPaths))
	f.IntVar(&o.Streams, "streams", 0, "agents without MPTCP: stripe sessions over this many TCP connections (--mptcp=false --streams N)")
	f.BoolVar(&o.NoAgents, "no-agents", false, "create hosts and links only, start no agents")
	f.StringVar(&rtt, "rtt", "", "round trip of hosts' links through delay lines: 20ms (every host) or h1=20ms,h2=50ms")
	f.BoolVar(&o.DelayLines, "delay-lines", false, "put delay lines on every host's links (at 0 unless --rtt), for 'ferry-lab lab set-rtt'")
	f.BoolVar(&o.Kubernetes, "kubernetes", false, "also bring up a Kubernetes cluster: h1 and h2 its nodes, h3 its control plane (3 hosts unless --hosts says more)")
	return cmd
}

func newLabDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove the lab: containers, agents, namespaces, cgroups, state",
		Long: `down brings the lab's Kubernetes cluster down (its pods, kubelets,
containerds, control plane, cgroups and rules), deletes every container on
the lab's hosts, stops the agents and any
other process left in the lab's namespaces, deletes the namespaces (and with
them the links), removes the hosts' cgroups and /var/lib/ferry/lab and
/run/ferry/lab. It also cleans up after a crash, without the state file, and
does nothing when no lab is up.`,
		Example: `  ferry-lab lab down`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lab.Down(cmd.Context()); err != nil {
				return err
			}
			fmt.Println("lab down")
			return nil
		},
	}
}

func newLabRunCmd() *cobra.Command {
	var (
		ip       string
		progs    []string
		packages []string
		rootfs   string
		copyImg  bool
		kind     string
	)
	cmd := &cobra.Command{
		Use:   "run HOST NAME -- PROGRAM [ARGS...]",
		Short: "Start a container on a lab host",
		Long: `run starts container NAME on lab host HOST (h1, 1 or ferry-h1), running
PROGRAM with ARGS. The container gets a busybox root filesystem with ferry's
workload binaries (memhog) in /bin, joins the host's network namespace (so it
is reachable at the host's address) and lives under the host's cgroup parent.
With --ip it gets a network namespace of its own on the lab's L2 service
segment instead, with that address, which it keeps when it migrates (and
with it its TCP connections).
--rootfs debian gives it a Debian 12 minbase root filesystem instead, with
redis-server, redis-cli, python3 and ferry's workloads (in /usr/local/bin),
built once with mmdebstrap from the mirror apt uses and cached in
/var/cache/ferry/rootfs (the first time takes about a minute); --package
names the packages instead (one set per service keeps each root filesystem
small). The container's root is an overlay: the image, unpacked once under
/var/cache/ferry/rootfs/images and shared, below; its own layer above. A
migration moves only its own layer (every lab agent has the image there);
--copy-image copies the whole tree into the container instead, so that all
of it moves.
runc's messages about it go to /dev/shm/ferry-lab/bundles/HOST/NAME.log.
--runtime podman, lxc, containerd or docker runs it under that runtime
instead, the host's own instance (its agent moves it with --runtime, or
finds it by name): the busybox root filesystem, on the host's network. For
Podman, containerd and Docker it is an image, loaded into every lab host's
instance first (a move needs it at the destination).`,
		Example: `  ferry-lab lab run h1 app -- memhog --memory 64M
  ferry-lab lab run h1 web --ip 10.79.0.10 -- memhog --memory 64M --echo-port 7001
  ferry-lab lab run h1 db --ip 10.79.0.11 --with /usr/bin/redis-server -- redis-server --protected-mode no --save ""
  ferry-lab lab run h2 idle -- sleep 1000
  ferry-lab lab run h1 kv --rootfs debian --ip 10.79.0.12 -- redis-server --protected-mode no --save ""
  ferry-lab lab run h1 mc --rootfs debian --package memcached --ip 10.79.0.13 -- memcached -u memcache -m 256
  ferry-lab lab run h1 app --runtime containerd -- memhog --memory 64M   # then, with FERRY_HOSTS=/run/ferry/lab/state.json: ferry migrate app --from h1 --to h2 --runtime containerd`,
		Args: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash >= 0 && dash != 2 {
				return fmt.Errorf("want HOST NAME -- PROGRAM [ARGS...], got %d arguments before --", dash)
			}
			if len(args) < 3 {
				return fmt.Errorf("want HOST NAME -- PROGRAM [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if kind != "runc" && (ip != "" || rootfs != lab.RootfsBusybox || len(progs) > 0 || len(packages) > 0 || copyImg) {
				return cli.Usage(fmt.Errorf("--runtime %s runs the busybox root filesystem on the host's network: no --ip, --rootfs, --with, --package or --copy-image", kind))
			}
			l, err := lab.Load()
			if err != nil {
				return err
			}
			h, err := l.Host(args[0])
			if err != nil {
				return err
			}
			addr := h.Addr
			if kind != "runc" {
				if lab.NeedsImage(kind) {
					var names []string
					for _, lh := range l.Hosts {
						names = append(names, lh.Name)
					}
					if err := l.ImportWorkloadImage(cmd.Context(), kind, names...); err != nil {
						return err
					}
				}
				if err := l.RunIn(cmd.Context(), kind, h.Name, args[1], args[2:]); err != nil {
					return err
				}
				fmt.Printf("%s running on %s (%s) under %s\n", args[1], h.Name, addr, kind)
				return nil
			}
			o := lab.RunOptions{IP: ip, Rootfs: rootfs, Packages: packages, CopyImage: copyImg}
			if ip != "" {
				o.HostPrograms, addr = progs, ip
			}
			if rootfs == lab.RootfsDebian {
				// Built here, not inside RunWith, to show the first build's progress.
				if _, err := lab.EnsureDebianRootfs(cmd.Context(), lab.DebianOptions{Packages: packages, Log: os.Stderr}); err != nil {
					return err
				}
			}
			if err = l.RunWith(cmd.Context(), args[0], args[1], o, args[2:]); err != nil {
				return err
			}
			fmt.Printf("%s running on %s (%s), log %s\n", args[1], h.Name, addr, h.LogPath(args[1]))
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&progs, "with", nil, "with --ip: programs of this machine to copy in with their libraries (e.g. /usr/bin/redis-server)")
	cmd.Flags().StringVar(&rootfs, "rootfs", lab.RootfsBusybox, "root filesystem: "+lab.RootfsBusybox+" (small, static) or "+lab.RootfsDebian+" (Debian 12 minbase with redis-server, cached)")
	cmd.Flags().StringSliceVar(&packages, "package", nil, "with --rootfs "+lab.RootfsDebian+": Debian packages to install instead of the default set (e.g. memcached); each set is built once and cached")
	cmd.Flags().BoolVar(&copyImg, "copy-image", false, "with --rootfs "+lab.RootfsDebian+": copy the whole tree into the container instead of an overlay over the shared image (all of it moves)")
	cmd.Flags().StringVar(&ip, "ip", "", "an address of its own on the service segment ("+lab.SegmentSubnet+"1-199), kept across migrations")
	cmd.Flags().StringVar(&kind, "runtime", "runc", "runtime to run it under: "+runtime.JoinKinds(lab.RunnableKinds(), "or")+" (runc: the lab's own bundles; the others each host's own instance)")
	return cmd
}

func newLabStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "status",
		Short:   "Show the lab's hosts, agents and containers",
		Example: `  ferry-lab lab status`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := lab.Load()
			if err != nil {
				return err
			}
			link := "unshaped"
			if l.BandwidthBps > 0 {
				link = units.FormatRate(l.BandwidthBps) + " each way"
			}
			fmt.Printf("lab: %d hosts, links %s\n", len(l.Hosts), link)
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "HOST\tADDRESS\tNETNS\tAGENT\tCONTAINERS")
			for _, h := range l.Hosts {
				agent := "none"
				switch {
				case h.AgentAlive():
					agent = fmt.Sprintf("up (pid %d)", h.AgentPID)
				case h.AgentPID > 0:
					agent = fmt.Sprintf("DOWN (was pid %d)", h.AgentPID)
				}
				containers := "-"
				cs, err := h.Containers(cmd.Context())
				if err != nil {
					containers = "? " + err.Error()
				} else if len(cs) > 0 {
					var names []string
					for _, c := range cs {
						names = append(names, c.ID+" ("+c.Status+")")
					}
					containers = strings.Join(names, ", ")
				}
				if l.DelayLines {
					line := fmt.Sprintf("rtt %v", h.RTT)
					if !h.DelayLineAlive() {
						line = fmt.Sprintf("delay line DOWN (was pid %d; links cut)", h.DelayLinePID)
					}
					agent += ", " + line
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", h.Name, h.Addr, h.NetNSName, agent, containers)
			}
			return tw.Flush()
		},
	}
}

func newLabSetRTTCmd() *cobra.Command {
	var stats bool
	cmd := &cobra.Command{
		Use:   "set-rtt HOST RTT",
		Short: "Change the round trip of a host's links while the lab runs",
		Long: `set-rtt changes the round trip that HOST's delay line adds to its links
(half each way; between two hosts the round trip is the sum of theirs), for
frames from now on: those on the way keep their time and none overtakes
another. The lab must be up with --rtt or --delay-lines.`,
		Example: `  ferry-lab lab set-rtt h2 40ms
  ferry-lab lab set-rtt h1 0 --stats`,
		Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil {
				return err
			}
			l, err := lab.Load()
			if err != nil {
				return err
			}
			if err := l.SetRTT(args[0], d); err != nil {
				return err
			}
			fmt.Printf("%s: rtt %v\n", args[0], d)
			if stats {
				s, err := l.DelayLineStats(args[0])
				if err != nil {
					return err
				}
				for _, d := range s.Directions {
					fmt.Printf("  %s: passed %d frames (%d bytes), queued %d, dropped %d, send errors %d, socket drops %d\n",
						d.Name, d.Passed, d.PassedBytes, d.Queued, d.Dropped, d.SendErrors, d.SocketDrops)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&stats, "stats", false, "also show what the host's delay line passed and dropped")
	return cmd
}

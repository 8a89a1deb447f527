package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/api/client"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/follow"
)

func newFollowCmd() *cobra.Command {
	var (
		hosts       []string
		at          string
		trig        = follow.DefaultTrigger()
		cfg         follow.Config
		profilePath string
		state       string
		asJSON      bool
		quiet       bool
		tlsDir, op  string
	)
	cmd := &cobra.Command{
		Use:   "follow CONTAINER --hosts H1,H2,... --at H1",
		Short: "Move a container after its clients: to the cheapest host that brings them nearer",
		Long: `follow watches how far CONTAINER's clients are and moves it when they are too
far, to the cheapest host that brings them nearer (thesis 000's orchestration:
a latency trigger, then the cost model over the candidate hosts).

Every --interval the container's agent reads the round-trip time of the
container's client connections from the kernel (no change to the service;
--ports keeps only connections to its listening ports), or, for a service
without long-lived connections, probes --probe. When that latency stays above
--threshold for --dwell (a dip into the band below it, --hysteresis, does not
restart the dwell; one below it does), and the container last moved at least
--min-interval ago, follow decides. While the latency is too far it has the
container's agent assess every other host, so that the decision needs no
wait when the dwell ends:

  each candidate's agent probes the same clients (the median of 9 probes
  spread over half the dwell; the container's own host probes them the same
  way at the same time, which is what the candidates are compared with),
  says its idle cores, free memory and storage, and its prices (the agents'
  --cost-* settings); the container's agent measures the container (memory,
  dirty rate, CPU, the files that move) and the link to each candidate (a
  16 MiB probe and its round trip);

and weighs them. A candidate must bring the clients clearly nearer (below the
band, or by the hysteresis share), have the room, and have a technique that
ferry's model predicts within --max-downtime on its link; of those the
cheapest by the thesis' cost model (euros of CPU, memory, storage and
network) wins, ties going to the nearer host. The chosen host must then
reserve room for the container (refused: the next one is asked), and the
container moves with the technique the planner chose, under an ID follow
picks. Every decision is printed with each candidate's latency, load, cost,
predicted downtime and why it was or was not chosen (--json: one event a
line).

follow keeps where the container runs and a move under way in --state: killed
and started again it follows that move by its ID, never starting a second
one, and goes on from where the container is. One follow per container.

Limits: the latency is the mean over the container's clients, weighted by
their connections (a service whose clients are in several places follows the
crowd); candidates probe clients by ICMP echo (or --probe's TCP port), which
a client behind a firewall may not answer; prices are the agents' own
settings, not a market.`,
		Example: `  ferry follow redis --hosts h1,h2,h3 --at h1 --ports 6379 --threshold 30ms
  ferry follow web --hosts edge1@192.0.2.1:7070,edge2@192.0.2.2:7070 --at edge1 --tls-dir ~/.ferry/alice --probe 198.51.100.7 --max-downtime 200ms --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.Container, cfg.Trigger, cfg.At = args[0], trig, at
			prof, _, err := cli.LoadProfile(profilePath)
			if err != nil {
				return err
			}
			cfg.Profile = prof
			ag := &clientAgents{eps: map[string]client.Endpoint{}}
			for _, h := range hosts {
				ep, peer, err := (agentFlags{from: h, tlsDir: tlsDir, operator: op}).endpoints(h)
				if err != nil {
					return fmt.Errorf("--hosts %s: %w", h, err)
				}
				name, _, _ := strings.Cut(h, "@")
				cfg.Hosts = append(cfg.Hosts, follow.Host{Name: name, Peer: peer})
				ag.eps[name] = ep
			}
			cfg.Agents = ag
			if state == "" {
				state = filepath.Join("/var/lib/ferry/follow", cfg.Container+".json")
			}
			if err := os.MkdirAll(filepath.Dir(state), 0o755); err != nil {
				return err
			}
			cfg.Store = follow.FileStore(state)
			out := cmd.OutOrStdout()
			cfg.Events = func(e follow.Event) { printFollowEvent(out, e, asJSON, quiet) }
			l, err := follow.New(cfg)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if !asJSON {
				st := l.State()
				fmt.Fprintf(out, "following %q on %s (threshold %v, dwell %v, state %s)\n", cfg.Container, st.Host, trig.Threshold, trig.Dwell, state)
			}
			return l.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&hosts, "hosts", nil, "every host the container may run on: host names from $FERRY_HOSTS, or NAME@ADDR of their agents' listen addresses (with --tls-dir)")
	f.StringVar(&at, "at", "", "the host the container runs on now (needed until --state knows)")
	f.DurationVar(&trig.Threshold, "threshold", trig.Threshold, "the clients' latency above which they are too far (L_thr)")
	f.DurationVar(&trig.Dwell, "dwell", trig.Dwell, "how long the latency must stay too far before a move")
	f.Float64Var(&trig.Hysteresis, "hysteresis", trig.Hysteresis, "the band below --threshold, as a share of it, that does not restart the dwell; a candidate must also be nearer by this share")
	f.DurationVar(&trig.MinInterval, "min-interval", trig.MinInterval, "the least time between two moves")
	f.DurationVar(&cfg.Interval, "interval", time.Second, "time between latency samples")
	f.DurationVar(&cfg.MaxDowntime, "max-downtime", 0, "downtime budget: only techniques predicted within it (0: none)")
	f.IntSliceVar(&cfg.Ports, "ports", nil, "the container's listening ports whose connections are its clients (default: every inbound connection)")
	f.StringVar(&cfg.Probe, "probe", "", "IP (ICMP echo) or IP:PORT (TCP connect) to measure instead of the container's connections")
	f.StringVar(&cfg.Runtime, "runtime", api.RuntimeAuto, "the container's runtime (auto: found by name)")
	f.StringVar(&profilePath, "profile", "", "host profile from 'ferry-lab calibrate' for the predictions (default: built-in defaults)")
	f.StringVar(&state, "state", "", "file keeping where the container runs and a move under way (default /var/lib/ferry/follow/CONTAINER.json)")
	f.BoolVar(&asJSON, "json", false, "print every event as a JSON line")
	f.BoolVar(&quiet, "quiet", false, "print decisions and moves only, not every sample")
	f.StringVar(&tlsDir, "tls-dir", "", "with NAME@ADDR hosts: directory holding the operator's certificate and the CA (default $FERRY_TLS_DIR)")
	f.StringVar(&op, "operator", "", "with NAME@ADDR hosts: the operator certificate's name")
	f.StringSliceVar(&cfg.Faults, "fault", nil, "inject ACTION@PHASE into each migration (tests; agents with --allow-faults only)")
	_ = f.MarkHidden("fault")
	_ = cmd.MarkFlagRequired("hosts")
	return cmd
}

// clientAgents reaches the hosts' agents through api/client.
type clientAgents struct{ eps map[string]client.Endpoint }

func (c *clientAgents) Assess(ctx context.Context, h follow.Host, q api.AssessQuery) (api.Assessment, error) {
	return client.Assess(ctx, c.eps[h.Name], q)
}

func (c *clientAgents) Reserve(ctx context.Context, h follow.Host, r api.Reservation) (api.ReserveReply, error) {
	return client.Reserve(ctx, c.eps[h.Name], r)
}

func (c *clientAgents) Migrate(ctx context.Context, h follow.Host, req api.Request) (api.Report, error) {
	return client.Migrate(ctx, c.eps[h.Name], req, nil)
}

// printFollowEvent prints one event: a JSON line, or for people a line
// (a decision with its table of candidates).
func printFollowEvent(w io.Writer, e follow.Event, asJSON, quiet bool) {
	if asJSON {
		b, _ := json.Marshal(e)
		fmt.Fprintln(w, string(b))
		return
	}
	ts := e.Time.Format("15:04:05")
	switch e.Kind {
	case "sample":
		if !quiet {
			fmt.Fprintf(w, "%s %s %v: %s\n", ts, e.Host, msDuration(e.LatencyMs), e.Verdict.Reason)
		}
	case "decision":
		fmt.Fprintf(w, "%s %s decision: %s\n", ts, e.Host, e.Message)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  HOST\tLATENCY\tIDLE CORES\tFREE MEM\tLINK, RTT\tMODE\tPREDICTED DOWN\tCOST\tVERDICT")
		for _, c := range e.Placement.Candidates {
			mode, down, cost := "-", "-", "-"
			if c.Prediction != nil {
				mode, down = c.Mode, fmt.Sprintf("%.0f ms", c.Prediction.DowntimeMs)
			}
			if c.Cost != nil {
				cost = fmt.Sprintf("%.4g €", c.Cost.Euro)
			}
			verdict := "feasible"
			if c.Host == e.Placement.Chosen {
				verdict = "chosen"
			}
			if !c.Feasible() {
				verdict = strings.Join(c.Refused, "; ")
			}
			fmt.Fprintf(tw, "  %s\t%v\t%.1f/%.0f\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Host, c.Latency.Round(time.Microsecond), c.Cores-c.BusyCores, c.Cores,
				cli.HumanBytes(int64(c.FreeMemory)), cli.HumanRate(c.ThroughputBps)+" "+c.RTT.Round(100*time.Microsecond).String(), mode, down, cost, verdict)
		}
		_ = tw.Flush()
	default:
		fmt.Fprintf(w, "%s %s %s: %s\n", ts, e.Host, e.Kind, e.Message)
	}
}

// msDuration shows milliseconds as a duration (µs where they are small).
func msDuration(v float64) time.Duration {
	return time.Duration(v * float64(time.Millisecond)).Round(time.Microsecond)
}

package lab

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ferry-migrate/ferry/internal/delayline"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// A lab up with delay lines gives each host's links a round trip of its
// own: the kernel here has no netem, so a relay process per host
// (`ferry-lab lab-tool delay-line`, package delayline) sits in the switch
// between each of the host's ports and the bridge, holding frames half
// the host's round trip each way. Between hosts hA and hB the round trip
// is then RTT(hA) + RTT(hB). tbf keeps shaping the ports as without it.
//
// Per path p of host h, and likewise its service segment's uplink
// (hNsvc, hNsvcr, hNsvcb on brsvc), in the switch namespace:
//
//	host's ethP == switchPort (hN, tbf) <-relay-> hNr == hNb on brP
//
// The relay is a process of the switch's namespace, so Down stops it with
// everything else there even when the state file is lost.

// delayLineCommand is the relay's subcommand, also how Down tells a
// recorded PID is still that relay.
const delayLineCommand = "delay-line"

// relayPort and bridgedPort are the ends of a switch port's second veth
// pair: the one the relay holds and the one on the bridge.
func relayPort(port string) string   { return port + "r" }
func bridgedPort(port string) string { return port + "b" }

// segmentPort is host h's uplink's end in the switch: the service
// segment's traffic (containers' own addresses) crosses the host's delay
// line too, so a client reaching a container there sees the host's round
// trip.
func segmentPort(h *Host) string { return h.Name + "svc" }

// DelayLineSock is the control socket of the host's delay line.
func (h *Host) DelayLineSock() string { return filepath.Join(RunDir, h.Name+"-delay.sock") }

// DelayLineLog is where the host's delay line writes its output.
func (h *Host) DelayLineLog() string { return filepath.Join(h.StateDir, "delay-line.log") }

// checkRTTs checks Options.RTT against a lab of hosts hosts.
func checkRTTs(rtts map[string]time.Duration, hosts int) error {
	for name, d := range rtts {
		i, err := parseHostIndex(name)
		if err != nil {
			return err
		}
		if i > hosts {
			return fmt.Errorf("RTT for %s: the lab has h1..h%d", name, hosts)
		}
		if d < 0 || d > delayline.MaxRTT {
			return fmt.Errorf("RTT for %s: %v out of range (0 to %v)", name, d, delayline.MaxRTT)
		}
	}
	return nil
}

// addDelayLinePorts adds switch port port's second veth pair: one end on
// bridge, the other left for the relay; both up.
func addDelayLinePorts(sw *netlink.Handle, port, bridge string) error {
	relay, bridged := relayPort(port), bridgedPort(port)
	if err := sw.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: bridged}, PeerName: relay}); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", bridged, relay, err)
	}
	br, err := sw.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("switch: %w", err)
	}
	for _, name := range []string{bridged, relay} {
		link, err := sw.LinkByName(name)
		if err != nil {
			return fmt.Errorf("switch port %s: %w", name, err)
		}
		if name == bridged {
			if err := sw.LinkSetMaster(link, br); err != nil {
				return fmt.Errorf("enslave %s to %s: %w", name, bridge, err)
			}
		}
		if err := sw.LinkSetUp(link); err != nil {
			return fmt.Errorf("switch port %s up: %w", name, err)
		}
	}
	return nil
}

// delayLineArgs is the host's relay's command line after the binary.
func delayLineArgs(h *Host, paths int) []string {
	args := []string{"lab-tool", delayLineCommand, "--control", h.DelayLineSock(), "--rtt", h.RTT.String()}
	ports := []string{segmentPort(h)}
	for p := 0; p < paths; p++ {
		ports = append(ports, switchPort(h, p))
	}
	for _, port := range ports {
		args = append(args, "--pair", port+":"+relayPort(port))
	}
	return args
}

// startDelayLines starts each host's relay in the switch's namespace and
// waits until each answers on its control socket; their PIDs go into the
// state file as they start, for Down.
func (l *Lab) startDelayLines(ctx context.Context) error {
	for k := range l.Hosts {
		h := &l.Hosts[k]
		p, err := procs.StartDetached(append([]string{ToolBin(l.FerryBin)}, delayLineArgs(h, max(l.Paths, 1))...),
			netnsPath(SwitchNetNS), h.DelayLineLog(), nil)
		if err != nil {
			return fmt.Errorf("start the delay line of %s: %w", h.Name, err)
		}
		h.DelayLinePID = p.PID
		if err := l.save(); err != nil {
			return err
		}
		err = p.AwaitReady(ctx, 10*time.Second, 20*time.Millisecond, func(context.Context) error {
			_, err := delayline.GetRTT(h.DelayLineSock())
			return err
		})
		if err != nil {
			return fmt.Errorf("the delay line of %s: %w (see %s)", h.Name, err, h.DelayLineLog())
		}
	}
	return nil
}

// DelayLineAlive says whether the host's recorded delay line still runs.
func (h *Host) DelayLineAlive() bool {
	return procs.Alive(h.DelayLinePID) && procs.CmdlineHas(h.DelayLinePID, delayLineCommand, h.DelayLineSock())
}

// stopDelayLines stops the recorded relays that are still theirs.
func stopDelayLines(hosts []*Host) error {
	var pids []int
	for _, h := range hosts {
		if h.DelayLineAlive() {
			pids = append(pids, h.DelayLinePID)
		}
	}
	return procs.Terminate(pids, stopGrace)
}

// SetRTT gives host hostName's links a round trip of d (half each way)
// from now on, while traffic flows: frames already on the way keep their
// time, and none overtakes another.
func (l *Lab) SetRTT(hostName string, d time.Duration) error {
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	if !l.DelayLines {
		return errors.New("the lab has no delay lines: bring it up with --rtt or --delay-lines")
	}
	if err := delayline.SetRTT(h.DelayLineSock(), d); err != nil {
		return fmt.Errorf("%s: %w", h.Name, err)
	}
	h.RTT = d
	return l.save()
}

// DelayLineStats is what host hostName's delay line passed and dropped.
func (l *Lab) DelayLineStats(hostName string) (delayline.Stats, error) {
	h, err := l.Host(hostName)
	if err != nil {
		return delayline.Stats{}, err
	}
	if !l.DelayLines {
		return delayline.Stats{}, errors.New("the lab has no delay lines")
	}
	return delayline.GetStats(h.DelayLineSock())
}

// ParseRTTs parses `--rtt`: "20ms" for every host, or "h1=20ms,h2=50ms".
// A bare duration comes back under the key "*"; ExpandRTTs spreads it.
func ParseRTTs(s string) (map[string]time.Duration, error) {
	rtts := map[string]time.Duration{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, named := strings.Cut(item, "=")
		if !named {
			name, val = "*", item
		}
		d, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		if named {
			i, err := parseHostIndex(strings.TrimSpace(name))
			if err != nil {
				return nil, err
			}
			name = fmt.Sprintf("h%d", i)
		}
		rtts[name] = d
	}
	if len(rtts) == 0 {
		return nil, fmt.Errorf("%q: want a round trip (20ms) or host=rtt pairs (h1=20ms,h2=50ms)", s)
	}
	return rtts, nil
}

// ExpandRTTs gives every one of hosts hosts the round trip under "*", if
// any, unless named on its own.
func ExpandRTTs(rtts map[string]time.Duration, hosts int) map[string]time.Duration {
	all, ok := rtts["*"]
	out := map[string]time.Duration{}
	for k, v := range rtts {
		if k != "*" {
			out[k] = v
		}
	}
	if ok {
		for i := 1; i <= hosts; i++ {
			name := fmt.Sprintf("h%d", i)
			if _, named := out[name]; !named {
				out[name] = all
			}
		}
	}
	return out
}

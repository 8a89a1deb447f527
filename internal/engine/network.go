package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// A container with a network namespace of its own (not its host's) keeps
// its addresses across a migration: the source describes the namespace,
// the destination rebuilds it on its bridge to the shared L2 segment, CRIU
// carries the TCP connections (--tcp-established), the source's copy goes
// quiet before the destination's comes up, and a gratuitous ARP tells the
// segment where the address lives now.

// containerNetNS returns the network namespace a bundle's config.json
// joins, "" for a private one runc creates.
func containerNetNS(spec []byte) (string, error) {
	var s specs.Spec
	if err := json.Unmarshal(spec, &s); err != nil {
		return "", err
	}
	if s.Linux == nil {
		return "", nil
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path, nil
		}
	}
	return "", nil
}

// KeepsAddress says whether the container's address moves with it (a
// namespace ferry made on its segment, or a runtime's network both hosts
// share): it is handed over at the freeze, a round trip more while the
// container is down.
func KeepsAddress(c *runtime.Container, hostNetNS string) bool {
	if !runtime.HostLocal(c.Networks) && len(c.Networks) > 0 {
		return true
	}
	path, err := containerNetNS(c.Spec)
	return err == nil && path != "" && path != hostNetNS && strings.HasPrefix(filepath.Base(path), cnet.Prefix)
}

// prepareNetwork finds whether the container has a network of its own to
// carry along; a container in its host's namespace keeps using the
// destination host's.
func (m *migration) prepareNetwork(spec []byte) error {
	path, err := containerNetNS(spec)
	if err != nil || path == "" || path == m.host.NetNS {
		return err
	}
	if !strings.HasPrefix(filepath.Base(path), cnet.Prefix) {
		return fmt.Errorf("the container joins network namespace %s, which ferry did not make: ferry moves only the addresses of containers it plugged into the segment (names %s*)", path, cnet.Prefix)
	}
	desc, err := cnet.Describe(path)
	if err != nil {
		return fmt.Errorf("describe the container's network: %w", err)
	}
	m.netnsPath, m.network = path, &desc
	return nil
}

// prepareSegmentLinks notes the namespace of a container its runtime put
// on a segment both hosts share (runtime.Network not HostLocal): its
// address and connections move with it, so its links go down at the
// freeze (silenceSource).
func (m *migration) prepareSegmentLinks() error {
	shared := false
	for _, n := range m.ctr.Networks {
		shared = shared || !n.HostLocal
	}
	if !shared {
		return nil
	}
	ns := fmt.Sprintf("/proc/%d/ns/net", m.ctr.PID)
	spec, err := cnet.Describe(ns)
	if err == nil {
		err = cnet.BridgesOf(ns, &spec)
	}
	if err != nil {
		return fmt.Errorf("describe the container's network: %w", err)
	}
	m.links, m.linkSpec = ns, &spec
	return nil
}

// keepsAddress says the container keeps its address where it goes (a
// namespace ferry rebuilds on the segment, or a runtime's network on a
// segment both hosts share): its TCP connections move with it, and its
// network is kept quiet by ferry from the freeze (no CRIU network lock).
func (m *migration) keepsAddress() bool { return m.network != nil || m.linkSpec != nil }

// closesConnections says the container is on a network that ends at its
// host (runtime.Network.HostLocal): its connections are dumped to be
// restored closed.
func (m *migration) closesConnections() bool { return runtime.HostLocal(m.ctr.Networks) }

// silenceSource takes the frozen source copy's interfaces down, so only
// the destination's copy answers for the address.
func (m *migration) silenceSource() error {
	if m.linkSpec != nil {
		return cnet.SetLinks(m.links, *m.linkSpec, false)
	}
	if m.network == nil {
		return nil
	}
	return cnet.SetCarrier(filepath.Base(m.netnsPath), "", *m.network, false)
}

// wakeSource undoes silenceSource when the migration aborts, and claims
// the address back from a destination that took it at the freeze.
func (m *migration) wakeSource() {
	if m.linkSpec != nil {
		_ = cnet.SetLinks(m.links, *m.linkSpec, true)
	}
	if m.network != nil {
		_ = wake(m.netnsPath, *m.network)
	}
}

// WakeLinks brings back the links of a runtime's namespace that a
// migration took down at the freeze (journal.Entry.Links, with the
// bridges their peers left: LinkBridges), for the agent that resumes the
// source's copy after a restart.
func WakeLinks(nsPath string, bridges map[string]string) error {
	if nsPath == "" {
		return nil
	}
	spec, err := cnet.Describe(nsPath)
	if err != nil {
		return err
	}
	for i := range spec.Ifaces {
		spec.Ifaces[i].Bridge = bridges[spec.Ifaces[i].Name]
	}
	return cnet.SetLinks(nsPath, spec, true)
}

// linkBridges are the bridges the peers of the container's veths are on,
// for the journal.
func (m *migration) linkBridges() map[string]string {
	if m.linkSpec == nil {
		return nil
	}
	out := map[string]string{}
	for _, ifc := range m.linkSpec.Ifaces {
		if ifc.Bridge != "" {
			out[ifc.Name] = ifc.Bridge
		}
	}
	return out
}

// WakeNetwork turns a copy's network on and announces its address,
// outside a migration (its state gone with it): the source's resumed by
// the agent settling a migration left in doubt, a destination's kept
// after a restart (TakeOverNetwork). The namespace at nsPath says what to
// turn on.
func WakeNetwork(nsPath string) error {
	if nsPath == "" {
		return nil
	}
	spec, err := cnet.Describe(nsPath)
	if err != nil {
		return fmt.Errorf("describe the container's network: %w", err)
	}
	return wake(nsPath, spec)
}

func wake(nsPath string, spec cnet.Spec) error {
	if err := cnet.SetCarrier(filepath.Base(nsPath), "", spec, true); err != nil {
		return err
	}
	return cnet.Announce(nsPath, spec)
}

// SilenceNetwork takes the carrier of a destination's copy
// down before the copy is dropped: it may hold the address (taken at the
// freeze), and a restored copy's sockets, closed as its processes are
// killed, would send the peers a FIN or a reset from it, ending the
// connections the source's copy resumes with.
func SilenceNetwork(nsPath string) error {
	if nsPath == "" {
		return nil
	}
	if _, err := os.Stat(nsPath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	spec, err := cnet.Describe(nsPath)
	if err != nil {
		return err
	}
	return cnet.SetCarrier(filepath.Base(nsPath), "", spec, false)
}

// TakeOverNetwork readies the network of a copy a restarted destination
// keeps: the hold its dead agent left (which, unread, drops every packet)
// goes, the carrier comes up and the address is announced here.
func TakeOverNetwork(nsPath string) error {
	if nsPath == "" {
		return nil
	}
	if err := cnet.EndHold(nsPath); err != nil {
		return err
	}
	return WakeNetwork(nsPath)
}

// noteHold puts what the destination held in the report.
func (m *migration) noteHold(c Committed) {
	m.report.HeldPackets = c.HeldPackets
	if c.HoldError != "" {
		m.report.Warnings = append(m.report.Warnings, "the destination could not hold the container's packets between the freeze and the commit (its peers waited for retransmissions): "+c.HoldError)
	}
}

// handOverAddress has the destination take the container's address once
// the source froze, and waits until it did (a round trip and a netlink
// call there, 1.4-1.7 ms in the lab) before the source's copy is silenced.
// From the destination's announcement on, the peers' packets go there and
// are held until the commit; those still on their way here meet the frozen
// copy's sockets, whose queues the dump takes. Silenced first, the address
// answered nowhere for the 1-12 ms until the destination announced it,
// and a peer's segment lost then waited out its retransmission timer (200
// ms or more). Not frozen first, the copy's own packets after the
// announcement taught the switches its old port again. A destination that
// cannot hold the packets says so, and takes the address after its restore.
func (m *migration) handOverAddress() error {
	if m.network == nil {
		return nil
	}
	if err := m.ctl.Send(Step{Do: StepAddress}); err != nil {
		return err
	}
	if err := m.ctl.Recv(&AddressTaken{}); err != nil {
		return fmt.Errorf("the destination taking the container's address: %w", err)
	}
	return nil
}

// dropSourceNetwork deletes the source's namespace after the commit, if
// ferry made it (a namespace someone else made is theirs to remove).
func (m *migration) dropSourceNetwork() {
	if m.network != nil {
		_ = DropNetwork(m.netnsPath)
	}
}

// DropNetwork deletes a copy's namespace that ferry made (names with
// cnet.Prefix; one someone else made is theirs to remove): the source's
// after the commit or a settle that found the destination owned it, a
// destination's for a copy it dropped.
func DropNetwork(nsPath string) error {
	if nsPath == "" || !strings.HasPrefix(filepath.Base(nsPath), cnet.Prefix) {
		return nil
	}
	return cnet.Delete(filepath.Base(nsPath))
}

// prepareNetwork rebuilds the container's network namespace here, cut off
// from the segment until the restore.
func (in *incoming) prepareNetwork() error {
	if in.offer.Network == nil {
		return nil
	}
	if in.d.SegmentBridge == "" {
		return fmt.Errorf("the container has an address of its own, but %s has no bridge to the shared segment (agent --segment-bridge)", in.d.Host.Name)
	}
	// The address is announced on the segment: a source may claim only
	// what this host lets containers have.
	var addrs []string
	for _, ifc := range in.offer.Network.Ifaces {
		addrs = append(addrs, ifc.Addrs...)
	}
	if err := in.d.Admission.CheckAddresses(addrs); err != nil {
		return err
	}
	name := cnet.Name(in.d.Host.Name, in.offer.Container)
	// A leftover of an earlier failed attempt goes; one a process lives in
	// is a container's of this host, and is not touched.
	if err := cnet.DeleteUnused(name); err != nil {
		return fmt.Errorf("%s cannot rebuild the container's network: %w", in.d.Host.Name, err)
	}
	path, err := cnet.Create(name, "", in.d.SegmentBridge, *in.offer.Network)
	if err != nil {
		return fmt.Errorf("rebuild the container's network on %s: %w", in.d.Host.Name, err)
	}
	in.netnsPath = path
	// Held from now, not from the freeze: starting the hold takes
	// milliseconds (the queue, an iptables run), and a peer's packet that
	// came in that time would reach neither copy.
	h, err := cnet.HoldIncoming(path)
	if err != nil {
		// Without a hold the address waits for the restore, as before:
		// slower for the peers, never unsafe.
		in.holdErr = err.Error()
		in.d.log().Warn("cannot hold the container's packets: its address moves at the restore", "container", in.offer.Container, "error", err)
		return nil
	}
	in.hold = h
	return nil
}

// takeAddress brings the destination's copy of the network up once the
// source froze (handOverAddress), and says whether it did. The peers reach
// this host at once, where the hold (made with the namespace) queues what
// they send until the commit: their retransmissions wait in the queue
// instead of being lost, and are answered the moment the copy runs, not
// when a backed-off retransmission timer fires again. Nothing reaches the
// restored sockets before the commit, so a copy dropped before it never
// acknowledged anything. The source waits for this: only netlink and a
// packet socket run here.
func (in *incoming) takeAddress() (bool, error) {
	if in.netnsPath == "" || in.hold == nil {
		return false, nil // up after the restore (bringUpNetwork), if at all
	}
	return true, in.addressUp()
}

// bringUpNetwork turns the destination's copy of the network on and
// announces it once the restore is done, where it is not up yet: without
// a hold, nothing may reach the sockets before they are back.
func (in *incoming) bringUpNetwork() error {
	return in.addressUp()
}

// addressUp turns the copy's network on and announces it, once.
func (in *incoming) addressUp() error {
	if in.netnsPath == "" || in.up {
		return nil
	}
	if err := cnet.SetCarrier(filepath.Base(in.netnsPath), "", *in.offer.Network, true); err != nil {
		return err
	}
	in.up = true
	return cnet.Announce(in.netnsPath, *in.offer.Network)
}

// announceRuntimeNetworks announces the addresses the runtime gave the
// restored copy on its own networks (a Docker bridge). The runtime
// publishes the container's ports as it restores it, before the copy's
// link is up: a client's packets sent then make this host ask for the
// address in vain, and its neighbour entry stays failed until the next
// try, about a second later (measured: the copy answered 600-700 ms after
// the commit). The announcement fills the entry at once.
func (in *incoming) announceRuntimeNetworks(pid int) {
	if len(in.offer.Networks) == 0 || pid <= 0 {
		return
	}
	ns := fmt.Sprintf("/proc/%d/ns/net", pid)
	spec, err := cnet.Describe(ns)
	if err == nil {
		err = cnet.Announce(ns, spec)
	}
	if err != nil {
		in.d.log().Warn("announcing the restored copy's addresses", "container", in.offer.Container, "error", err)
	}
}

// releaseHeld delivers what the hold kept, once the copy runs; what
// arrives after passes at once (closeHold ends the hold after the commit).
func (in *incoming) releaseHeld() int {
	if in.hold == nil {
		return 0
	}
	n, err := in.hold.Release()
	if err != nil {
		in.d.log().Warn("releasing the packets held for the container", "container", in.offer.Container, "error", err)
	}
	return n
}

// closeHold removes a released hold's rule, off the commit's path.
func (in *incoming) closeHold() {
	if in.hold == nil {
		return
	}
	if err := in.hold.Close(); err != nil {
		in.d.log().Warn("ending the hold on the container's packets", "container", in.offer.Container, "error", err)
	}
	in.hold = nil
}

// dropHold lets go of a hold the migration did not release: the rule
// goes, and what it held with it.
func (in *incoming) dropHold() {
	if in.hold != nil {
		in.hold.Drop()
		in.hold = nil
	}
}

func (in *incoming) dropNetwork() { _ = DropNetwork(in.netnsPath) }

// silenceNetwork takes the copy's carrier down before it is discarded
// (SilenceNetwork).
func (in *incoming) silenceNetwork() {
	if in.up {
		if err := SilenceNetwork(in.netnsPath); err != nil {
			in.d.log().Warn("silencing the dropped copy's network", "container", in.offer.Container, "error", err)
		}
		in.up = false
	}
}

// networkMoves says what moving does to the container's place on each of
// its runtime's networks.
func networkMoves(nets []runtime.Network) []NetworkMove {
	var out []NetworkMove
	for _, n := range nets {
		out = append(out, NetworkMove{Network: n, Outcome: NetworkOutcome(n)})
	}
	return out
}

// NetworkOutcome says, in words, what moving does to a container on n.
func NetworkOutcome(n runtime.Network) string {
	if !n.HostLocal {
		return fmt.Sprintf("%s network %q is a segment both hosts share: address %s kept, with its established connections (the destination's network must have it free)", n.Driver, n.Name, n.Address)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s network %q ends at each host: the destination's runtime gives the container an address on its own %q", n.Driver, n.Name, n.Name)
	if n.Address != "" {
		fmt.Fprintf(&b, " (%s where it is free there and the network lets it be chosen)", n.Address)
	}
	b.WriteString("; established connections are closed, listening sockets kept")
	if len(n.Ports) > 0 {
		fmt.Fprintf(&b, "; ports %s published again at the destination (clients connected through the source's ports are disconnected and reconnect there)", strings.Join(n.Ports, ", "))
	}
	return b.String()
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/clientrtt"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/hostload"
	"github.com/ferry-migrate/ferry/internal/reserve"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// What an agent answers for following a service's clients (ferry
// follow): as the service's host, how far its clients are and what a
// move to each candidate would take (assess); as a candidate, its own
// round trips to those clients, its room and prices (answerCandidate);
// as a destination, its room held for a move on its way (reserve.Book,
// which the engine's Destination consults for every offer).

// ChanCandidate is a source agent asking a peer, as a candidate host,
// about itself (api.CandidateQuery -> api.CandidateReply).
const ChanCandidate = "candidate"

// probeSamples is how many probes a round trip is the median of
// (follow.ProbeSamples: fewer let noise make a host look nearer), spread
// over at most maxProbeSeconds.
const (
	probeSamples    = 9
	maxProbeSeconds = 60
)

// newRoom makes the host's reservation book over its measured load.
func (a *Agent) newRoom() (*reserve.Book, error) {
	m, err := hostload.NewMeter(a.Host.StateDir)
	if err != nil {
		return nil, err
	}
	return &reserve.Book{Free: func() (api.HostLoad, error) {
		l, err := m.Read()
		if err != nil {
			return api.HostLoad{}, err
		}
		return api.HostLoad{Cores: float64(l.CPUs), BusyCores: float64(l.CPUs) - l.CPUFree,
			FreeMemory: int64(l.MemAvailable), FreeStorage: int64(l.DiskFree)}, nil
	}}, nil
}

// assess answers ChanAssess for one of this host's containers.
func (a *Agent) assess(ctx context.Context, q api.AssessQuery) (api.Assessment, error) {
	var rt runtime.Runtime
	var c *runtime.Container
	var err error
	if q.Runtime == "" || q.Runtime == api.RuntimeAuto {
		rt, c, err = a.set.Find(ctx, q.Container)
	} else if rt, err = a.set.Get(q.Runtime); err == nil {
		c, err = rt.Inspect(ctx, q.Container)
	}
	if err != nil {
		return api.Assessment{}, err
	}
	if c.Status != "running" || c.PID <= 0 {
		return api.Assessment{}, fmt.Errorf("container %q is %s, not running", q.Container, c.Status)
	}
	as := api.Assessment{Host: a.Host.Name, Container: c.Name, Runtime: c.Runtime, Clients: []api.Client{}}
	if !q.NoClients {
		if as.Clients, err = a.clients(ctx, c.PID, q); err != nil {
			return api.Assessment{}, err
		}
	}
	as.LatencyMs = meanLatency(as.Clients)

	// The candidates answer while the workload is measured (a second).
	as.Candidates = make([]api.CandidateView, len(q.Candidates))
	var wg sync.WaitGroup
	for i, addr := range q.Candidates {
		wg.Go(func() { as.Candidates[i] = a.askCandidate(ctx, addr, as.Clients, q.ProbeSeconds) })
	}
	if len(q.Candidates) > 0 && len(as.Clients) > 0 {
		// This host probes its clients as the candidates do, at the same
		// time: the kernel's smoothed round trip, judged over the dwell
		// that made the service move, is not what a probe sees.
		wg.Go(func() {
			probed := make([]api.Client, len(as.Clients))
			errs := make([]error, len(as.Clients))
			every := time.Duration(q.ProbeSeconds / probeSamples * float64(time.Second))
			var each sync.WaitGroup
			for i, c := range as.Clients {
				each.Go(func() {
					probed[i], errs[i] = probeClient(ctx, c.Addr, every)
					probed[i].Conns = c.Conns
				})
			}
			each.Wait()
			if errors.Join(errs...) == nil {
				as.ProbedLatencyMs = meanLatency(probed)
			}
		})
	}
	var w engine.Workload
	var werr error
	if q.Workload {
		w, werr = engine.MeasureWorkload(c.PID, time.Second)
	}
	wg.Wait()
	if werr != nil {
		return api.Assessment{}, fmt.Errorf("measuring %q: %w", q.Container, werr)
	}
	as.MemoryBytes, as.DirtyRate, as.SharedBytes, as.Cores = w.MemoryBytes, w.DirtyRate, w.SharedBytes, w.Cores
	as.KeepsAddress = engine.KeepsAddress(c, a.Host.NetNS)
	if q.Workload {
		as.StateBytes = treeBytes(c.Rootfs)
		for _, v := range c.Volumes {
			as.StateBytes += treeBytes(v.Dir)
		}
	}
	in := engine.PlanFor(w.Inputs(), rt.Caps())
	as.NoLazyRestore, as.CopiesImages = in.NoLazyRestore, in.CopiesImages
	if a.room != nil {
		as.Load, _ = a.room.Load()
	}
	return as, nil
}

// clients measures the container's clients: its inbound connections'
// round trips from the kernel, or the operator's probe address.
func (a *Agent) clients(ctx context.Context, pid int, q api.AssessQuery) ([]api.Client, error) {
	if q.Probe != "" {
		c, err := probeClient(ctx, q.Probe, 0)
		if err != nil {
			return nil, err
		}
		return []api.Client{c}, nil
	}
	o := clientrtt.Options{Inbound: true}
	for _, p := range q.Ports {
		if p <= 0 || p > 65535 {
			return nil, fmt.Errorf("port %d is not a TCP port", p)
		}
		o.LocalPorts = append(o.LocalPorts, uint16(p))
	}
	cs, err := clientrtt.ClientsAt(fmt.Sprintf("/proc/%d/ns/net", pid), o)
	if err != nil {
		return nil, fmt.Errorf("reading the container's connections: %w", err)
	}
	if len(cs) == 0 {
		return nil, fmt.Errorf("the container has no client connections to measure (give a probe address for a service without long-lived connections)")
	}
	out := make([]api.Client, 0, len(cs))
	for _, c := range cs {
		out = append(out, api.Client{Addr: c.Addr.String(), Conns: c.Conns, RTTMs: units.Millis(c.RTT)})
	}
	return out, nil
}

// probeClient measures a round trip to HOST (ICMP echo) or HOST:PORT (TCP
// connects) from this host.
func probeClient(ctx context.Context, target string, every time.Duration) (api.Client, error) {
	host, o := target, clientrtt.ProbeOptions{Count: probeSamples, Interval: max(every, 20*time.Millisecond)}
	if h, p, err := net.SplitHostPort(target); err == nil {
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil || port == 0 {
			return api.Client{}, fmt.Errorf("probe %q: bad port", target)
		}
		host, o.Port = h, uint16(port)
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return api.Client{}, fmt.Errorf("probe %q: an IP address (or IP:PORT) is needed: %w", target, err)
	}
	r, err := clientrtt.Probe(ctx, addr.Unmap(), o)
	if err != nil {
		return api.Client{}, fmt.Errorf("probing %s: %w", target, err)
	}
	return api.Client{Addr: target, RTTMs: units.Millis(r.Median)}, nil
}

// askCandidate asks the agent at addr, as a peer, about itself, and
// measures the link to it.
func (a *Agent) askCandidate(ctx context.Context, addr string, clients []api.Client, probeSeconds float64) api.CandidateView {
	v := api.CandidateView{Addr: addr}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+time.Duration(probeSeconds*float64(time.Second)))
	defer cancel()
	sess, err := a.dialPeer(ctx, addr)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	defer sess.Close()
	ch, err := sess.Open(ChanCandidate)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	// The link is measured while the candidate probes the clients (over
	// its own path), not after: its probes take half the dwell, and a
	// link probe over a far link takes seconds of its own.
	var link struct {
		rtt time.Duration
		bps float64
		err error
	}
	var measured sync.WaitGroup
	measured.Go(func() {
		if link.rtt, link.err = linkRTT(ctx, addr); link.err != nil {
			link.err = fmt.Errorf("measuring the round trip to %s: %w", addr, link.err)
			return
		}
		if link.bps, link.err = engine.ProbeLink(sess); link.err != nil {
			link.err = fmt.Errorf("measuring the link to %s: %w", addr, link.err)
		}
	})
	q := api.CandidateQuery{ProbeSeconds: probeSeconds}
	for _, c := range clients {
		q.Clients = append(q.Clients, c.Addr)
	}
	var r api.CandidateReply
	err = ch.Send(q)
	if err == nil {
		err = ch.Recv(&r)
	}
	ch.Close()
	measured.Wait()
	if err != nil {
		v.Error = fmt.Sprintf("asking %s: %v", addr, err)
		return v
	}
	v.Host, v.Clients, v.Load, v.Costs = r.Host, r.Clients, r.Load, r.Costs
	// Weighted as the source's clients are.
	for i := range v.Clients {
		if i < len(clients) {
			v.Clients[i].Conns = clients[i].Conns
		}
	}
	v.LatencyMs = meanLatency(v.Clients)
	v.RTTMs, v.ThroughputBps = units.Millis(link.rtt), link.bps
	if link.err != nil {
		v.Error = link.err.Error()
	}
	return v
}

// linkRTT is the round trip to a peer's agent (NAME@HOST:PORT or
// HOST:PORT): the median of TCP handshakes with it, the kernel's own
// measure.
func linkRTT(ctx context.Context, peer string) (time.Duration, error) {
	if _, a, ok := strings.Cut(peer, "@"); ok {
		peer = a
	}
	ap, err := netip.ParseAddrPort(peer)
	if err != nil {
		return 0, fmt.Errorf("peer address %q: %w", peer, err)
	}
	r, err := clientrtt.Probe(ctx, ap.Addr().Unmap(), clientrtt.ProbeOptions{Port: ap.Port(), Count: 5, Interval: 10 * time.Millisecond})
	if err != nil {
		return 0, err
	}
	return r.Median, nil
}

// answerCandidate serves a source agent's ChanCandidate.
func (a *Agent) answerCandidate(ctx context.Context, ch *transport.Channel) {
	defer ch.Close()
	var q api.CandidateQuery
	if err := ch.Recv(&q); err != nil {
		return
	}
	if len(q.Clients) > 64 {
		_ = ch.Fail(fmt.Errorf("%d client addresses: at most 64", len(q.Clients)))
		return
	}
	r := api.CandidateReply{Host: a.Host.Name, Costs: a.Costs, Clients: make([]api.Client, len(q.Clients))}
	errs := make([]error, len(q.Clients))
	var wg sync.WaitGroup
	if !(q.ProbeSeconds >= 0) || q.ProbeSeconds > maxProbeSeconds {
		_ = ch.Fail(fmt.Errorf("probing for %v s: at most %v", q.ProbeSeconds, maxProbeSeconds))
		return
	}
	every := time.Duration(q.ProbeSeconds / probeSamples * float64(time.Second))
	for i, addr := range q.Clients {
		wg.Go(func() { r.Clients[i], errs[i] = probeClient(ctx, addr, every) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			_ = ch.Fail(err)
			return
		}
	}
	if a.room != nil {
		var err error
		if r.Load, err = a.room.Load(); err != nil {
			_ = ch.Fail(err)
			return
		}
	}
	_ = ch.Send(r)
}

// meanLatency is the clients' round trip weighted by their connections
// (a probed client counts once).
func meanLatency(cs []api.Client) float64 {
	var sum, n float64
	for _, c := range cs {
		w := float64(max(c.Conns, 1))
		sum += w * c.RTTMs
		n += w
	}
	if n == 0 {
		return 0
	}
	return sum / n
}

// treeBytes is the size of the regular files below dir (0 where it cannot
// be read): what a move sends of it at least.
func treeBytes(dir string) int64 {
	if dir == "" {
		return 0
	}
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

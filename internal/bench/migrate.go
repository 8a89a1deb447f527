// Package bench measures migrations end to end in the lab: a workload with
// a known memory size and dirty rate, a client-side probe, the migration,
// and the baselines ferry is compared against.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	agentclient "github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/runresult"
	"github.com/ferry-migrate/ferry/internal/runtime/podman"
	"github.com/ferry-migrate/ferry/internal/units"
)

// MigrateOptions describe one `ferry-lab bench migrate`.
type MigrateOptions struct {
	// Runtime runs the workload: runc (the lab's own bundles), podman,
	// lxc, containerd or docker (each lab host's own instance).
	Runtime     string
	Mode        string
	Precopy     engine.PrecopyOptions
	MemoryBytes int64
	// AgainstMemoryBytes, when set, has each repeat also migrate a
	// workload of this size, right after the one of MemoryBytes, so that
	// the two sizes share the machine's drift (MigrateResult.Against).
	AgainstMemoryBytes int64
	DirtyRate          int // pages per second
	BandwidthBps       int64
	Repeat             int
	Baselines          []string // "link", "podman", "paths"
	// Paths between the lab hosts (2+: MPTCP over all of them).
	Paths int
	// Streams, when set, has the agents stripe over that many TCP
	// connections instead of using MPTCP.
	Streams int
	// CutPathAt takes the source's first path down once this fraction of
	// the memory has been sent (0: never); it comes back after the run.
	CutPathAt float64
	// MaxBandwidthBps caps the migration's sending rate.
	MaxBandwidthBps int64
	// Outage takes every path of the source down for this long once
	// OutageAt of the memory has been sent.
	Outage   time.Duration
	OutageAt float64
	// OutageTimeout is the agents' --outage-timeout (0: their default).
	OutageTimeout time.Duration
	FerryBin      string
	// TCPClient gives the workload an address of its own on the lab's
	// service segment (runc only) and has a client on the third host hold
	// one TCP connection to it, a line every 10 ms echoed back: each run
	// reports the longest that client waited.
	TCPClient bool
	// Network is how the workload reaches its clients: "" or "host" (its
	// host's network), "bridge" (the runtime's default bridge, the probe's
	// port published). VolumeBytes, when set, gives it a named volume
	// holding that much (memhog's journal), written at VolumeRateBps
	// while it runs; each run's VERIFY reads it back (Run.VolumeOK).
	// Docker and Podman only, so far.
	Network       string
	VolumeBytes   int64
	VolumeRateBps int64
	// RTT is the round trip between the source and the destination, by
	// the lab's delay lines (0: none).
	RTT time.Duration
	// Log receives one line per step, for a human watching; nil for none.
	Log io.Writer
}

// What a bench run records: package runresult's, named here as the bench
// always named them.
type (
	Run              = runresult.Run
	LinkBaseline     = runresult.LinkBaseline
	PodmanBaseline   = runresult.PodmanBaseline
	PathsBaseline    = runresult.PathsBaseline
	Baselines        = runresult.Baselines
	RecreateBaseline = runresult.RecreateBaseline
	MigrateResult    = runresult.MigrateResult
)

const workloadPort = 7000

// Migrate runs the benchmark: a lab of three hosts (source, destination
// and a client that probes the workload), Repeat migrations from h1 to h2,
// the baselines, and the lab torn down again.
func Migrate(ctx context.Context, o MigrateOptions) (res MigrateResult, err error) {
	if o.Repeat < 1 {
		o.Repeat = 1
	}
	if o.Runtime == "kubernetes" {
		return migrateKubernetes(ctx, o)
	}
	if err := o.check(); err != nil {
		return res, err
	}
	res = o.emptyResult()
	var against *MigrateOptions
	if o.AgainstMemoryBytes > 0 {
		a := o
		a.MemoryBytes, a.AgainstMemoryBytes = o.AgainstMemoryBytes, 0
		against = &a
		ar := a.emptyResult()
		res.Against = &ar
	}
	o.logf("bringing up a 3-host lab (bandwidth %d bit/s, %d path(s))", o.BandwidthBps, max(o.Paths, 1))
	lo := lab.Options{Hosts: 3, BandwidthBps: o.BandwidthBps, Paths: o.Paths, OutageTimeout: o.OutageTimeout, Streams: o.Streams, FerryBin: o.FerryBin}
	if o.RTT > 0 {
		// Half on each host's link: h1 to h2 is o.RTT; the client on h3
		// has no delay of its own.
		lo.RTT = map[string]time.Duration{"h1": o.RTT / 2, "h2": o.RTT / 2}
	}
	l, down, err := upLab(ctx, lo)
	if err != nil {
		return res, err
	}
	defer down(&err)
	src, dst, client := &l.Hosts[0], &l.Hosts[1], &l.Hosts[2]
	if lab.NeedsImage(o.Runtime) {
		o.logf("importing the workload image into h1's and h2's %s", o.Runtime)
		if err := l.ImportWorkloadImage(ctx, o.Runtime, src.Name, dst.Name); err != nil {
			return res, err
		}
	}

	if slices.Contains(o.Baselines, "link") {
		o.logf("measuring the link h1 -> h2")
		bps, err := lab.MeasureLinkThroughput(ctx, l, src.Name, dst.Name, 3*time.Second)
		if err != nil {
			return res, fmt.Errorf("link baseline: %w", err)
		}
		res.Baselines.Link = &LinkBaseline{ThroughputBps: bps}
	}
	if slices.Contains(o.Baselines, "paths") {
		o.logf("measuring one path against MPTCP over %d paths", max(o.Paths, 1))
		pb, err := measurePaths(ctx, o.FerryBin, src, dst, max(o.Paths, 1))
		if err != nil {
			return res, fmt.Errorf("paths baseline: %w", err)
		}
		res.Baselines.Paths = &pb
	}
	for i := 0; i < o.Repeat; i++ {
		o.logf("run %d/%d: %s migration of %d MiB at %d pages/s", i+1, o.Repeat, o.Mode, o.MemoryBytes>>20, o.DirtyRate)
		r := o.RunOnce(ctx, l, src, dst, client, fmt.Sprintf("memhog-%d", i+1))
		o.logf("run %d/%d: ok=%v downtime %.0f ms, client downtime %.0f ms, total %.0f ms, state_ok=%v %s",
			i+1, o.Repeat, r.OK, r.DowntimeMs, r.ClientDowntimeMs, r.TotalMs, r.StateOK, r.Error)
		if o.TCPClient {
			o.logf("run %d/%d: TCP client's longest wait %.0f ms (%.2f x downtime), %d packets held", i+1, o.Repeat, r.TCPStallMs, r.TCPStallMs/max(r.DowntimeMs, 1), r.HeldPackets)
		}
		res.Runs = append(res.Runs, r)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if against != nil {
			o.logf("run %d/%d, against: %d MiB", i+1, o.Repeat, against.MemoryBytes>>20)
			r := against.RunOnce(ctx, l, src, dst, client, fmt.Sprintf("memhog-%d-against", i+1))
			o.logf("run %d/%d, against: ok=%v downtime %.0f ms, client downtime %.0f ms, total %.0f ms, state_ok=%v %s",
				i+1, o.Repeat, r.OK, r.DowntimeMs, r.ClientDowntimeMs, r.TotalMs, r.StateOK, r.Error)
			res.Against.Runs = append(res.Against.Runs, r)
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
		}
	}
	res.Summarize()
	if slices.Contains(o.Baselines, "podman") {
		o.logf("podman baseline: checkpoint --export, copy over the link, restore --import")
		pb := o.PodmanBaselineOnce(ctx, src, dst, client)
		o.logf("podman: downtime %.0f ms, client downtime %.0f ms, state_ok=%v %s", pb.DowntimeMs, pb.ClientDowntimeMs, pb.StateOK, pb.Error)
		res.Baselines.Podman = &pb
	}
	return res, nil
}

// check refuses options the lab cannot run, before any lab comes up.
func (o MigrateOptions) check() error {
	if _, err := lab.RuntimeOf(o.Runtime); err != nil {
		return err
	}
	for _, b := range o.Baselines {
		if b != "link" && b != "podman" && b != "paths" {
			return fmt.Errorf("unknown baseline %q (link, podman, paths)", b)
		}
	}
	if o.TCPClient && o.Runtime != "" && o.Runtime != "runc" {
		return fmt.Errorf("--tcp-client needs --runtime runc: the lab gives only its runc containers an address of their own")
	}
	switch o.Network {
	case "", "host", "bridge":
	default:
		return fmt.Errorf("unknown --network %q (host, bridge)", o.Network)
	}
	if (o.Network == "bridge" || o.VolumeBytes > 0) && o.Runtime != "docker" && o.Runtime != "podman" {
		return fmt.Errorf("--network bridge and --volume need --runtime docker or podman: the lab runs the other runtimes' containers on its hosts' networks, without volumes, so far")
	}
	if o.CutPathAt > 0 && o.Paths < 2 {
		return fmt.Errorf("--cut-path-at needs --paths 2 or more: with one path the migration has nothing to go on with")
	}
	return nil
}

// upLab brings up a bench's lab. down, deferred with the bench's named
// error, takes it down, and reports a failure to when nothing else failed.
func upLab(ctx context.Context, o lab.Options) (*lab.Lab, func(err *error), error) {
	l, err := lab.Up(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	return l, func(err *error) {
		if derr := lab.Down(context.WithoutCancel(ctx)); derr != nil && *err == nil {
			*err = fmt.Errorf("the bench ran, but the lab did not go down: %w", derr)
		}
	}, nil
}

func (o MigrateOptions) logf(format string, args ...any) { logTo(o.Log, format, args...) }

func (o MigrateOptions) workloadArgs() []string {
	return memhogArgs(o.MemoryBytes, o.DirtyRate, workloadPort)
}

// memhogArgs runs memhog in a lab container, answering on port.
func memhogArgs(memory int64, dirtyRate, port int) []string {
	return []string{"/bin/memhog", "--memory", strconv.FormatInt(memory, 10),
		"--dirty-rate", strconv.Itoa(dirtyRate), "--port", strconv.Itoa(port)}
}

// logTo writes a bench's progress line to w, where there is one.
func logTo(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "bench: "+format+"\n", args...)
	}
}

// With TCPClient: the workload's own address on the service segment, and
// its echo port.
const (
	tcpClientIP = lab.SegmentSubnet + "10"
	echoPort    = 7001
)

// workloadAddrs lists where the workload may answer: each host, on every
// path (a cut path leaves the others).
func workloadAddrs(paths int, hosts ...*lab.Host) []string {
	var out []string
	for p := 0; p < max(paths, 1); p++ {
		for _, h := range hosts {
			out = append(out, fmt.Sprintf("%s:%d", h.PathAddr(p), workloadPort))
		}
	}
	return out
}

// readyTimeout allows for filling the memory at a conservative 100 MiB/s.
func (o MigrateOptions) readyTimeout() time.Duration {
	return 30*time.Second + time.Duration(o.MemoryBytes/(100<<20))*time.Second
}

// RunOnce migrates one memhog container, name, from src to dst in lab l
// while a probe on client polls it (Migrate's Repeat calls it; an
// experiment calls it per grid point).
func (o MigrateOptions) RunOnce(ctx context.Context, l *lab.Lab, src, dst, client *lab.Host, name string) (r Run) {
	defer func() {
		cctx := context.WithoutCancel(ctx)
		_ = l.RemoveFrom(cctx, o.Runtime, src.Name, name)
		_ = l.RemoveFrom(cctx, o.Runtime, dst.Name, name)
	}()
	addrs := workloadAddrs(o.Paths, src, dst)
	var stream *StreamClient
	if o.TCPClient {
		defer func() {
			// The address goes with the container's namespace, for the next run.
			_ = cnet.Delete(cnet.Name(src.Name, name))
			_ = cnet.Delete(cnet.Name(dst.Name, name))
		}()
		if err := l.RunOnSegment(ctx, src.Name, name, tcpClientIP, nil, append(o.workloadArgs(), "--echo-port", strconv.Itoa(echoPort))); err != nil {
			r.Error = err.Error()
			return r
		}
		addrs = []string{fmt.Sprintf("%s:%d", tcpClientIP, workloadPort)}
	} else if o.Network == "bridge" || o.VolumeBytes > 0 {
		if err := o.runAttached(ctx, l, src, name); err != nil {
			r.Error = err.Error()
			return r
		}
	} else if err := l.RunIn(ctx, o.Runtime, src.Name, name, o.workloadArgs()); err != nil {
		r.Error = err.Error()
		return r
	}
	p, _, err := StartProbe(ctx, client, o.FerryBin, addrs, o.readyTimeout())
	if err != nil {
		r.Error = err.Error()
		return r
	}
	if o.TCPClient {
		if stream, err = StartStream(ctx, client, o.FerryBin, "stream", "--addr", fmt.Sprintf("%s:%d", tcpClientIP, echoPort)); err != nil {
			_, _ = p.Stop()
			r.Error = err.Error()
			return r
		}
	}
	// Let the dirtier run a moment so the dirty rate is steady.
	time.Sleep(300 * time.Millisecond)
	var cutAt, outageAt atomic.Int64
	var outageDone sync.WaitGroup
	progress := func(pr engine.Progress) {
		if o.CutPathAt > 0 && pr.Bytes >= int64(o.CutPathAt*float64(o.MemoryBytes)) && cutAt.CompareAndSwap(0, pr.Bytes) {
			if err := l.SetPath(src.Name, 0, false); err != nil {
				o.logf("cutting path 0 of %s: %v", src.Name, err)
			}
		}
		if o.Outage > 0 && pr.Bytes >= int64(o.OutageAt*float64(o.MemoryBytes)) && outageAt.CompareAndSwap(0, pr.Bytes) {
			outageDone.Add(1)
			go func() {
				defer outageDone.Done()
				o.logf("outage: every path of %s down for %v", src.Name, o.Outage)
				setAllPaths(l, src.Name, false)
				time.Sleep(o.Outage)
				setAllPaths(l, src.Name, true)
			}()
		}
	}
	defer func() {
		outageDone.Wait()
		setAllPaths(l, src.Name, true)
	}()
	rep, err := agentclient.Migrate(ctx, agentclient.Socket(src.ControlSock), engine.Request{Container: name, To: dst.AgentAddr, Mode: o.Mode, Runtime: o.Runtime,
		Precopy: o.Precopy, MaxBandwidthBps: o.MaxBandwidthBps}, progress)
	outageDone.Wait() // the probe's verdict includes the network's return
	setAllPaths(l, src.Name, true)
	time.Sleep(300 * time.Millisecond) // answers after the switch
	var sr labtool.StreamResult
	var serr error
	if stream != nil {
		sr, serr = stream.Stop()
		if serr == nil && !sr.OK {
			serr = fmt.Errorf("the TCP client's connection did not survive: %s", sr.Error)
		}
	}
	pr, perr := p.Stop()
	perr = errors.Join(perr, serr)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r = runresult.RunOf(rep)
	r.PathCutAtBytes, r.OutageAtBytes = cutAt.Load(), outageAt.Load()
	if perr != nil {
		r.Error = errors.Join(errors.New(r.Error), perr).Error()
		return r
	}
	r.TCPStallMs, r.HeldPackets = sr.MaxGapMs, rep.HeldPackets
	r.ClientDowntimeMs = pr.ClientDowntimeMs
	if !pr.GapFrom.IsZero() && !rep.StartedAt.IsZero() {
		r.ClientGapFromMs, r.ClientGapToMs = units.Millis(pr.GapFrom.Sub(rep.StartedAt)), units.Millis(pr.GapTo.Sub(rep.StartedAt))
	}
	r.StateOK = pr.StateOK
	r.ProbeReason = pr.Reason
	if o.VolumeBytes > 0 {
		// memhog's VERIFY reads back every record it wrote to the volume:
		// its state holds only if they all are there as written.
		ok := pr.StateOK && len(rep.Volumes) == 1
		r.VolumeOK = &ok
	}
	return r
}

// runAttached starts the workload in src's Docker or Podman on its
// default bridge (the probe's port published) and/or writing into a
// named volume.
func (o MigrateOptions) runAttached(ctx context.Context, l *lab.Lab, src *lab.Host, name string) error {
	args := o.workloadArgs()
	a := lab.Attachments{Bridge: o.Network == "bridge", Ports: []string{fmt.Sprintf("%d/udp", workloadPort)}}
	if o.VolumeBytes > 0 {
		a.VolumePath = "/data"
		rate := o.VolumeRateBps
		if rate <= 0 {
			rate = 1 << 20
		}
		args = append(args, "--journal", "/data/journal", "--journal-fill", strconv.FormatInt(o.VolumeBytes, 10),
			"--journal-rate", strconv.FormatInt(rate, 10))
	}
	return l.RunIn(ctx, o.Runtime, src.Name, name, args, a)
}

// PodmanBaselineOnce moves memhog the way Podman users do (checkpoint
// --export, the archive copied over the lab's link, restore --import),
// measured like ferry's migrations.
func (o MigrateOptions) PodmanBaselineOnce(ctx context.Context, src, dst, client *lab.Host) (pb PodmanBaseline) {
	const name, image = "memhog-podman", "localhost/ferry-memhog:latest"
	ps, pd := src.Podman(), dst.Podman()
	defer func() {
		cctx := context.WithoutCancel(ctx)
		_ = ps.Cleanup(cctx)
		_ = pd.Cleanup(cctx)
	}()
	fail := func(err error) PodmanBaseline { pb.Error = err.Error(); return pb }
	rootfsDir, err := os.MkdirTemp("", "ferry-podman-rootfs-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(rootfsDir)
	if err := lab.BuildRootfs(rootfsDir); err != nil {
		return fail(err)
	}
	for _, h := range []podman.Host{ps, pd} {
		if err := h.ImportRootfs(ctx, rootfsDir, image); err != nil {
			return fail(err)
		}
	}
	if err := ps.Run(ctx, name, image, o.workloadArgs()); err != nil {
		return fail(err)
	}
	p, _, err := StartProbe(ctx, client, o.FerryBin, workloadAddrs(o.Paths, src, dst), o.readyTimeout())
	if err != nil {
		return fail(err)
	}
	time.Sleep(300 * time.Millisecond)
	t, berr := podman.Baseline(ctx, ps, pd, name, func(ctx context.Context, from, to string) error {
		return copyOverLink(ctx, o.FerryBin, src, dst, from, to)
	})
	time.Sleep(300 * time.Millisecond)
	pr, perr := p.Stop()
	if berr != nil {
		return fail(berr)
	}
	pb = PodmanBaseline{DowntimeMs: t.DowntimeMs, CheckpointMs: t.CheckpointMs, CopyMs: t.CopyMs,
		RestoreMs: t.RestoreMs, ArchiveBytes: t.ArchiveBytes}
	if perr != nil {
		return fail(perr)
	}
	pb.ClientDowntimeMs, pb.StateOK = pr.ClientDowntimeMs, pr.StateOK
	return pb
}

// emptyResult is a result of o's with no run yet.
func (o MigrateOptions) emptyResult() MigrateResult {
	return MigrateResult{Runtime: o.Runtime, Mode: o.Mode, MemoryBytes: o.MemoryBytes, DirtyRate: o.DirtyRate, BandwidthBps: o.BandwidthBps, Paths: max(o.Paths, 1), Runs: []Run{},
		RTTMs:   float64(o.RTT) / float64(time.Millisecond),
		Network: o.Network, VolumeBytes: o.VolumeBytes}
}

// setAllPaths takes every path of a lab host down or up (an outage).
func setAllPaths(l *lab.Lab, host string, up bool) {
	for p := 0; p < max(l.Paths, 1); p++ {
		_ = l.SetPath(host, p, up)
	}
}

package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/images"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
	"github.com/ferry-migrate/ferry/internal/vmas"
)

// Source runs migrations of this host's containers to other hosts.
type Source struct {
	Host host.Config
	// Runtimes are the container runtimes on this host, by kind.
	Runtimes runtime.Set
	// Profile is this host's calibrated model profile, for mode auto.
	Profile *model.Profile
	// CurrentProfile, when set, gives the profile each migration plans
	// with at its start instead (the agent's, refitted as it learns).
	CurrentProfile func() model.Profile
	// Dial opens a session to a destination agent (TLS, MPTCP: the
	// agent's choice); nil means plain transport.Dial.
	Dial func(ctx context.Context, addr string) (*transport.Session, error)
	// KeepWork keeps each migration's local images and CRIU logs.
	KeepWork bool
	// Version is ferry's, for the reports.
	Version string
	// Journal records each migration's state before it acts on it, so a
	// restarted agent can finish or roll back (nil: none, tests only).
	Journal *journal.Journal
	// AllowFaults honours a request's injected faults (tests).
	AllowFaults bool
	// Lines are this host's lines of migrations (line.go); nil: a
	// request's line is not kept, and it never waits.
	Lines *Lines
	// VMAs reads the frozen container's memory flags, for the dump's
	// smaps snapshot (smaps.go); nil: no snapshot, CRIU reads smaps.
	VMAs *vmas.Reader
	// Log is where the source's migrations log (nil: slog's default).
	Log *slog.Logger
	// KeeperExe is the ferry binary, which runs each post-copy dump's
	// page keeper so that the pull outlives this agent (lazyrelay); "":
	// none, and a pull ends with the agent.
	KeeperExe string
	// CRIU is this host's CRIU as the agent found it, told to the
	// destination and checked against each technique (criucheck.go);
	// nil: not checked.
	CRIU *CRIUCaps
}

// migration is the source side's state for one run.
type migration struct {
	req  Request
	id   string
	host host.Config
	rts  runtime.Set
	rt   runtime.Runtime
	ctr  *runtime.Container
	// criu is this host's CRIU (Source.CRIU).
	criu *CRIUCaps
	// key names the technique (see techniques.go), tech is it.
	key  string
	tech technique
	// coldSwitchover is how cold would switch over here (mode auto may
	// choose cold after prepare resolved the options for pre-copy).
	coldSwitchover string
	// ticket is its place in its line (Request.Line), if any.
	ticket *ticket
	sess   *transport.Session
	ctl    *transport.Channel
	// images is the channel the dump's images go on, opened early.
	images *transport.Channel
	// trees are what syncs as files: the root filesystem, the volumes.
	trees    []*tree
	work     string
	progress func(Progress)
	// phaseBegun wakes the progress reporter when a phase begins.
	phaseBegun chan struct{}

	start    time.Time
	mu       sync.Mutex
	phases   []PhaseSpan
	phase    phaseName
	frozenAt time.Time
	report   Report
	// round is the last pre-copy round done, and predicted the downtime
	// a switchover after it would have had (0: none), for progress.
	round     *Round
	predicted time.Duration
	// pushLeft, while post-copy pushes, counts the pages not yet stored
	// at the destination.
	pushLeft func() int64
	// pageTransform, when set, carries the final dump's page stream to the
	// destination (pre-copy's deduplication).
	pageTransform func(dst io.Writer, src io.Reader) error
	// liftThrottle undoes auto-converge at the source, if it throttled;
	// throttled: it did (and journaled so first).
	liftThrottle func()
	throttled    bool
	// parentRound is the pre-dump the final dump builds on (native
	// pre-copy); -1 for none.
	parentRound int
	// dump is the lazy dump this migration started, if any; dumped the
	// runtime's handle on the last dump, which may still hold the container.
	dump   *lazyDump
	dumped runtime.Dump
	// keeperExe runs a lazy dump's page keeper (Source.KeeperExe).
	keeperExe string
	// log is the migration's logger (Source.Log).
	log *slog.Logger
	// smaps is the snapshot of the container's mappings the final dump
	// reads, vmas what reads their flags (smaps.go).
	smaps   *criu.SmapsSnapshot
	vmas    *vmas.Reader
	dial    func(ctx context.Context, addr string) (*transport.Session, error)
	profile model.Profile
	journal *journal.Journal
	// The container's own network, when it has one (see network.go).
	netnsPath string
	network   *cnet.Spec
	// links is the namespace of a container on a segment its runtime
	// attached it to (a Docker macvlan), whose links ferry takes down at
	// the freeze; linkSpec what it holds.
	links    string
	linkSpec *cnet.Spec
	// faults are the failures this migration injects here (tests).
	faults fault.Set
	// acks are the destination's acknowledgements of the state sent
	// while frozen, which the switchover does not wait for.
	acks pendingAcks
	// autoInputs are what mode auto measured and planned with (nil:
	// another mode); planned.go records the prediction from them.
	autoInputs *model.Inputs
}

// failure is an error with the phase and host where it happened.
type failure struct {
	where string
	err   error
}

func (f *failure) Error() string { return f.where + ": " + f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

func failAt(where string, err error) error {
	if err == nil {
		return nil
	}
	var f *failure
	if errors.As(err, &f) {
		return err
	}
	return &failure{where: where, err: err}
}

// NewID makes a migration ID.
func NewID() string { return newID() }

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidID says whether s looks like a migration ID newID made.
func ValidID(s string) bool {
	if len(s) != 12 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func (m *migration) since() float64 { return units.Millis(time.Since(m.start)) }

// phaseName names a phase of a source's migration: its report's phases
// and its progress show it (as api's strings), and the faults a test
// injects strike as it begins (fault.PhaseOf).
type phaseName string

// The phases, in the order a migration that has them goes through them;
// pre-copy's rounds (roundPhase) come before the freeze.
const (
	phasePrepare    phaseName = "prepare"
	phaseMeasure    phaseName = "measure" // mode auto (auto.go)
	phaseRootfsSync phaseName = "rootfs-sync"
	phaseQueued     phaseName = "queued" // waiting for the switchover's line (line.go)
	phaseFreeze     phaseName = "freeze"
	phaseDump       phaseName = "dump"
	phaseImages     phaseName = "images"
	phaseRestore    phaseName = "restore"
	phaseCommit     phaseName = "commit"
	phaseLazyPages  phaseName = "lazy-pages"
	phaseCleanup    phaseName = "cleanup"
)

// roundPhase is pre-copy's round i, from 0.
func roundPhase(i int) phaseName { return phaseName(fmt.Sprintf("round-%d", i)) }

// sourceState is what became of the source's copy (the report's
// SourceState; an agent that settles a migration in doubt says later).
type sourceState string

const (
	sourceRemoved sourceState = "removed" // after a commit
	sourceResumed sourceState = "resumed" // after a failure
	sourceFrozen  sourceState = "frozen"  // the outcome in doubt
	sourceLost    sourceState = "lost"    // it died before it could resume: no copy runs
)

// begin starts a named phase, ending the current one.
func (m *migration) begin(name phaseName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.since()
	if n := len(m.phases); n > 0 && m.phases[n-1].EndMs == 0 {
		m.phases[n-1].EndMs = now
	}
	m.phases = append(m.phases, PhaseSpan{Name: string(name), StartMs: now})
	m.phase = name
	select {
	case m.phaseBegun <- struct{}{}:
	default:
	}
	// Injected faults strike as a phase begins; the freeze's once the
	// container is frozen, the commit's once the commit is sent.
	if p := fault.PhaseOf(string(name)); p != fault.Freeze && p != fault.Commit {
		m.faults.At(fault.Source, p)
	}
}

func (m *migration) endPhases() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.phases); n > 0 && m.phases[n-1].EndMs == 0 {
		m.phases[n-1].EndMs = m.since()
	}
}

// reportProgress sends a progress line every interval until ctx ends.
func (m *migration) reportProgress(ctx context.Context, interval time.Duration) {
	if m.progress == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var last int64
	lastAt := time.Now()
	var rate float64
	for {
		tick := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			tick = true
		case <-m.phaseBegun: // a new phase is told at once
		}
		var b int64
		m.mu.Lock()
		sess := m.sess
		m.mu.Unlock()
		if sess != nil {
			b = sess.BytesSent()
		}
		if now := time.Now(); tick {
			rate = float64(b-last) * 8 / now.Sub(lastAt).Seconds()
			last, lastAt = b, now
		}
		m.progress(m.progressNow(b, rate))
	}
}

// progressNow is what a progress line says with b bytes sent at rate.
func (m *migration) progressNow(b int64, rate float64) Progress {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := Progress{Phase: string(m.phase), Bytes: b, RateBps: rate, MemoryBytes: m.report.MemoryEstimate,
		PredictedDowntimeMs: float64(m.predicted.Microseconds()) / 1000}
	if m.round != nil {
		p.Rounds, p.DirtyRate = m.round.Index+1, m.round.DirtyRate
	}
	if m.pushLeft != nil {
		p.LazyPagesPending = m.pushLeft()
	}
	p.Networks = m.report.Networks
	return p
}

// memoryFound records the memory the first round found.
func (m *migration) memoryFound(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.report.MemoryEstimate = n
}

// roundDone records round r (the i-th, after prev) for the report and the
// progress lines, with the downtime switchover predicts for a switchover
// after it (nil: none is predicted, as for post-copy's last round).
func (m *migration) roundDone(r Round, prev *Round, i int, switchover func(left, throughput float64) time.Duration) {
	var pred time.Duration
	if switchover != nil {
		if p, ok := predictSwitchover(r, prev, i, switchover); ok && p > 0 {
			pred = p
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.report.Rounds = append(m.report.Rounds, r)
	m.round, m.predicted = &r, pred
}

// Migrate moves req.Container to req.To and reports how it went. Whatever
// fails before the destination confirms leaves the container running here.
func (s *Source) Migrate(ctx context.Context, req Request, progress func(Progress)) Report {
	if !s.AllowFaults {
		req.Faults = nil // they reach the destination, which decides for itself
	}
	id := req.ID
	if !ValidID(id) {
		id = newID()
	}
	m := &migration{req: req, id: id, host: s.Host, journal: s.Journal, rts: s.Runtimes, progress: progress, start: time.Now(), parentRound: -1, dial: s.Dial, profile: model.DefaultProfile(), vmas: s.VMAs, keeperExe: s.KeeperExe, log: orDefault(s.Log), criu: s.CRIU,
		phaseBegun: make(chan struct{}, 1)}
	m.report = Report{SchemaVersion: ReportSchemaVersion, ID: id, StartedAt: m.start.UTC(), FerryVersion: s.Version,
		Container: req.Container, Mode: req.Mode, From: s.Host.Name, To: req.To}
	var ferr error
	if m.faults, ferr = fault.ParseSet(req.Faults); ferr != nil {
		r := m.report
		r.FailedAt, r.Error = "prepare on "+s.Host.Name, ferr.Error()
		return r
	}
	if s.Profile != nil {
		m.profile = *s.Profile
	}
	if s.CurrentProfile != nil {
		m.profile = s.CurrentProfile()
	}
	if m.dial == nil {
		m.dial = func(ctx context.Context, addr string) (*transport.Session, error) {
			c := transport.DefaultConfig()
			c.Hello = transport.Hello{Name: s.Host.Name, Role: "agent"}
			return transport.Dial(ctx, addr, c)
		}
	}
	m.ticket = s.Lines.join(req.Line)
	defer m.ticket.leave()
	pctx, stopProgress := context.WithCancel(ctx)
	go m.reportProgress(pctx, 200*time.Millisecond)
	err := m.run(ctx)
	m.closeWatches()
	if m.liftThrottle != nil {
		m.liftThrottle()
	}
	if m.throttled && m.frozenAt.IsZero() {
		m.recordFinal(journal.Resumed) // never frozen: it ran on, its throttle lifted
	}
	stopProgress()
	m.endPhases()
	r := &m.report
	if r.TotalMs == 0 || err != nil {
		r.TotalMs = m.since()
	}
	r.Phases = m.phases
	if m.sess != nil {
		r.BytesSent = m.sess.BytesSent()
		m.sess.Close()
	}
	if m.work != "" {
		pids, forced := criu.KillWorkingIn(m.work)
		if len(pids) > 0 {
			r.Warnings = append(r.Warnings, fmt.Sprintf("killed CRIU processes still working after the migration ended: %v", pids))
		}
		if len(forced) > 0 {
			r.Warnings = append(r.Warnings, fmt.Sprintf("CRIU %v still ran its code inside the container's processes %s after the migration ended and was killed all the same: they may not have survived it", forced, criu.InsidePatience))
		}
	}
	if m.work != "" && err != nil {
		dir, kerr := keepLogs(m.work, s.Host.LogsDir(), m.id)
		if kerr != nil {
			r.Warnings = append(r.Warnings, "logs not all kept: "+kerr.Error())
		}
		r.Logs = dir
	}
	if m.work != "" && !s.KeepWork {
		if err := mounts.RemoveAll(m.work); err != nil { // a killed CRIU's cgroup yard
			r.Warnings = append(r.Warnings, "scratch left behind: "+err.Error())
		}
	}
	if err != nil {
		r.OK = false
		r.Error = err.Error()
		var f *failure
		if errors.As(err, &f) {
			r.FailedAt = f.where
		}
	} else {
		r.OK = true
	}
	m.checkModel(r)
	return *r
}

func (m *migration) run(ctx context.Context) error {
	m.begin(phasePrepare)
	if err := m.prepare(ctx); err != nil {
		return failAt("prepare on "+m.host.Name, err)
	}
	defer criu.WarmBreakpoints()() // CRIU's dump stops the frozen tasks at breakpoints
	defer m.dropSmapsSnapshot()
	m.work = m.host.WorkDir(m.id)
	if err := os.MkdirAll(m.work, 0o700); err != nil {
		return failAt("prepare on "+m.host.Name, err)
	}
	sess, err := m.dial(ctx, m.req.To)
	if err != nil {
		return failAt("connect to destination", err)
	}
	m.mu.Lock() // the progress reporter reads it
	m.sess = sess
	m.mu.Unlock()
	if !strings.Contains(m.req.To, "@") {
		m.report.Warnings = append(m.report.Warnings, fmt.Sprintf("the destination was not named: any agent the CA vouches for was accepted at %s (name it: --to NAME@ADDR)", m.req.To))
	}
	m.sess.SetMaxBandwidth(m.req.MaxBandwidthBps)
	m.report.Transport = m.sess.Transport()
	m.ctl, err = m.sess.Open(ChanIncoming)
	if err != nil {
		return failAt("connect to destination", err)
	}
	offer := Offer{ID: m.id, Container: m.req.Container, Mode: m.req.Mode, SourceHost: m.host.Name,
		Runtime: m.ctr.Runtime, Spec: json.RawMessage(m.ctr.Spec), Image: m.ctr.Image, Meta: m.ctr.Meta,
		Faults: m.req.Faults, Precopy: m.req.Precopy, MemoryBytes: procs.TreeResident(m.ctr.PID), Network: m.network,
		Volumes: m.ctr.Volumes, Networks: m.ctr.Networks, Shared: m.ctr.Shared, SourceCRIU: m.criu}
	if err := m.ctl.Send(offer); err != nil {
		return failAt("offer to destination", err)
	}
	var acc Accept
	if err := m.ctl.Recv(&acc); err != nil {
		return failAt("destination "+m.sess.Peer.Name+" refused", err)
	}
	m.report.To = acc.Host
	if m.req.Mode == ModeAuto {
		mode, err := m.chooseMode(ctx)
		if err != nil {
			return failAt("plan", err)
		}
		m.req.Mode, m.report.Mode = mode, mode
		if mode == ModeCold {
			m.req.Precopy.Switchover = m.coldSwitchover
		}
		if m.key, m.tech, err = techniqueFor(mode, m.req.Precopy, m.rt); err != nil {
			return m.abort(ctx, failAt("plan", err))
		}
		if err := m.ctl.Send(Step{Do: StepMode, Mode: mode, Precopy: &m.req.Precopy}); err != nil {
			return failAt("plan", err)
		}
		var again Accept
		if err := m.ctl.Recv(&again); err != nil {
			return failAt("destination "+m.sess.Peer.Name+" refused", err)
		}
	} else if m.req.MaxFrozen > 0 {
		if err := m.checkFrozenBound(); err != nil {
			return m.abort(ctx, failAt("plan", err))
		}
	}
	// A destination that checked its own CRIU has; this is for the
	// source's (mode auto's technique) and what the two CRIUs exchange.
	if err := criuRefusal(m.key, criu.Source, m.host.Name, m.criu, acc.Host, acc.CRIU, false); err != nil {
		return m.abort(ctx, failAt("plan", err))
	}
	// Opened now, used while frozen: a new channel carries 256 KiB until
	// the destination's first window update (yamux's initial window), a
	// round trip after it opened; a dump's images are often more.
	if m.images, err = m.sess.Open(ChanImages); err != nil {
		return m.abort(ctx, failAt("connect to destination", err))
	}
	return m.tech.source(m, ctx)
}

// prepare finds the container in its runtime, settles the technique and
// refuses what this host or the runtime cannot do, before anything is
// frozen or sent.
func (m *migration) prepare(ctx context.Context) error {
	if err := validateMode(m.req.Mode); err != nil {
		return err
	}
	if l := m.req.Line; l != nil && l.Handoff != "" && l.Handoff != HandoffCommit && l.Handoff != HandoffFreeze {
		return fmt.Errorf("unknown handoff %q (commit, freeze)", l.Handoff)
	}
	var err error
	switch kind := m.req.Runtime; kind {
	case "", RuntimeAuto:
		m.rt, m.ctr, err = m.rts.Find(ctx, m.req.Container)
	default:
		if m.rt, err = m.rts.Get(kind); err == nil {
			m.ctr, err = m.rt.Inspect(ctx, m.req.Container)
		}
	}
	if err != nil {
		return err
	}
	m.report.Runtime = m.rt.Kind()
	if m.ctr.Status != "running" {
		return fmt.Errorf("%s container %q is %s, only running containers migrate", m.rt.Kind(), m.req.Container, m.ctr.Status)
	}
	if err := m.makeTrees(); err != nil {
		return err
	}
	if err := shareddir.Identify(m.ctr.Shared); err != nil {
		return err
	}
	m.mu.Lock() // the progress reporter reads it
	m.report.Networks = networkMoves(m.ctr.Networks)
	m.report.Shared = m.ctr.Shared
	m.mu.Unlock()
	caps := m.rt.Caps()
	m.req.Precopy.Engine = precopyEngine(m.req.Precopy.Engine, caps)
	m.coldSwitchover = ColdSwitchover(m.req.Precopy.Switchover, caps)
	m.req.Precopy.Switchover = precopySwitchover(m.req.Precopy, caps)
	// Predictions (the stop rule, mode auto) follow what this migration
	// can use.
	m.profile.SoftDirty = caps.PreDump
	m.profile.LazyDump = m.req.Precopy.Switchover == SwitchoverRebuild
	m.profile.WriteTracking = m.req.Precopy.WriteTracking != TrackingOff && dirty.Available() == nil
	if err := m.validatePrecopy(caps); err != nil {
		return err
	}
	if m.req.Mode == ModeCold {
		m.req.Precopy.Switchover = m.coldSwitchover
	}
	if m.req.Mode != ModeAuto {
		if m.key, m.tech, err = techniqueFor(m.req.Mode, m.req.Precopy, m.rt); err != nil {
			return err
		}
		if err := criuRefusal(m.key, criu.Source, m.host.Name, m.criu, "", nil, false); err != nil {
			return err
		}
	}
	// A container on its runtime's own networks has the namespace its
	// runtime made, which the destination's runtime makes anew.
	if err := m.prepareSegmentLinks(); err != nil {
		return err
	}
	if m.ctr.Spec != nil && len(m.ctr.Networks) == 0 {
		if err := m.prepareNetwork(m.ctr.Spec); err != nil {
			return err
		}
	}
	return nil
}

// precopyEngine resolves "auto" against what the runtime can do here.
func precopyEngine(asked string, c runtime.Caps) string {
	if asked == "" || asked == PrecopyAuto {
		if c.PreDump {
			return PrecopyNative
		}
		return PrecopyContent
	}
	return asked
}

// precopySwitchover resolves "auto" (or nothing) for the content engine.
func precopySwitchover(o PrecopyOptions, c runtime.Caps) string {
	if o.Engine != PrecopyContent {
		return ""
	}
	if o.Switchover == "" || o.Switchover == PrecopyAuto {
		if c.Freeze && c.LazyDump {
			return SwitchoverRebuild
		}
		return SwitchoverDump
	}
	return o.Switchover
}

// ColdSwitchover resolves cold's: rebuild (coldRebuild) where asked, and
// by default where the runtime's restore copies its images and can
// restore lazily from the destination's own (it then copies no memory);
// otherwise CRIU's dump with the pages streaming.
func ColdSwitchover(asked string, c runtime.Caps) string {
	if asked == SwitchoverRebuild || asked == SwitchoverDump {
		return asked
	}
	if c.CopiesImages && c.Freeze && c.LazyDump && c.LazyRestore {
		return SwitchoverRebuild
	}
	return SwitchoverDump
}

func validateMode(mode string) error {
	switch mode {
	case ModeCold, ModePostcopy, ModePrecopy, ModeHybrid, ModeAuto:
		return nil
	}
	return fmt.Errorf("unknown mode %q (choose cold, precopy, postcopy, hybrid or auto)", mode)
}

// validatePrecopy refuses pre-copy options this host cannot honour, before
// anything is frozen.
func (m *migration) validatePrecopy(c runtime.Caps) error {
	o := m.req.Precopy
	switch o.Engine {
	case PrecopyContent:
	case PrecopyNative:
		if !c.PreDump {
			return fmt.Errorf("--precopy-engine native needs CRIU's pre-dump with soft-dirty page tracking, which this kernel (CONFIG_MEM_SOFT_DIRTY) or the %s runtime lacks; use content", m.rt.Kind())
		}
	default:
		return fmt.Errorf("unknown pre-copy engine %q (auto, native, content)", o.Engine)
	}
	switch o.Switchover {
	case "", SwitchoverDump:
	case SwitchoverRebuild:
		if !c.LazyDump || !c.Freeze {
			return fmt.Errorf("--switchover rebuild needs CRIU's lazy dump of a frozen container, which the %s runtime cannot do here (fs.pipe-max-size below %d, or no userfaultfd: see ferry check); use dump", m.rt.Kind(), criu.MinLazyPipeSize)
		}
	default:
		return fmt.Errorf("unknown --switchover %q (auto, rebuild, dump)", o.Switchover)
	}
	if o.Compress != "" && o.Compress != "none" && o.Compress != "zstd" {
		return fmt.Errorf("unknown --compress %q (none, zstd)", o.Compress)
	}
	switch o.WriteTracking {
	case "", TrackingAuto, TrackingOff:
	default:
		return fmt.Errorf("unknown --write-tracking %q (auto, off)", o.WriteTracking)
	}
	if o.MaxRounds < 0 || o.MinRoundBytes < 0 || o.MaxDowntime < 0 {
		return fmt.Errorf("pre-copy limits must not be negative")
	}
	return nil
}

// syncRootfsLive is every technique's first step: the root filesystem,
// synced while the container runs; then, in a line, its turn.
func (m *migration) syncRootfsLive(ctx context.Context) error {
	m.begin(phaseRootfsSync)
	m.watchTrees()
	if err := m.syncTrees(true); err != nil {
		return m.abort(ctx, failAt("rootfs sync", err))
	}
	return m.awaitTurn(ctx)
}

// liveRoundsBesideRootfs is pre-copy's and hybrid's start: the live
// rounds and, beside them, the live root filesystem sync, which they need
// nothing of (its apply at the destination, a file at a time, took 80-300
// ms here, time the link no longer idles through). Both end before the
// freeze. In a line, waiting for its turn, the sync goes first instead,
// beside the memory of the migration before this one.
func (m *migration) liveRoundsBesideRootfs(ctx context.Context) (*precopySource, error) {
	if !m.ticket.ready() {
		if err := m.syncRootfsLive(ctx); err != nil {
			return nil, err
		}
		return m.liveRounds(ctx)
	}
	m.watchTrees()
	synced := make(chan error, 1)
	go func() { synced <- m.syncTrees(true) }()
	rs, err := m.liveRounds(ctx)
	if err != nil {
		m.sess.Close() // the abort is told: end the sync's transfer too
		<-synced
		return nil, err
	}
	if err := <-synced; err != nil {
		rs.close()
		return nil, m.abort(ctx, failAt("rootfs sync", err))
	}
	return rs, nil
}

// awaitTurn waits, in a line, until the memory of enough migrations
// before this one has crossed (line.go).
func (m *migration) awaitTurn(ctx context.Context) error {
	if m.ticket == nil {
		return nil
	}
	m.begin(phaseQueued)
	if err := m.ticket.wait(ctx); err != nil {
		return m.abort(ctx, failAt("queued", withdrawn(err)))
	}
	return nil
}

// freeze stops the container's processes; until commit, resume undoes it.
func (m *migration) freeze(ctx context.Context) error {
	m.planAtFreeze()
	m.begin(phaseFreeze)
	if err := ctx.Err(); err != nil {
		return failAt("freeze on "+m.host.Name, fmt.Errorf("cancelled before the freeze (the agent is stopping, or the request was withdrawn): %w", err))
	}
	m.takeSmapsSnapshot()
	// Recorded first: an agent that dies with the container frozen finds
	// it in its journal when it starts again.
	if err := m.record(journal.Frozen); err != nil {
		return failAt("freeze on "+m.host.Name, err)
	}
	m.frozenAt = time.Now()
	// A runtime that cannot freeze without dumping has the dump freeze the
	// container; the source is resumable through the dump then (Release).
	if m.rt.Caps().Freeze {
		if err := m.rt.Freeze(ctx, m.ctr); err != nil {
			m.frozenAt = time.Time{}
			return failAt("freeze on "+m.host.Name, err)
		}
	}
	m.faults.At(fault.Source, fault.Freeze)
	// Frozen, the container's kernel sockets would still acknowledge data
	// the dump no longer sees: take its own network quiet first, once the
	// destination took the address.
	if err := m.handOverAddress(); err != nil {
		return failAt("freeze on "+m.host.Name, err)
	}
	if err := m.silenceSource(); err != nil {
		return failAt("freeze on "+m.host.Name, err)
	}
	if m.tech.rounds && m.ticket.handsOffAtFreeze() {
		m.ticket.leave() // what is left of its memory is small
	}
	return nil
}

// sendImages ships the images directory (all but pages already streamed):
// every dump's, streamed (dumpStreaming) or lazy (shipLazyDump).
func (m *migration) sendImages() error {
	ch := m.images
	defer ch.Close()
	if _, err := images.SendDir(ch, filepath.Join(m.work, "images"), isLog); err != nil {
		return failAt("send images", err)
	}
	return failAt("send images", ch.CloseWrite())
}

// switchover asks the destination to restore, then commits: the source copy
// is removed only once the destination acknowledged the commit.
func (m *migration) switchover(ctx context.Context) error {
	rs, err := m.requestRestore(ctx)
	if err != nil {
		return err
	}
	if rs.PagesLocal+rs.PagesFetched > 0 {
		m.report.PagesReferenced, m.report.PagesFetched, m.report.FillMs = rs.PagesLocal, rs.PagesFetched, rs.FillMs
		m.report.MemoryBytes = rs.MemoryBytes
	}
	m.report.RestoreFromOwnImages = rs.FromOwnImages
	if err := m.commit(ctx); err != nil {
		return err
	}
	if rs.FromOwnImages {
		// The copy runs while its memory arrives from the destination's
		// own images (localpull.go); this one stays, frozen, until that
		// ended, so that a pull that fails leaves a whole copy here.
		m.begin(phaseLazyPages)
		var done LazyDone
		if err := m.ctl.Recv(&done); err != nil {
			return m.inDoubt(failAt("lazy pages", fmt.Errorf("lost the destination while its copy's memory arrived from its images: %w", err)))
		}
		m.report.PagesFaulted = done.Faulted
		if done.Error != "" {
			return m.pullFailed(ctx, done)
		}
	}
	m.report.FrozenMs = units.Millis(time.Since(m.frozenAt))
	return m.removeSource(ctx)
}

// pendingAcks are the destination's acknowledgements of the state sent
// while frozen beside a memory-less dump (the root filesystem's last
// changes, the final round), read in the background: the source asks for
// the restore as soon as it has sent that state, not a round trip later.
// That is safe because the destination restores only once every one of
// its receivers ended well (incoming.run), and a receiver's failure is
// told on the control channel, which the source reads next (the restore's
// answer): the acknowledgements say nothing the restore's answer does not.
// They are still read, and checked before the commit.
type pendingAcks struct {
	mu    sync.Mutex
	waits []*pendingAck
}

type pendingAck struct {
	ended chan struct{}
	err   error // with where it was due
}

// expect reads one acknowledgement in the background with wait (nil:
// none is due).
func (p *pendingAcks) expect(where string, wait func() error) {
	if wait == nil {
		return
	}
	a := &pendingAck{ended: make(chan struct{})}
	go func() {
		a.err = failAt(where, wait())
		close(a.ended)
	}()
	p.mu.Lock()
	p.waits = append(p.waits, a)
	p.mu.Unlock()
}

// wait returns once every acknowledgement expected was read or failed,
// with the first failure, the destination's refusal before any other.
func (p *pendingAcks) wait() error {
	var first error
	for _, a := range p.all() {
		<-a.ended
		if first == nil {
			first = a.err
		}
	}
	if refused := p.refused(); refused != nil {
		return refused
	}
	return first
}

// refused is the first acknowledgement, among those in, that the
// destination refused (transport.IsRemote): it says why the state it was
// for did not arrive.
func (p *pendingAcks) refused() error {
	for _, a := range p.all() {
		select {
		case <-a.ended:
			if transport.IsRemote(a.err) {
				return a.err
			}
		default:
		}
	}
	return nil
}

func (p *pendingAcks) all() []*pendingAck {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waits
}

// commit hands the container to the destination, recorded before it is
// asked. The destination's copy runs from its answer on (restored stopped
// until then); once the commit may have reached it, whether that copy is
// dropped (its commit window passing) or kept (its agent restarted) is
// the destination's to say, so a lost answer leaves the source in doubt.
func (m *migration) commit(ctx context.Context) error {
	if err := m.sendCommit(ctx); err != nil {
		return err
	}
	c, err := m.commitAnswer()
	if err != nil {
		return m.inDoubt(failAt("commit", err))
	}
	m.committed(c)
	return nil
}

// sendCommit records the commit and sends it; from here the destination
// may run the container.
func (m *migration) sendCommit(ctx context.Context) error {
	m.begin(phaseCommit)
	// Arrived before the restore's answer: no wait, but no commit over a
	// piece of state the destination did not take.
	if err := m.acks.wait(); err != nil {
		return m.abort(ctx, err)
	}
	// Only a cancel stops it here (the gate): an agent told to stop
	// runs a migration past its restore request to its end.
	if !commitGate(ctx).pass() {
		return m.abort(ctx, failAt("commit", errors.New("cancelled before the commit: the destination drops its copy")))
	}
	if err := m.smapsSnapshotHeld(); err != nil {
		return m.abort(ctx, failAt("dump on "+m.host.Name, err))
	}
	if err := m.record(journal.CommitSent); err != nil {
		return m.abort(ctx, failAt("commit", err))
	}
	if err := m.ctl.Send(Step{Do: StepCommit}); err != nil {
		return m.inDoubt(failAt("commit", err))
	}
	m.faults.At(fault.Source, fault.Commit)
	return nil
}

// commitAnswer waits for the destination's word on the commit.
func (m *migration) commitAnswer() (Committed, error) {
	var c Committed
	if err := m.ctl.Recv(&c); err != nil {
		return c, fmt.Errorf("%w: the destination may or may not run the container", err)
	}
	return c, nil
}

// committed notes the destination's word: its copy runs.
func (m *migration) committed(c Committed) {
	m.noteHold(c)
	m.report.DowntimeMs = units.Millis(time.Since(m.frozenAt))
	if m.tech.rounds {
		m.ticket.leave() // its downtime is over, its memory across
	}
}

// requestRestore asks the destination to restore and waits until it says
// the container runs; downtime ends there. The destination reports a
// failure of its own only after it discarded what it made, so the source
// resumes then; when the destination goes silent instead (its agent or
// the link gone), it may have restored the container before, and resuming
// here could run it twice: the source copy stays frozen, in doubt.
func (m *migration) requestRestore(ctx context.Context) (Restored, error) {
	m.begin(phaseRestore)
	var rs Restored
	if err := ctx.Err(); err != nil {
		return rs, m.abort(ctx, failAt("restore", fmt.Errorf("cancelled before the restore (the agent is stopping, or the request was withdrawn): %w", err)))
	}
	if err := m.ctl.Send(Step{Do: StepRestore}); err != nil {
		// Part of it may have arrived: the destination may be restoring.
		return rs, m.inDoubt(failAt("restore", fmt.Errorf("%w (the request may have reached the destination, so it may run the container)", err)))
	}
	if err := m.ctl.Recv(&rs); err != nil {
		where := "restore on " + m.sess.Peer.Name
		if transport.IsRemote(err) {
			// A piece of state the destination refused, if it refused
			// one, says more (abort); by now its receivers ended, or its
			// session closes: the wait is short.
			_ = m.acks.wait()
			return rs, m.abort(ctx, failAt(where, err))
		}
		return rs, m.inDoubt(failAt(where, fmt.Errorf("%w (the destination went silent after it was asked to restore, so it may run the container)", err)))
	}
	m.report.DowntimeMs = units.Millis(time.Since(m.frozenAt))
	m.report.RestoreMs = rs.RestoreMs
	m.report.PagesLastWritten, m.report.LastWritesMs = rs.LastWrites, rs.LastWritesMs
	return rs, nil
}

// inDoubt ends a migration whose outcome this side cannot know: the
// source copy stays frozen, and the report says so.
func (m *migration) inDoubt(cause error) error {
	if m.dump != nil {
		m.dump.stop() // CRIU ends; the container stays frozen
	}
	m.report.SourceState = string(sourceFrozen)
	m.report.FrozenMs = units.Millis(time.Since(m.frozenAt))
	if err := m.record(journal.InDoubt); err != nil {
		cause = errors.Join(cause, err)
	}
	m.report.InDoubtID = m.id
	// Not thawing it is the point: the destination may run it already. A
	// person who wants it settled sooner asks the agent, which asks the
	// destination (ferry resolve), never the runtime.
	return fmt.Errorf("%w; the source copy stays frozen until the destination says what became of its copy: do not resume it by hand, it may run there already (this agent keeps asking; `ferry resolve %s` asks now)", cause, m.id)
}

// record writes the migration's state to the journal before the source
// acts on it.
func (m *migration) record(state string) error {
	if m.journal == nil {
		return nil
	}
	return m.journal.Record(journal.Entry{ID: m.id, Role: journal.Source, Peer: m.req.To,
		Container: m.ctr.Name, Runtime: m.rt.Kind(), Options: m.req.RuntimeOptions[m.rt.Kind()], State: state, NetNS: m.netnsPath, Links: m.links, LinkBridges: m.linkBridges(), Throttled: m.throttled,
		Volumes: m.removedVolumes(), Pull: m.keptPull()})
}

// recordFinal records a final state; one that cannot be written only
// leaves the agent to check the container again when it restarts.
func (m *migration) recordFinal(state string) {
	if err := m.record(state); err != nil {
		m.report.Warnings = append(m.report.Warnings, err.Error())
	}
}

// removeSource deletes the frozen source copy once the destination owns the
// container. The migration is complete before this cleanup: total_ms ends
// here, and the deletion shows as the "cleanup" phase.
func (m *migration) removeSource(ctx context.Context) error {
	m.report.TotalMs = m.since()
	m.begin(phaseCleanup)
	if m.dump != nil {
		m.dump.stop() // CRIU lets go of the container before it is deleted
	}
	rctx := context.WithoutCancel(ctx)
	if m.dumped != nil {
		if err := m.dumped.Release(rctx, true); err != nil {
			m.report.Warnings = append(m.report.Warnings, "ending the source's dump: "+err.Error())
		}
	}
	c := *m.ctr
	c.Volumes = nil
	if !m.req.KeepVolumes {
		c.Volumes = m.ctr.Volumes
	}
	if err := m.rt.Remove(rctx, &c); err != nil {
		m.report.SourceState = string(sourceFrozen)
		return failAt("remove source copy", err)
	}
	m.report.SourceState = string(sourceRemoved)
	m.recordFinal(journal.Removed)
	m.dropSourceNetwork()
	return nil
}

// abort tells the destination to drop its copy and resumes the source.
func (m *migration) abort(ctx context.Context, cause error) error {
	if refused := m.acks.refused(); refused != nil {
		// The destination refused a piece of the frozen state: what failed
		// here after that (its session closing under a transfer) followed.
		cause = refused
	} else if m.sess != nil && m.sess.Lost() {
		// Whatever broke locally (CRIU's socket, a channel), the cause is
		// the connection: say so first.
		where, inner := "transfer", cause
		var f *failure
		if errors.As(cause, &f) {
			where, inner = f.where, f.err
		}
		cause = &failure{where: where, err: fmt.Errorf("the connection to %s was lost (peer gone, or no traffic for the outage timeout of %v): %w",
			m.sess.Peer.Name, m.sess.OutageTimeout(), inner)}
	}
	if m.ctl != nil {
		_ = m.ctl.Fail(cause)
	}
	if m.frozenAt.IsZero() {
		return cause
	}
	// The caller's context may be the one that failed: resuming must not.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m.report.FrozenMs = units.Millis(time.Since(m.frozenAt))
	if m.dump != nil {
		m.dump.stop() // CRIU must be gone before the container thaws
	}
	m.wakeSource()
	var rerr error
	if m.dumped != nil {
		rerr = m.dumped.Release(rctx, false)
	}
	if m.rt.Caps().Freeze {
		rerr = errors.Join(rerr, m.rt.Thaw(rctx, m.ctr))
	}
	// A CRIU that died with its code inside the container's processes
	// left them spinning where it injected a system call (patch 0015):
	// they get their own registers back now that they are thawed.
	if rescued, err := criu.RescueWithin(m.host.RescueDir(), time.Second); len(rescued) > 0 || err != nil {
		m.log.Warn("processes a dead CRIU left were put back", "migration", m.id, "pids", rescued, "error", err)
	}
	// Report what is true: an interrupted CRIU may have thawed the
	// container already, and a thaw that "worked" may not have.
	st, serr := runtime.State(rctx, m.rt, m.ctr.Name)
	if serr == nil && st == "running" {
		// A process the thaw only just let run may die of what a killed
		// CRIU left in it (runtime.State): look again.
		time.Sleep(100 * time.Millisecond)
		if again, err := runtime.State(rctx, m.rt, m.ctr.Name); err == nil {
			st = again
		}
	}
	if serr == nil && st == "running" {
		m.report.SourceState = string(sourceResumed)
		m.recordFinal(journal.Resumed)
		return cause
	}
	if serr == nil && st == "stopped" {
		// Its processes died: a CRIU killed while its code ran inside
		// them takes them along. No commit was sent, and the destination
		// drops its copy: the container runs nowhere.
		m.report.SourceState = string(sourceLost)
		m.recordFinal(journal.Lost)
		return errors.Join(cause, fmt.Errorf("the source copy's processes died before it could resume (its init %d is gone, dead or dumping core), and the destination has no copy: the container runs nowhere; %s", m.ctr.PID, m.restartHint()))
	}
	m.report.SourceState = string(sourceFrozen)
	if serr != nil {
		st = serr.Error()
	}
	return errors.Join(cause, fmt.Errorf("the source copy did not resume (%s; %v): %s", st, rerr, m.thawHint()))
}

// restartHint tells an operator how to start a lost container again.
func (m *migration) restartHint() string {
	return fmt.Sprintf("start the %s container %q again with its runtime (its memory is gone)", m.rt.Kind(), m.ctr.Name)
}

// thawHint tells an operator how to take a frozen source copy back.
func (m *migration) thawHint() string {
	return fmt.Sprintf("thaw the %s container %q with its runtime to take it back", m.rt.Kind(), m.ctr.Name)
}

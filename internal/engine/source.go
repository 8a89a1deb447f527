package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/rootfs"
	"github.com/ferry-migrate/ferry/internal/runtime/runc"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// Source runs migrations of this host's containers to other hosts.
type Source struct {
	Host host.Config
	// DirtyTracking says the kernel tracks dirty pages (soft-dirty), so
	// CRIU's native pre-dump works here.
	DirtyTracking bool
	// LazyDump says CRIU's lazy dump works here (fs.pipe-max-size large
	// enough), which post-copy, hybrid and pre-copy's rebuild switchover use.
	LazyDump bool
	// Profile is this host's calibrated model profile, for mode auto.
	Profile *model.Profile
	// Dial opens a session to a destination agent (TLS, MPTCP: the
	// agent's choice); nil means plain transport.Dial.
	Dial func(ctx context.Context, addr string) (*transport.Session, error)
	// KeepWork keeps each migration's local images and CRIU logs.
	KeepWork bool
}

// migration is the source side's state for one run.
type migration struct {
	req      Request
	id       string
	host     host.Config
	rt       runc.Host
	sess     *transport.Session
	ctl      *transport.Channel
	bundle   string
	work     string
	progress func(Progress)

	start    time.Time
	mu       sync.Mutex
	phases   []PhaseSpan
	phase    string
	frozenAt time.Time
	report   Report
	initPID  int
	// pageTransform, when set, carries the final dump's page stream to the
	// destination (pre-copy's deduplication).
	pageTransform func(dst io.Writer, src io.Reader) error
	// liftThrottle undoes auto-converge at the source, if it throttled.
	liftThrottle func()
	// parentRound is the pre-dump the final dump builds on (native
	// pre-copy); -1 for none.
	parentRound   int
	dirtyTracking bool
	lazyDump      bool
	// dump is the lazy dump this migration started, if any.
	dump    *lazyDump
	dial    func(ctx context.Context, addr string) (*transport.Session, error)
	profile model.Profile
	// The container's own network, when it has one (see network.go).
	netnsPath string
	network   *cnet.Spec
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

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (m *migration) since() float64 { return ms(time.Since(m.start)) }

// begin starts a named phase, ending the current one.
func (m *migration) begin(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.since()
	if n := len(m.phases); n > 0 && m.phases[n-1].EndMs == 0 {
		m.phases[n-1].EndMs = now
	}
	m.phases = append(m.phases, PhaseSpan{Name: name, StartMs: now})
	m.phase = name
}

func (m *migration) endPhases() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.phases); n > 0 && m.phases[n-1].EndMs == 0 {
		m.phases[n-1].EndMs = m.since()
	}
}

func (m *migration) currentPhase() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.phase
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
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			var b int64
			if m.sess != nil {
				b = m.sess.BytesSent()
			}
			rate := float64(b-last) * 8 / now.Sub(lastAt).Seconds()
			last, lastAt = b, now
			m.progress(Progress{Phase: m.currentPhase(), Bytes: b, RateBps: rate})
		}
	}
}

// Migrate moves req.Container to req.To and reports how it went. Whatever
// fails before the destination confirms leaves the container running here.
func (s *Source) Migrate(ctx context.Context, req Request, progress func(Progress)) Report {
	req.Precopy.Engine = s.precopyEngine(req.Precopy.Engine)
	req.Precopy.Switchover = s.precopySwitchover(req.Precopy)
	m := &migration{req: req, id: newID(), host: s.Host, rt: s.Host.Runc(), progress: progress, start: time.Now(), parentRound: -1, dirtyTracking: s.DirtyTracking, lazyDump: s.LazyDump, dial: s.Dial, profile: model.DefaultProfile()}
	if s.Profile != nil {
		m.profile = *s.Profile
	}
	m.profile.SoftDirty = s.DirtyTracking
	// Predictions (the stop rule, mode auto) follow the switchover this
	// migration uses.
	m.profile.LazyDump = req.Precopy.Switchover == SwitchoverRebuild
	if m.dial == nil {
		m.dial = func(ctx context.Context, addr string) (*transport.Session, error) {
			return transport.Dial(ctx, addr, transport.Hello{Name: s.Host.Name, Role: "agent"})
		}
	}
	m.report = Report{Container: req.Container, Mode: req.Mode, From: s.Host.Name, To: req.To}
	pctx, stopProgress := context.WithCancel(ctx)
	go m.reportProgress(pctx, 200*time.Millisecond)
	err := m.run(ctx)
	if m.liftThrottle != nil {
		m.liftThrottle()
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
	if m.work != "" && !s.KeepWork {
		os.RemoveAll(m.work)
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
	return *r
}

func (m *migration) run(ctx context.Context) error {
	m.begin("prepare")
	if err := validateMode(m.req.Mode); err != nil {
		return failAt("prepare on "+m.host.Name, err)
	}
	if err := m.validatePrecopy(); err != nil {
		return failAt("prepare on "+m.host.Name, err)
	}
	st, err := m.rt.State(ctx, m.req.Container)
	if errors.Is(err, runc.ErrNotFound) {
		return failAt("prepare on "+m.host.Name, fmt.Errorf("no container %q on this host", m.req.Container))
	}
	if err != nil {
		return failAt("prepare on "+m.host.Name, err)
	}
	if st.Status != "running" {
		return failAt("prepare on "+m.host.Name, fmt.Errorf("container %q is %s, only running containers migrate", m.req.Container, st.Status))
	}
	m.bundle = st.Bundle
	m.initPID = st.Pid
	spec, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return failAt("prepare on "+m.host.Name, fmt.Errorf("read the container's bundle: %w", err))
	}
	if err := m.prepareNetwork(spec); err != nil {
		return failAt("prepare on "+m.host.Name, err)
	}
	m.work = m.host.WorkDir(m.id)
	if err := os.MkdirAll(m.work, 0o700); err != nil {
		return failAt("prepare on "+m.host.Name, err)
	}
	m.sess, err = m.dial(ctx, m.req.To)
	if err != nil {
		return failAt("connect to destination", err)
	}
	m.sess.SetMaxBandwidth(m.req.MaxBandwidthBps)
	m.report.Transport = m.sess.Transport()
	m.ctl, err = m.sess.Open(ChanIncoming)
	if err != nil {
		return failAt("connect to destination", err)
	}
	offer := Offer{ID: m.id, Container: m.req.Container, Mode: m.req.Mode, SourceHost: m.host.Name,
		Spec: json.RawMessage(spec), Faults: m.req.Faults, Precopy: m.req.Precopy, MemoryBytes: residentBytes(st.Pid), Network: m.network}
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
		if err := m.ctl.Send(Step{Do: "mode", Mode: mode, Precopy: &m.req.Precopy}); err != nil {
			return failAt("plan", err)
		}
		var again Accept
		if err := m.ctl.Recv(&again); err != nil {
			return failAt("destination "+m.sess.Peer.Name+" refused", err)
		}
	}
	switch m.req.Mode {
	case ModeCold:
		return m.cold(ctx)
	case ModePostcopy:
		return m.postcopy(ctx)
	case ModePrecopy:
		if m.req.Precopy.Engine == PrecopyNative {
			return m.precopyNative(ctx)
		}
		return m.precopy(ctx)
	case ModeHybrid:
		return m.hybrid(ctx)
	}
	return failAt("prepare", fmt.Errorf("mode %q has no engine", m.req.Mode))
}

// precopyEngine resolves "auto" against what this kernel can do.
func (s *Source) precopyEngine(asked string) string {
	if asked == "" || asked == PrecopyAuto {
		if s.DirtyTracking {
			return PrecopyNative
		}
		return PrecopyContent
	}
	return asked
}

// precopySwitchover resolves "auto" (or nothing) for the content engine.
func (s *Source) precopySwitchover(o PrecopyOptions) string {
	if o.Engine != PrecopyContent {
		return ""
	}
	if o.Switchover == "" || o.Switchover == PrecopyAuto {
		if s.LazyDump {
			return SwitchoverRebuild
		}
		return SwitchoverDump
	}
	return o.Switchover
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
func (m *migration) validatePrecopy() error {
	o := m.req.Precopy
	switch o.Engine {
	case PrecopyContent:
	case PrecopyNative:
		if !m.dirtyTracking {
			return fmt.Errorf("--precopy-engine native needs soft-dirty page tracking, which this kernel lacks (CONFIG_MEM_SOFT_DIRTY); use content")
		}
	default:
		return fmt.Errorf("unknown pre-copy engine %q (auto, native, content)", o.Engine)
	}
	switch o.Switchover {
	case "", SwitchoverDump:
	case SwitchoverRebuild:
		if !m.lazyDump {
			return fmt.Errorf("--switchover rebuild needs CRIU's lazy dump, unavailable here (fs.pipe-max-size below %d, or no userfaultfd: see ferry check); use dump", criu.MinLazyPipeSize)
		}
	default:
		return fmt.Errorf("unknown --switchover %q (auto, rebuild, dump)", o.Switchover)
	}
	if o.Compress != "" && o.Compress != "none" && o.Compress != "zstd" {
		return fmt.Errorf("unknown --compress %q (none, zstd)", o.Compress)
	}
	if o.MaxRounds < 0 || o.MinRoundBytes < 0 || o.MaxDowntime < 0 {
		return fmt.Errorf("pre-copy limits must not be negative")
	}
	return nil
}

// syncRootfsLive is every technique's first step: the root filesystem,
// synced while the container runs.
func (m *migration) syncRootfsLive(ctx context.Context) error {
	m.begin("rootfs-sync")
	if err := m.syncRootfs(ChanRootfsLive); err != nil {
		return m.abort(ctx, failAt("rootfs sync", err))
	}
	return nil
}

// syncRootfs sends what the destination's copy of the root filesystem lacks.
func (m *migration) syncRootfs(kind string) error {
	ch, err := m.sess.Open(kind)
	if err != nil {
		return err
	}
	defer ch.Close()
	var have rootfs.Manifest
	if err := ch.Recv(&have); err != nil {
		return err
	}
	root := filepath.Join(m.bundle, "rootfs")
	want, err := rootfs.Scan(root)
	if err != nil {
		return err
	}
	if _, err := rootfs.WriteDelta(ch, root, rootfs.Diff(have, want)); err != nil {
		return err
	}
	if err := ch.CloseWrite(); err != nil {
		return err
	}
	attrs, err := rootfs.ReadRootAttrs(root)
	if err != nil {
		return err
	}
	if err := ch.Send(attrs); err != nil {
		return err
	}
	var done RootfsDone
	return ch.Recv(&done)
}

// freeze stops the container's processes; until commit, resume undoes it.
func (m *migration) freeze(ctx context.Context) error {
	m.begin("freeze")
	m.frozenAt = time.Now()
	if err := m.rt.Pause(ctx, m.req.Container); err != nil {
		m.frozenAt = time.Time{}
		return failAt("freeze on "+m.host.Name, err)
	}
	// Frozen, the container's kernel sockets would still acknowledge data
	// the dump no longer sees: take its own network quiet first.
	if err := m.silenceSource(); err != nil {
		return failAt("freeze on "+m.host.Name, err)
	}
	return nil
}

// switchover asks the destination to restore, then commits: the source copy
// is removed only once the destination acknowledged the commit.
func (m *migration) switchover(ctx context.Context) error {
	m.begin("restore")
	if err := m.ctl.Send(Step{Do: "restore"}); err != nil {
		return m.abort(ctx, failAt("restore", err))
	}
	var rs Restored
	if err := m.ctl.Recv(&rs); err != nil {
		return m.abort(ctx, failAt("restore on "+m.sess.Peer.Name, err))
	}
	m.report.DowntimeMs = ms(time.Since(m.frozenAt))
	m.report.RestoreMs = rs.RestoreMs
	if rs.PagesLocal+rs.PagesFetched > 0 {
		m.report.PagesReferenced, m.report.PagesFetched, m.report.FillMs = rs.PagesLocal, rs.PagesFetched, rs.FillMs
		m.report.MemoryBytes = rs.MemoryBytes
	}
	m.begin("commit")
	if err := m.ctl.Send(Step{Do: "commit"}); err != nil {
		// The destination never saw the commit: it drops its copy when the
		// commit window passes, after which resuming here is safe.
		time.Sleep(CommitWindow + time.Second)
		return m.abort(ctx, failAt("commit", err))
	}
	var c Committed
	if err := m.ctl.Recv(&c); err != nil {
		m.report.SourceState = "frozen"
		m.report.FrozenMs = ms(time.Since(m.frozenAt))
		return failAt("commit", fmt.Errorf("%v: the destination may or may not run the container; the source copy stays frozen (runc --root %s resume %s to take it back)", err, m.host.RuncRoot(), m.req.Container))
	}
	m.report.FrozenMs = ms(time.Since(m.frozenAt))
	return m.removeSource(ctx)
}

// removeSource deletes the frozen source copy once the destination owns the
// container. The migration is complete before this cleanup: total_ms ends
// here, and the deletion shows as the "cleanup" phase.
func (m *migration) removeSource(ctx context.Context) error {
	m.report.TotalMs = m.since()
	m.begin("cleanup")
	if m.dump != nil {
		m.dump.stop() // CRIU lets go of the container before it is deleted
	}
	if err := m.rt.Delete(context.WithoutCancel(ctx), m.req.Container); err != nil {
		m.report.SourceState = "frozen"
		return failAt("remove source copy", err)
	}
	m.report.SourceState = "removed"
	m.dropSourceNetwork()
	return nil
}

// abort tells the destination to drop its copy and resumes the source.
func (m *migration) abort(ctx context.Context, cause error) error {
	if m.sess != nil && m.sess.Lost() {
		// Whatever broke locally (CRIU's socket, a channel), the cause is
		// the connection: say so first.
		where, inner := "transfer", cause
		var f *failure
		if errors.As(cause, &f) {
			where, inner = f.where, f.err
		}
		cause = &failure{where: where, err: fmt.Errorf("the connection to %s was lost (peer gone, or no traffic for the outage timeout of %v): %w",
			m.sess.Peer.Name, transport.OutageTimeout(), inner)}
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
	m.report.FrozenMs = ms(time.Since(m.frozenAt))
	if m.dump != nil {
		m.dump.stop() // CRIU must be gone before the container thaws
	}
	m.wakeSource()
	if err := m.rt.Resume(rctx, m.req.Container); err != nil {
		// An interrupted CRIU may have thawed the container already.
		if st, serr := m.rt.State(rctx, m.req.Container); serr == nil && st.Status == "running" {
			m.report.SourceState = "resumed"
			return cause
		}
		m.report.SourceState = "frozen"
		return errors.Join(cause, fmt.Errorf("resume at source failed too: %w", err))
	}
	m.report.SourceState = "resumed"
	return cause
}

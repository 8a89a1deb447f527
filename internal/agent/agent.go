// Package agent is ferry's per-host daemon: it receives migrations from
// other agents on a TCP address and takes orders from the CLI on a unix
// socket, handing both to the engine.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/learn"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/reserve"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/vmas"
	"golang.org/x/sys/unix"
)

// DefaultControl is the CLI's socket when the agent is not told otherwise.
const DefaultControl = "/run/ferry/agent.sock"

// Agent serves one host.
type Agent struct {
	Host host.Config
	// Listen are the TCP addresses other agents send migrations to (one
	// per network path, say); none means this host only sends.
	Listen []string
	// Control is the unix socket the CLI talks to.
	Control string
	// AllowFaults honours fault injection in requests (tests, the lab).
	AllowFaults bool
	// KeepWork keeps received images and CRIU logs after each migration.
	KeepWork bool
	// Version is ferry's, for the reports.
	Version string
	// NoPrewarm turns off warming memory before restores.
	NoPrewarm bool
	// Security puts agent-to-agent sessions on mutual TLS 1.3; nil means
	// plaintext, which only the lab's tests and a trusted network should use.
	Security *transport.Security
	// Profile is the host's calibrated model profile (nil: defaults).
	Profile *model.Profile
	// Admission is what this host accepts of incoming containers.
	Admission admission.Policy
	// Runtimes make the runtimes this host offers, by kind
	// (runtime.Registry.Makers: each kind's own flags set them up).
	Runtimes map[string]runtime.Maker
	// Registry is the kinds of runtimes, for a request's options (nil:
	// all.Registry).
	Registry *runtime.Registry
	// SegmentBridge is the host's bridge to the shared L2 segment, for
	// containers that keep their address.
	SegmentBridge string
	// Multipath uses MPTCP for agent-to-agent sessions where the kernel
	// has it (falls back to TCP otherwise).
	Multipath bool
	// Streams, 2 or more, stripes a session that does not run over MPTCP
	// over that many TCP connections, spread over the peer's addresses.
	Streams int
	// OutageTimeout is how long a session waits out a network that carries
	// nothing (0: transport.DefaultOutageTimeout).
	OutageTimeout time.Duration
	// Limits is what peers may hold of this agent at once.
	Limits Limits
	// Costs are this host's unit prices, which it tells a source weighing
	// where its container should go (ferry follow).
	Costs api.Costs
	// Metrics, when set, is the TCP address Prometheus metrics are served
	// on (GET /metrics, plain HTTP: bind it where only your scraper reaches).
	Metrics string
	Log     *slog.Logger

	mu   sync.Mutex
	busy map[string]bool // containers with a migration under way
	// settling: one settle of a migration left in doubt at a time (the
	// background retries and ferry resolve).
	settling sync.Mutex
	// rescueErr is the last error rescue logged (a string), so that a
	// record that cannot be put back is not logged every tick.
	rescueErr atomic.Value
	jobs      *jobs // this agent's migrations as a source
	metrics   *metrics
	learner   *learn.Learner // nil: the agent does not learn (learning.go)
	feats     criu.Features
	set       runtime.Set // the runtimes this host has (newRuntimes)
	journal   *journal.Journal
	dst       *engine.Destination
	room      *reserve.Book // room held for migrations on their way here
	// inflight counts migrations under way; draining refuses new ones.
	inflight sync.WaitGroup
	draining atomic.Bool
	// peerSessions and incoming count peers' sessions and migrations
	// coming in, against Limits.
	peerSessions, incoming atomic.Int64
	// server accepts sessions on every listener (one per path, and the
	// control socket): a striped session may arrive on several.
	server *transport.Server
	// runtimeSet replaces runtimes() in unit tests.
	runtimeSet func(opts runtime.RequestOptions) (runtime.Set, error)
}

// runtimes returns the container runtimes this host offers, with a
// request's options applied (a runc root of its own, say).
func (a *Agent) runtimes(opts runtime.RequestOptions) (runtime.Set, error) {
	if a.runtimeSet != nil {
		return a.runtimeSet(opts)
	}
	return a.set.WithOptions(a.registry(), opts)
}

func (a *Agent) registry() *runtime.Registry {
	if a.Registry != nil {
		return a.Registry
	}
	return all.Registry
}

// newRuntimes makes the runtimes this host has, once at start. One that
// cannot be made is logged and left out: the others' containers move.
func (a *Agent) newRuntimes() runtime.Set {
	env := runtime.Env{StateDir: a.Host.StateDir, BundleRoot: a.Host.BundleRoot(), CgroupParent: a.Host.CgroupParent, NetNS: a.Host.NetNS,
		SegmentBridge: a.SegmentBridge, Admission: a.Admission,
		Features: runtime.Features{LazyPages: a.feats.LazyPages, DirtyTracking: a.feats.DirtyTracking}}
	set, err := runtime.NewSet(a.Runtimes, env)
	if err != nil {
		a.Log.Warn("runtimes left out", "error", err)
	}
	return set
}

// Run serves until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if a.Log == nil {
		a.Log = slog.Default()
	}
	a.busy = map[string]bool{}
	a.jobs = newJobs(filepath.Join(a.Host.StateDir, "jobs"))
	a.metrics = newMetrics(a.jobs)
	if err := os.MkdirAll(a.Host.StateDir, 0o700); err != nil {
		return err
	}
	a.openLearner()
	dst := &engine.Destination{Host: a.Host, Log: a.Log, AllowFaults: a.AllowFaults, KeepWork: a.KeepWork, NoPrewarm: a.NoPrewarm, SegmentBridge: a.SegmentBridge}
	// Each post-copy pull's relay is this binary (package lazyrelay).
	if exe, err := os.Executable(); err == nil {
		dst.RelayExe = exe
	}
	a.dst = dst
	// The runtimes' CRIU is the one ferry chose (criu.Binary), whatever
	// else PATH holds.
	criuPath, err := criu.UseBinary()
	if err != nil && criuPath != "" {
		a.Log.Warn("runtimes may run another CRIU than ferry's", "criu", criuPath, "error", err)
	}
	info, err := criu.Installed(ctx)
	switch {
	case err != nil:
		dst.CRIUError = err
	case !info.Version.AtLeast(criu.MinVersion.Major, criu.MinVersion.Minor, criu.MinVersion.Sublevel):
		dst.CRIUVersion = info.Version.String()
		dst.CRIUError = fmt.Errorf("CRIU %s is older than %s (run `make setup`)", info.Version, criu.MinVersion)
	default:
		dst.CRIUVersion = info.Version.String()
		dst.CRIUError = criu.Check(ctx)
	}
	if dst.CRIUError != nil {
		a.Log.Warn("this host cannot receive migrations", "reason", dst.CRIUError)
	}
	// Both ends tell the other their CRIU's patches, and refuse what it
	// cannot do before anything is frozen.
	caps := &engine.CRIUCaps{Path: criuPath, Version: dst.CRIUVersion, Patches: info.Patches}
	dst.CRIU = caps
	if missing := info.Patches.Missing(); err == nil && len(missing) > 0 {
		a.Log.Warn("this host's CRIU lacks ferry patches: some modes are slower or refused (ferry check)", "criu", criuPath, "patches", info.Patches.String(), "missing", criu.IDs(missing))
	}
	feats := criu.ProbeFeatures(ctx)
	a.feats = feats
	if a.Admission.MaxMemoryBytes == 0 {
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err == nil {
			a.Admission.MaxMemoryBytes = int64(si.Totalram) * int64(si.Unit)
		}
	}
	j, err := journal.Open(filepath.Join(a.Host.StateDir, "journal"))
	if err != nil {
		return err
	}
	a.journal = j
	a.set = a.newRuntimes()
	dst.Runtimes, dst.Journal, dst.Admission = a.set, j, a.Admission
	if a.room, err = a.newRoom(); err != nil {
		return fmt.Errorf("reading this host's load: %w", err)
	}
	dst.Room = a.room
	src := &engine.Source{Host: a.Host, Runtimes: dst.Runtimes, KeepWork: a.KeepWork, Version: a.Version,
		Dial: a.dialPeer, Profile: a.Profile, Journal: j, AllowFaults: a.AllowFaults, Lines: &engine.Lines{}, KeeperExe: dst.RelayExe, Log: a.Log,
		CurrentProfile: a.planProfile(), CRIU: caps}
	if src.VMAs, err = vmas.NewReader(); err != nil {
		a.Log.Info("the frozen dump reads smaps (no smaps snapshot)", "why", err)
	} else {
		defer src.VMAs.Close()
	}
	if err := a.Host.SecureWorkRoot(); err != nil {
		return err
	}
	// Every CRIU this agent runs, below a runtime too, records what it
	// changes in the processes it dumps, for criu.Rescue (ferry's CRIU).
	if err := os.Setenv(criu.RescueDirEnv, a.Host.RescueDir()); err != nil {
		return err
	}
	// Before anyone is answered: copies restored here and never committed
	// go, so sources asking afterwards resume theirs.
	a.clearScratch()
	a.recoverDestination(ctx)
	if n, err := a.journal.Prune(journalKeep); err != nil {
		a.Log.Warn("pruning the journal", "error", err)
	} else if n > 0 {
		a.Log.Info("pruned old journal entries", "entries", n)
	}

	if a.server, err = transport.NewServer(a.transportConfig()); err != nil {
		return err
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	if a.Control != "" {
		if err := os.MkdirAll(filepath.Dir(a.Control), 0o700); err != nil {
			return err
		}
		_ = os.Remove(a.Control) // a stale socket from a crashed agent
		l, err := a.server.Listen(a.Control)
		if err != nil {
			return err
		}
		if err := os.Chmod(a.Control, 0o600); err != nil {
			return err
		}
		ls = append(ls, l)
		go a.accept(ctx, l, false, func(sess *transport.Session, r *transport.Router, ch *transport.Channel) {
			a.control(ctx, src, ch)
		})
	}
	if a.Metrics != "" {
		l, err := net.Listen("tcp", a.Metrics)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		ls = append(ls, l)
		go func() { _ = a.metrics.serve(l) }()
	}
	for _, addr := range a.Listen {
		l, err := a.listenPeers(addr)
		if err != nil {
			return err
		}
		ls = append(ls, l)
		go a.accept(ctx, l, true, func(sess *transport.Session, r *transport.Router, ch *transport.Channel) {
			if sess.PeerOperator() {
				// A person's CLI from elsewhere (ferry ... --from): the
				// control socket's requests, never a peer's.
				a.Log.Info("operator request", "operator", sess.Peer.Name, "request", ch.Kind)
				a.control(ctx, src, ch)
				return
			}
			switch ch.Kind {
			case engine.ChanIncoming:
				if err := a.begin(); err != nil {
					_ = ch.Fail(err)
					ch.Close()
					return
				}
				defer a.inflight.Done()
				if n := a.incoming.Add(1); n > int64(a.Limits.withDefaults().MaxIncoming) {
					a.incoming.Add(-1)
					_ = ch.Fail(fmt.Errorf("%s is busy: %d migrations are coming in already (--max-incoming)", a.Host.Name, n-1))
					ch.Close()
					return
				}
				defer a.incoming.Add(-1)
				dst.Receive(ctx, sess, r, ch)
			case engine.ChanQuery:
				dst.Answer(ch, sess.Peer.Name)
			case ChanCandidate:
				a.answerCandidate(ctx, ch)
			case engine.ChanProbe:
				engine.ServeProbe(ch)
			case engine.ChanLazyResume:
				dst.ResumePull(ctx, sess, r, ch, sess.Peer.Name)
			default:
				_ = ch.Fail(fmt.Errorf("peers may only offer migrations or ask about theirs, not %q", ch.Kind))
				ch.Close()
			}
		})
	}
	if len(ls) == 0 {
		return errors.New("agent needs --listen or --control")
	}
	a.Log.Info("agent ready", "host", a.Host.Name, "listen", a.Listen, "control", a.Control, "criu", dst.CRIUVersion)
	a.resolveSources(ctx)
	go a.watchRescues(ctx)
	<-ctx.Done()
	return a.drain(ls)
}

// drainTimeout bounds how long a stopping agent waits for migrations under
// way (a post-copy pull that cannot be abandoned, say).
const drainTimeout = 5 * time.Minute

// drain stops an agent the way SIGTERM asks: no new migrations; those under
// way were cancelled with the agent's context, so a source that can still
// resume does (its resume does not depend on that context); what cannot
// be abandoned is waited out, so the process never ends mid-migration.
func (a *Agent) drain(ls []net.Listener) error {
	a.mu.Lock() // begin checks and counts under it: no Add after the Wait
	a.draining.Store(true)
	a.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	a.Log.Info("draining: no new migrations; waiting for those under way")
	done := make(chan struct{})
	go func() { a.inflight.Wait(); close(done) }()
	select {
	case <-done:
		a.Log.Info("drained")
		return nil
	case <-time.After(drainTimeout):
		return fmt.Errorf("migrations still under way after %v: stopping anyway (the journal settles them at the next start)", drainTimeout)
	}
}

// begin admits a migration unless the agent is draining; end must follow.
func (a *Agent) begin() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.draining.Load() {
		return errors.New("this agent is stopping: no new migrations")
	}
	a.inflight.Add(1)
	return nil
}

// transportConfig is how this agent makes and accepts sessions.
func (a *Agent) transportConfig() *transport.Config {
	c := transport.DefaultConfig()
	c.Hello = transport.Hello{Name: a.Host.Name, Role: "agent", Addrs: a.Listen}
	c.Security = a.Security
	c.Paths = transport.PathOptions{Multipath: a.Multipath, Streams: a.Streams}
	if a.OutageTimeout > 0 {
		c.OutageTimeout = a.OutageTimeout
	}
	return c
}

// listenPeers opens a listener other agents connect to: mutual TLS when
// the agent has a certificate, MPTCP when asked.
func (a *Agent) listenPeers(addr string) (net.Listener, error) {
	if a.Security == nil {
		a.Log.Warn("agent-to-agent traffic is NOT encrypted or authenticated: start the agent with --tls-dir")
	}
	return a.server.Listen(addr)
}

// dialPeer opens a session to another agent the same way it listens, at
// to: ADDR, or NAME@ADDR, and then the agent must prove it is host NAME
// (its certificate's name).
func (a *Agent) dialPeer(ctx context.Context, to string) (*transport.Session, error) {
	return transport.Dial(ctx, to, a.transportConfig())
}

// accept serves the sessions of one listener; a peer listener's
// sessions count against Limits and close when idle.
func (a *Agent) accept(ctx context.Context, l net.Listener, peers bool, handle func(*transport.Session, *transport.Router, *transport.Channel)) {
	lim := a.Limits.withDefaults()
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			sess, err := a.server.Accept(conn)
			if errors.Is(err, transport.ErrJoined) {
				return // another path of a striped session: it is served there
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					a.Log.Warn("refused connection", "from", conn.RemoteAddr(), "err", err)
				}
				return
			}
			defer sess.Close()
			if !peers {
				r := transport.NewRouter()
				r.Serve(sess, func(ch *transport.Channel) { handle(sess, r, ch) })
				return
			}
			if n := a.peerSessions.Add(1); n > int64(lim.MaxPeerSessions) {
				a.peerSessions.Add(-1)
				a.Log.Warn("refused a session: too many open (--max-peer-sessions)", "peer", sess.Peer.Name, "open", n-1)
				return
			}
			defer a.peerSessions.Add(-1)
			idle := newIdleWatch(sess, lim.IdleTimeout)
			defer idle.stop()
			r := transport.NewRouter()
			r.Serve(sess, func(ch *transport.Channel) {
				idle.busy()
				defer idle.done()
				handle(sess, r, ch)
			})
		}()
	}
}

// control serves the CLI's requests.
func (a *Agent) control(ctx context.Context, src *engine.Source, ch *transport.Channel) {
	defer ch.Close()
	switch ch.Kind {
	case engine.ChanMigrate:
		var req engine.Request
		if err := ch.Recv(&req); err != nil {
			return
		}
		if req.ID != "" {
			// The caller's ID: a request repeated with it (a controller
			// retrying) follows the migration it names, never a second one.
			if err := a.checkCallerID(req); err != nil {
				_ = ch.Fail(err)
				return
			}
		}
		if err := a.begin(); err != nil {
			_ = ch.Fail(err)
			return
		}
		defer a.inflight.Done()
		j, jctx, existing := a.jobs.start(ctx, req)
		if existing != nil {
			a.followJob(ctx, ch, req, *existing)
			return
		}
		if !a.claim(req.Container) {
			err := fmt.Errorf("container %q is already being migrated", req.Container)
			_ = a.jobs.end(j, engine.Report{Container: req.Container, Mode: req.Mode, FailedAt: "prepare", Error: err.Error()})
			_ = ch.Fail(err)
			return
		}
		a.Log.Info("migration started", "container", req.Container, "to", req.To, "mode", req.Mode)
		if len(req.RuntimeOptions) > 0 {
			set, err := a.runtimes(req.RuntimeOptions)
			if err != nil {
				a.release(req.Container)
				_ = a.jobs.end(j, engine.Report{Container: req.Container, Mode: req.Mode, FailedAt: "prepare", Error: err.Error()})
				_ = ch.Fail(err)
				return
			}
			s := *src
			s.Runtimes = set
			src = &s
		}
		req.ID = j.info.ID
		// The CLI may leave (ferry migrate --detach, or it died): the
		// migration goes on, and ferry wait finds it by its ID.
		_ = ch.Send(engine.Event{Job: &engine.JobRef{ID: req.ID}})
		rep := src.Migrate(jctx, req, func(p engine.Progress) {
			a.jobs.progress(j, p)
			_ = ch.Send(engine.Event{Progress: &p})
		})
		// Free before anyone hears the report (this client, or ferry wait
		// through the job): they may ask to move it again at once.
		a.release(req.Container)
		a.Log.Info("migration ended", "id", req.ID, "container", req.Container, "ok", rep.OK, "downtime_ms", rep.DowntimeMs, "error", rep.Error)
		a.metrics.done(req, rep)
		a.learned(rep)
		if err := a.jobs.end(j, rep); err != nil {
			a.Log.Warn("could not keep the migration's report", "id", req.ID, "error", err)
		}
		if rep.InDoubtID != "" {
			go a.resolveSource(ctx, rep.InDoubtID)
		}
		_ = ch.Send(engine.Event{Report: &rep})
	case engine.ChanJobs:
		var q engine.JobsQuery
		if err := ch.Recv(&q); err != nil {
			return
		}
		js, err := a.jobs.list(q.All)
		if err != nil {
			_ = ch.Fail(err)
			return
		}
		_ = ch.Send(js)
	case engine.ChanCancel:
		var ref engine.JobRef
		if err := ch.Recv(&ref); err != nil {
			return
		}
		r, err := a.jobs.cancelJob(ref.ID)
		if err != nil {
			_ = ch.Fail(err)
			return
		}
		_ = ch.Send(r)
	case engine.ChanWait:
		var ref engine.JobRef
		if err := ch.Recv(&ref); err != nil {
			return
		}
		rep, err := a.jobs.wait(ctx, ref.ID, func(p engine.Progress) { _ = ch.Send(engine.Event{Progress: &p}) })
		if err != nil {
			_ = ch.Fail(err)
			return
		}
		_ = ch.Send(engine.Event{Report: &rep})
	case engine.ChanResolve:
		var ref engine.JobRef
		if err := ch.Recv(&ref); err != nil {
			return
		}
		r, err := a.resolve(ctx, ref.ID)
		if err != nil {
			_ = ch.Fail(err)
			return
		}
		_ = ch.Send(r)
	case api.ChanAssess:
		var q api.AssessQuery
		if err := ch.Recv(&q); err != nil {
			return
		}
		as, err := a.assess(ctx, q)
		if err != nil {
			_ = ch.Fail(err)
			return
		}
		_ = ch.Send(as)
	case api.ChanReserve:
		var r api.Reservation
		if err := ch.Recv(&r); err != nil {
			return
		}
		reply, err := a.room.Reserve(r)
		if err != nil {
			_ = ch.Fail(err)
			return
		}
		if reply.OK && !r.Release {
			a.Log.Info("room reserved", "id", r.ID, "container", r.Container, "memory", r.MemoryBytes, "cores", r.Cores)
		}
		_ = ch.Send(reply)
	case engine.ChanStatus:
		st, err := a.status(ctx)
		if err != nil {
			_ = ch.Fail(err)
			return
		}
		_ = ch.Send(st)
	default:
		_ = ch.Fail(fmt.Errorf("unknown request %q", ch.Kind))
	}
}

// journalKeep is how long the journal keeps entries that no longer matter
// (journal.Prune).
const journalKeep = 30 * 24 * time.Hour

// checkCallerID refuses an ID a caller chose that cannot name a migration
// here: not an ID, or one an earlier migration of this host used (its
// journal has it; its job may have been pruned).
func (a *Agent) checkCallerID(req engine.Request) error {
	if !engine.ValidID(req.ID) {
		return fmt.Errorf("bad migration ID %q: 12 lowercase hexadecimal digits", req.ID)
	}
	if a.jobs.known(req.ID) {
		return nil // followed (or refused for another container) by followJob
	}
	if e, ok, err := a.journal.Get(req.ID); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("migration ID %s names an earlier migration of %q on this host (%s): choose another", req.ID, e.Container, e.State)
	}
	return nil
}

// followJob answers a request repeated with the ID of a migration that
// exists: its events from now on and its report, as ferry wait gets them.
// A request for another container or destination under that ID is
// refused.
func (a *Agent) followJob(ctx context.Context, ch *transport.Channel, req engine.Request, info engine.Job) {
	if info.Container != req.Container || info.To != req.To {
		_ = ch.Fail(fmt.Errorf("migration ID %s names the migration of %q to %s, not of %q to %s", info.ID, info.Container, info.To, req.Container, req.To))
		return
	}
	_ = ch.Send(engine.Event{Job: &engine.JobRef{ID: info.ID}})
	rep, err := a.jobs.wait(ctx, info.ID, func(p engine.Progress) { _ = ch.Send(engine.Event{Progress: &p}) })
	if err != nil {
		_ = ch.Fail(err)
		return
	}
	_ = ch.Send(engine.Event{Report: &rep})
}

func (a *Agent) claim(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.busy[name] {
		return false
	}
	a.busy[name] = true
	return true
}

func (a *Agent) release(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.busy, name)
}

// status lists every runtime's containers. A runtime that cannot answer
// (its daemon stopped) hides only its own: the others' are listed and the
// agent logs why.
func (a *Agent) status(ctx context.Context) (engine.Status, error) {
	ctrs, err := a.set.List(ctx)
	if err != nil {
		if len(ctrs) == 0 && len(a.set) > 0 {
			return engine.Status{}, err
		}
		a.Log.Warn("some runtimes could not list their containers", "error", err)
	}
	out := engine.Status{Host: a.Host.Name, Containers: []engine.ContainerStatus{}, Model: a.modelStatus(),
		Ferry: a.Version, Protocol: transport.ProtocolVersion}
	if c := a.dst.CRIU; c != nil {
		out.CRIU = &api.CRIUStatus{Path: c.Path, Version: c.Version, Patches: c.Patches}
	}
	for _, c := range ctrs {
		cs := engine.ContainerStatus{Name: c.Name, Runtime: c.Runtime, Status: c.Status, Pid: c.PID}
		if c.PID > 0 {
			cs.ResidentBytes = procs.TreeResident(c.PID)
		}
		out.Containers = append(out.Containers, cs)
	}
	return out, nil
}

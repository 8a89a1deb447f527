package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/lazyrelay"
	"github.com/ferry-migrate/ferry/internal/pagestream"
	"github.com/ferry-migrate/ferry/internal/privnet"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Post-copy: CRIU dumps everything but the memory (--lazy-pages) and keeps
// a page server on the frozen source; the destination restores at once and
// its lazy-pages daemon pulls each page on fault (userfaultfd) while pushing
// the rest in the background. The page traffic rides the agents' session:
// the destination's daemon talks to its agent over a socketpair, the
// source agent connects to CRIU's page server, which listens on loopback
// in a network namespace of its own.

// ChanLazy carries CRIU's lazy page traffic (destination daemon <-> source
// page server).
const ChanLazy = "lazy"

// LazyDone is the destination's report once every page has arrived (or
// the transfer failed, which leaves the container without its memory).
type LazyDone struct {
	Ms      float64 `json:"ms"`      // from the restore until the last page
	Faulted uint64  `json:"faulted"` // pages served on a fault
	Pushed  uint64  `json:"pushed"`  // pages pushed in the background
	// Local counts pages the destination supplied from its own copy
	// (hybrid); the rest crossed the network.
	Local uint64 `json:"local,omitempty"`
	Error string `json:"error,omitempty"`
}

func (m *migration) postcopy(ctx context.Context) error {
	lw, err := m.trackLastWrites()
	if err != nil {
		return m.abort(ctx, failAt("post-copy", err))
	}
	defer lw.close()
	if err := m.syncRootfsLive(ctx); err != nil {
		return err
	}
	ld, err := m.beginLazyDump(ctx)
	if err != nil {
		return m.abort(ctx, err)
	}
	if err := m.freeze(ctx); err != nil {
		ld.stop()
		return m.abort(ctx, err)
	}
	m.begin(phaseDump)
	var g errgroup.Group
	g.Go(ld.run)
	g.Go(func() error { return failAt("post-copy's last writes", lw.send(ctx, m)) })
	if err := m.syncRootfsBeside(&g); err != nil {
		ld.stop()
		return m.abort(ctx, err)
	}
	defer ld.stop()
	return m.lazySwitchover(ctx, ld)
}

// syncRootfsBeside sends the root filesystem's last changes beside what g
// runs (the memory-less dump) and waits for both; the destination's word
// on them is the switchover's (pendingAcks). The container is frozen, so
// what the sync finds is final, and the link is idle while CRIU dumps:
// the sync is off the downtime's path. Where the runtime could not freeze
// the container without the dump, the dump is what freezes it, and the
// sync follows.
func (m *migration) syncRootfsBeside(g *errgroup.Group) error {
	sync := func() error { return failAt("rootfs sync (frozen)", m.sendFrozenTrees()) }
	if !m.rt.Caps().Freeze {
		if err := g.Wait(); err != nil {
			return err
		}
		return sync()
	}
	g.Go(sync)
	return g.Wait()
}

// lazyDump is the runtime's lazy dump of the frozen container: its images
// are written, and CRIU's page server serves the frozen memory until the
// destination has pulled every page.
type lazyDump struct {
	m    *migration
	addr string // CRIU's page server, on loopback
	// net is the private network namespace the dump runs in, where its
	// page server listens (nil: the host's, see pageServerNet).
	net     *privnet.NS
	netOnce sync.Once
	// opts and ctx are the dump's; early is the dump begun before the
	// freeze, where the runtime can (runtime.EarlyCheckpointer), until it
	// runs. dump is the dump once it ran; stopDump kills it.
	opts     runtime.CheckpointOptions
	ctx      context.Context
	early    runtime.Checkpointing
	dump     runtime.Dump
	stopDump context.CancelFunc
	exited   chan struct{}
	result   error
	// connectMu makes the page server's connection once (connect).
	connectMu sync.Mutex
	// conn is the tunnel's connection to CRIU's page server, once made;
	// proxy serves it to a destination that may come back (resume.go).
	// ended is set once endPageServer ran: a connection made after that
	// is closed at once.
	mu    sync.Mutex
	conn  net.Conn
	proxy *pagestream.LazyProxy
	ended bool
	// faults has each request the page server answers, and the pages
	// the destination waits for, for the push (dropped when it lags).
	faults chan pushNext
	// keeper holds the page server's connection in a process of its own,
	// so that the pull outlives this agent (nil: this agent holds it).
	keeper *lazyrelay.Process
}

// beginLazyDump readies a lazy dump before the freeze: the private
// network namespace its page server listens in, a port there, and where
// the runtime can, the dump itself, up to where it would touch the
// container (runtime.EarlyCheckpointer). Nothing is frozen.
func (m *migration) beginLazyDump(ctx context.Context) (*lazyDump, error) {
	pn, err := m.pageServerNet()
	if err != nil {
		return nil, failAt("dump", err)
	}
	ld := &lazyDump{m: m, net: pn, exited: make(chan struct{}), faults: make(chan pushNext, 64)}
	port, err := freeLoopbackPort(pn)
	if err != nil {
		ld.closeNet()
		return nil, failAt("dump", err)
	}
	ld.addr = fmt.Sprintf("127.0.0.1:%d", port)
	ld.opts = runtime.CheckpointOptions{
		ImagesDir: filepath.Join(m.work, "images"), WorkDir: m.work, PageServer: ld.addr,
		Lazy: true, TCPEstablished: m.keepsAddress(), TCPClose: m.closesConnections(), NetworkQuiet: m.keepsAddress(), PageNet: pn,
		SmapsSnapshot: m.smapsSnapshotDir(), IrmapScanPaths: criu.IrmapScanPaths(m.ctr.PID),
	}
	if m.tech.lazy && m.keeperExe != "" {
		// Before the freeze: its start (a fork and an exec) stays out of
		// the downtime.
		if ld.keeper, err = lazyrelay.StartKeeper(m.keeperExe, m.work); err != nil {
			m.report.Warnings = append(m.report.Warnings, "the pull ends with this agent if it stops: "+err.Error())
		}
	}
	// The dump outlives this call: it ends when its page server is closed.
	ld.ctx, ld.stopDump = context.WithCancel(context.WithoutCancel(ctx))
	if ec, ok := m.rt.(runtime.EarlyCheckpointer); ok {
		if ld.early, err = ec.StartCheckpoint(ld.ctx, m.ctr, ld.opts); err != nil {
			m.log.Info("dump not begun before the freeze", "migration", m.req.ID, "container", m.ctr.Name, "why", err)
		}
	}
	return ld, nil
}

// run dumps the container, frozen now, without its memory, and returns
// once CRIU's page server listens.
func (ld *lazyDump) run() error {
	m := ld.m
	var d runtime.Dump
	var err error
	if early := ld.early; early != nil {
		ld.early = nil
		d, err = early.Go()
	} else {
		d, err = m.rt.Checkpoint(ld.ctx, m.ctr, ld.opts)
	}
	if err != nil {
		ld.stopDump()
		ld.closeNet()
		return failAt("dump on "+m.host.Name, err)
	}
	ld.dump = d
	if m.rt.Caps().Freeze {
		// CRIU thawed the container's cgroup once it had seized the
		// tasks, and holds them until its page server ends; a CRIU that
		// dies before (killed, crashed) lets them run on here, beside
		// the destination's copy. Frozen again, they stay where the
		// migration left them: removed after the commit, thawed by the
		// runtime otherwise. CRIU freezes the cgroup itself as it ends,
		// as it found it.
		m.refreeze()
	}
	go func() {
		ld.result = d.Wait()
		close(ld.exited)
	}()
	m.dump, m.dumped = ld, d
	if ld.keeper != nil {
		if _, err := ld.connect(ld.ctx); err != nil {
			m.report.Warnings = append(m.report.Warnings, "the page keeper holds no connection yet: "+err.Error())
		}
	}
	return nil
}

// pageServerNet makes the private network namespace a lazy dump runs in.
// CRIU's page server serves whoever connects first; on the host's loopback
// any local process could, and read a frozen container's memory. A
// container in the host's own network namespace cannot be dumped from
// another one (CRIU would take the host's namespace for the container's
// and lock it whole): its page server stays on the host's loopback, and
// the report says so.
func (m *migration) pageServerNet() (*privnet.NS, error) {
	shared, err := privnet.SharesOurs(m.ctr.PID)
	if err != nil {
		return nil, err
	}
	if shared {
		m.report.Warnings = append(m.report.Warnings, "the container shares this host's network namespace, so CRIU's lazy page server listened on the host's loopback, where any local process could connect to it")
		return nil, nil
	}
	return privnet.New()
}

// dial connects to the dump's page server, retrying while CRIU starts
// listening.
func (ld *lazyDump) dial(ctx context.Context) (net.Conn, error) {
	if ld.net == nil {
		return dialRetry(ctx, ld.addr)
	}
	var conn net.Conn
	err := ld.net.Do(func() (err error) { conn, err = dialRetry(ctx, ld.addr); return err })
	return conn, err
}

func (ld *lazyDump) closeNet() {
	ld.netOnce.Do(func() {
		if ld.net != nil {
			ld.net.Close()
		}
	})
}

// wait returns the dump's outcome once CRIU exited.
func (ld *lazyDump) wait() error {
	<-ld.exited
	return ld.result
}

// stop ends the dump (and its page server) if it still runs. It ends
// CRIU's page-server session so that CRIU finishes by itself: killing
// the runtime would leave CRIU running, and CRIU puts back the freezer
// state it found when it ends, which would freeze again a container
// resumed meanwhile. Only a CRIU that does not end in time is killed.
func (ld *lazyDump) stop() {
	if ld.dump == nil {
		// Never ran, or failed to: a dump begun before the freeze gives up
		// without having touched the container.
		if ld.early != nil {
			ld.early.Cancel()
		}
		ld.stopDump()
		ld.closeNet()
		ld.stopKeeper()
		return
	}
	select {
	case <-ld.exited:
	default:
		ld.endPageServer()
		select {
		case <-ld.exited:
		case <-time.After(10 * time.Second):
			// Kill CRIU itself, not only the runtime: it would end
			// later, once the container was thawed, and freeze it again.
			// (Its tasks stay frozen when it dies: run froze them.)
			criu.KillWorkingIn(ld.m.work)
		}
	}
	ld.stopDump()
	_ = ld.wait()
	ld.closeNet()
	ld.stopKeeper()
}

// stopKeeper ends the page keeper, if any: once CRIU's close went through
// it, it has ended by itself; otherwise its end closes CRIU's connection.
func (ld *lazyDump) stopKeeper() {
	if ld.keeper != nil {
		ld.keeper.Kill()
	}
}

// keptPull is what the journal keeps of a lazy dump whose page server a
// keeper holds: what a restarted agent needs to serve the pull on.
func (m *migration) keptPull() *journal.Pull {
	if m.dump == nil || m.dump.keeper == nil {
		return nil
	}
	return &journal.Pull{Daemon: m.dump.keeper.Pid, Dir: m.work}
}

// refreeze freezes the container's cgroup again (see run).
func (m *migration) refreeze() {
	dir, err := cgroups.FreezerOf(m.ctr.PID)
	if err == nil {
		err = cgroups.Freeze(dir)
	}
	if err != nil {
		m.log.Warn("a lazy dump's CRIU is killed and its container could not be frozen first: it may run on", "container", m.ctr.Name, "error", err)
	}
}

// endPageServer closes the tunnel's connection to the dump's page server,
// or, when none was made, connects and sends the page server's close
// command (retrying while CRIU is still dumping and not yet listening).
func (ld *lazyDump) endPageServer() {
	ld.mu.Lock()
	conn := ld.conn
	ld.conn, ld.ended = nil, true
	ld.mu.Unlock()
	// A keeper handed CRIU's connection holds it: its end closes it. One
	// never handed it ends all the same, and CRIU, whose page server has
	// had no client, is told to close below.
	ld.stopKeeper()
	if conn != nil {
		conn.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		select {
		case <-ld.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := ld.dial(ctx)
	if err != nil {
		return
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	_ = pagestream.NewLazyClient(c).Close()
	c.Close()
}

// keep records conn (and its proxy) as the tunnel's connection to the
// page server, unless endPageServer ran while it was being made: CRIU
// serves one connection, and one left open would have it answer neither
// this one's end nor the close endPageServer sent on its own.
func (ld *lazyDump) keep(conn net.Conn, proxy *pagestream.LazyProxy) error {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if ld.ended {
		conn.Close()
		return errors.New("the dump's page server was ended meanwhile")
	}
	ld.conn = conn
	if proxy != nil {
		ld.proxy = proxy
	}
	return nil
}

// splice connects the lazy channel to the dump's page server.
func (ld *lazyDump) splice(ctx context.Context, ch *transport.Channel) error {
	conn, err := ld.dial(ctx)
	if err == nil {
		err = ld.keep(conn, nil)
	}
	if err != nil {
		ch.Fail(err)
		return err
	}
	defer conn.Close()
	return splice(conn.(*net.TCPConn), ch)
}

// serve answers the destination's daemon on ch from the dump's page
// server, through a LazyProxy that keeps the page server's connection
// whole when ch breaks, so that the destination can go on over another
// channel (serve again). It returns once ch ended or failed; the page
// server's connection is closed once the daemon's close was passed on.
func (ld *lazyDump) serve(ctx context.Context, ch *transport.Channel) error {
	ld.mu.Lock()
	p := ld.proxy
	ld.mu.Unlock()
	if p == nil {
		var err error
		if p, err = ld.connect(ctx); err != nil {
			ch.Fail(err)
			return err
		}
	}
	closed, err := p.Serve(ch)
	if closed {
		ld.mu.Lock()
		if ld.conn != nil {
			ld.conn.Close()
		}
		ld.mu.Unlock()
	}
	if err != nil {
		ch.Close()
		return err
	}
	return ch.CloseWrite()
}

// connect connects to the dump's page server, through the page keeper
// where one runs, once: the first request's serve, or the dump's end
// where a keeper runs (run), so that the pull outlives this agent from
// the commit on, however late the destination's daemon first asks.
func (ld *lazyDump) connect(ctx context.Context) (*pagestream.LazyProxy, error) {
	ld.connectMu.Lock()
	defer ld.connectMu.Unlock()
	ld.mu.Lock()
	p := ld.proxy
	ld.mu.Unlock()
	if p != nil {
		return p, nil
	}
	conn, err := ld.dial(ctx)
	if err == nil && ld.keeper != nil {
		conn, err = ld.handToKeeper(conn)
	}
	if err != nil {
		return nil, err
	}
	p = pagestream.NewLazyProxy(conn)
	p.OnFault(ld.fault)
	if err := ld.keep(conn, p); err != nil {
		return nil, err
	}
	return p, nil
}

// handToKeeper gives the page keeper CRIU's connection conn and returns
// the keeper's connection to serve through instead.
func (ld *lazyDump) handToKeeper(conn net.Conn) (net.Conn, error) {
	defer conn.Close() // the keeper has its own
	kc, err := lazyrelay.Keep(ld.m.work, conn.(*net.TCPConn))
	if err != nil {
		return nil, err
	}
	return kc, nil
}

// fault tells the push of a request the page server answers: those
// pages need not be pushed, and the ones after them go next, for a thread
// that faults (Redis's, serving its first requests) likely touches its
// neighbours next, and a page the push brought is not a fault.
func (ld *lazyDump) fault(pid uint32, addr, n uint64) {
	select {
	case ld.faults <- pushNext{pid: pid, start: addr, served: n, ahead: pushAhead}:
	default:
	}
}

// quiet returns once the page server answers no fault (LazyProxy.Quiet).
func (ld *lazyDump) quiet() {
	ld.mu.Lock()
	p := ld.proxy
	ld.mu.Unlock()
	if p != nil {
		p.Quiet()
	}
}

// lazySwitchover ships the images and the root filesystem's last changes,
// opens the page tunnel, has the destination restore, commits, and waits
// until the destination has pulled the memory.
func (m *migration) lazySwitchover(ctx context.Context, ld *lazyDump) error {
	lazyCh, err := m.shipLazyDump(ctx, ld, true)
	if err != nil {
		return m.abort(ctx, err)
	}
	defer lazyCh.Close()

	if _, err := m.requestRestore(ctx); err != nil {
		return err
	}
	// The copy is restored: its daemon already pulls, so the push starts
	// now (it keeps little enough in flight not to hold up the commit).
	stopPush := func() {}
	if m.tech.push {
		stopPush = m.startPush(ctx, ld.quiet, ld.faults)
	}
	defer stopPush()
	// A page server that failed (its CRIU killed) serves no page: the
	// copy, restored but not yet run, is dropped and the source resumes.
	// One that ended well had served every page already.
	select {
	case <-ld.exited:
		if ld.result != nil {
			return m.abort(ctx, failAt("dump on "+m.host.Name, fmt.Errorf("CRIU's lazy page server failed before the commit: %w", ld.result)))
		}
	default:
	}
	// From here the destination's copy runs and changes: resuming the
	// source would fork the container's state, so the migration commits.
	if err := m.sendCommit(ctx); err != nil {
		return err
	}
	where := "commit"
	var done LazyDone
	c, err := m.commitAnswer()
	if err == nil {
		m.committed(c)
		m.begin(phaseLazyPages)
		where = "lazy pages"
		err = m.ctl.Recv(&done)
	}
	stopPush()
	if err != nil {
		// The destination may come back (its agent restarted) to go on: a
		// destination that committed keeps its copy's pull for this source,
		// even when its word on the commit was lost; one that did not
		// dropped its copy.
		var dropped bool
		if done, dropped, err = m.resumePull(ctx, ld, err); dropped {
			return m.abort(ctx, failAt(where+" on "+m.sess.Peer.Name, errors.New("the destination's agent restarted and dropped the container; the source copy resumes as it was at the freeze")))
		}
		if err == nil && m.report.DowntimeMs == 0 {
			// Its copy ran again somewhere in the resumed pull: at most this.
			m.report.DowntimeMs = units.Millis(time.Since(m.frozenAt))
		}
	}
	if err != nil || done.Error != "" {
		// Nobody will go on with the pull (ld.serve's proxy would keep the
		// page server for a destination coming back): its session ends,
		// so does the dump.
		ld.endPageServer()
	}
	derr := ld.wait()
	m.report.FrozenMs = units.Millis(time.Since(m.frozenAt))
	m.report.PagesFaulted, m.report.PagesPushed = done.Faulted, done.Pushed
	m.report.PagesReferenced = done.Local
	m.report.MemoryBytes = int64(done.Faulted+done.Pushed+m.report.PagesLastWritten) * pageSize
	if err != nil {
		return m.inDoubt(failAt(where, fmt.Errorf("lost the destination while it pulled memory: %w", err)))
	}
	if done.Error != "" {
		// The destination dropped its copy before it said so: the source's,
		// complete but as it was at the freeze, is the one left.
		return m.pullFailed(ctx, done)
	}
	if derr != nil {
		// Every page arrived; the dump's own exit status is only advisory.
		m.report.Warnings = append(m.report.Warnings, "source page server: "+derr.Error())
	}
	return m.removeSource(ctx)
}

// shipLazyDump sends a lazy dump's images (the root filesystem's last
// changes went beside the dump) and opens the channel to the dump's page
// server.
//
// resumable serves the page server through ld.serve, whose proxy a
// destination can come back to (post-copy and hybrid); otherwise its bytes
// are spliced as they come.
func (m *migration) shipLazyDump(ctx context.Context, ld *lazyDump, resumable bool) (*transport.Channel, error) {
	if err := m.sendImages(); err != nil {
		return nil, err
	}
	lazyCh, err := m.sess.Open(ChanLazy)
	if err != nil {
		return nil, failAt("lazy pages", err)
	}
	if resumable {
		go func() { _ = ld.serve(context.WithoutCancel(ctx), lazyCh) }()
	} else {
		go func() { _ = ld.splice(context.WithoutCancel(ctx), lazyCh) }()
	}
	return lazyCh, nil
}

// freeLoopbackPort finds a port free on loopback, in pn when set.
func freeLoopbackPort(pn *privnet.NS) (int, error) {
	var port int
	find := func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		port = l.Addr().(*net.TCPAddr).Port
		return nil
	}
	if pn == nil {
		return port, find()
	}
	return port, pn.Do(find)
}

// dialRetry connects to addr, retrying briefly while CRIU starts listening.
func dialRetry(ctx context.Context, addr string) (net.Conn, error) {
	var conn net.Conn
	var err error
	for i := 0; i < 100; i++ {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return conn, err
}

// receivePostcopy is post-copy's destination half. The last writes come
// beside the dump, as one round (lastwrites.go); the push fills the store
// while the copy runs: the restore does not wait for it (not in rx.g).
func receivePostcopy(in *incoming, ctx context.Context, rx receivers) {
	in.store = in.newStore()
	in.lastWrites = &lastWrites{}
	in.store.Observe(in.lastWrites.put, nil)
	rx.g.Go(func() error { return in.receiveRounds(ctx, rx.sess, rx.router) })
	in.push = newPushed(in.store)
	if in.d.pushWait > 0 {
		in.push.wait = in.d.pushWait
	}
	go func() {
		if err := in.push.receive(ctx, rx.sess, rx.router); err != nil && ctx.Err() == nil {
			in.d.log().Warn("post-copy: the push broke off; the lazy-pages daemon asks the source for the rest", "error", err)
		}
	}()
}

// lazyArrival is a lazy restore's (post-copy's, hybrid's): CRIU's
// lazy-pages daemon serves the copy's memory, pulled from the source.
type lazyArrival struct {
	in      *incoming
	started chan lazyStarted
}

type lazyStarted struct {
	lp  *lazyPages
	err error
}

// arriveLazy starts the lazy-pages daemon as soon as the images are here
// (its relay, now), not when the source asks for the restore.
func arriveLazy(in *incoming, ctx context.Context, rx receivers, imagesIn <-chan error) arrival {
	a := &lazyArrival{in: in, started: make(chan lazyStarted, 1)}
	go func() {
		lp, err := in.startLazyPages(ctx, rx.sess, rx.router, imagesIn)
		a.started <- lazyStarted{lp, err}
	}()
	return a
}

func (a *lazyArrival) abandon() {
	if st := <-a.started; st.lp != nil {
		st.lp.stop()
	}
}

// ready takes the daemon, and has the restore write the last writes
// where the technique sent them (receivePostcopy, receiveHybrid).
func (a *lazyArrival) ready(context.Context, receivers) (readied, error) {
	in := a.in
	st := <-a.started
	if st.err != nil {
		return readied{}, st.err
	}
	r := readied{pull: &lazyPull{in: in, lp: st.lp}}
	if in.lastWrites != nil {
		var err error
		if r.lastWrites, err = in.restoreLastWrites(); err != nil {
			return r, fmt.Errorf("adding the last writes to the images on %s: %w", in.d.Host.Name, err)
		}
	}
	return r, nil
}

// lazyPull is a lazy restore's pull from the source (pulling).
type lazyPull struct {
	in *incoming
	lp *lazyPages
}

func (p *lazyPull) restored() {}

func (p *lazyPull) journal() (string, *journal.Pull) {
	return journal.Pulling, p.lp.pull(p.in.work)
}

func (p *lazyPull) end(bool) { p.lp.stop() }

func (p *lazyPull) unheard(_ context.Context, sess *transport.Session, err error) (bool, error) {
	in, lp := p.in, p.lp
	if lp.relay != nil {
		// The source is gone as the pull begins, after the copy
		// started: its pages wait in its page keeper, for its agent
		// to come back (strand), as in a pull the source left later.
		return true, in.strand(lp, sess.Peer.Name, StrandedPullWait(sess.OutageTimeout()))
	}
	// The source is gone as the pull begins: its pages cannot
	// come, and the copy must not run on without them.
	lp.broken()
	return false, fmt.Errorf("lost the source as the post-copy pull began, copy dropped: %w", err)
}

func (p *lazyPull) finish(ctx context.Context, sess *transport.Session, ctl *transport.Channel) (bool, error) {
	in, lp := p.in, p.lp
	in.faults.At(fault.Destination, fault.LazyPages)
	// The container runs here now; its memory keeps arriving until the
	// lazy-pages daemon has pulled every page.
	done, stranded := lp.wait(sess.Done(), sess.OutageTimeout())
	if stranded {
		// The source's agent is gone (restarted?) or the link with it:
		// the copy's faults wait while it may come back (resume.go).
		return true, in.strand(lp, sess.Peer.Name, StrandedPullWait(sess.OutageTimeout()))
	}
	if done.Error != "" {
		// Without its memory the restored container cannot go on. The
		// source resumes its copy on hearing this: only once this one
		// is gone.
		if err := in.target.Discard(context.WithoutCancel(ctx)); err != nil {
			return true, fmt.Errorf("%s, and the restored copy could not be discarded: %w", done.Error, err)
		}
		in.recordFinal(sess.Peer.Name, journal.Dropped)
	} else {
		in.recordFinal(in.peer, journal.Started)
	}
	err := ctl.Send(done)
	in.faults.At(fault.Destination, fault.Cleanup)
	return done.Error == "", err
}

// lazyPages is the destination's CRIU lazy-pages daemon and its tunnel.
type lazyPages struct {
	daemon *criu.LazyPages
	// relay holds the daemon's connection so that the pull outlives this
	// agent (nil: the agent serves the daemon directly; see resume.go).
	relay  *lazyrelay.Process
	tunnel func() error
	ch     *transport.Channel
	local  atomic.Uint64 // pages supplied from the destination's copy
	// freeze stops the restored copy; broke records that the page stream
	// broke before the daemon was done.
	freeze func()
	// endPush, with a push, wakes a request waiting for a pushed page
	// for good: at stop, none will come.
	endPush   func()
	breakOnce sync.Once
	broke     atomic.Bool
	// cut is closed once the source's channel failed, with a relay to
	// wait in (lost); handedOff: the pull was stranded (strand), and stop
	// leaves it be.
	cut       chan struct{}
	cutOnce   sync.Once
	handedOff bool
	// conn is the tunnel's connection to the relay or the daemon.
	conn halfCloser
}

// lost handles the source's channel failing. Without a relay the pull
// cannot wait for the source to come back: it is broken. With one, wait
// tells a lost session (the pull waits for its source) from a source that
// ended the channel itself (broken).
func (lp *lazyPages) lost() {
	if lp.relay == nil {
		lp.broken()
		return
	}
	lp.cutOnce.Do(func() { close(lp.cut) })
}

// broken handles a page stream that broke before every page was in: the
// copy freezes before CRIU's daemon lets go of it (the kernel would fill
// its missing pages with zeros, and it would run on memory that was never
// the source's), then the daemon is stopped, so the pull ends in failure
// and the copy is dropped.
func (lp *lazyPages) broken() {
	lp.breakOnce.Do(func() {
		lp.broke.Store(true)
		lp.freeze()
		if lp.daemon != nil {
			lp.daemon.Stop()
		}
	})
}

// startLazyPages starts the relay that will serve `criu lazy-pages` at
// once, the daemon when the images are in (imagesIn), and waits until the
// daemon's socket exists, so a restore can connect; it serves the daemon's
// page requests through the source's lazy channel once that opens. Each
// is a process to exec: the relay starts while the state is on its way,
// the daemon while the source asks for the restore.
func (in *incoming) startLazyPages(ctx context.Context, sess *transport.Session, router *transport.Router, imagesIn <-chan error) (*lazyPages, error) {
	var ch *transport.Channel
	lp := &lazyPages{cut: make(chan struct{})}
	if in.push != nil {
		lp.endPush = in.push.finish
	}
	lp.freeze = func() {
		// A runtime's freeze can hang on tasks stuck in a fault: bounded.
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c := &runtime.Container{Runtime: in.rt.Kind(), Name: in.offer.Container, ID: in.offer.Container}
		err := in.rt.Freeze(fctx, c)
		if err == nil {
			return
		}
		// Not frozen, the copy would run on zero pages once the daemon
		// lets go: it is killed instead (its init, the container's PID
		// namespace with it). It is dropped next anyway; the source's
		// copy, whole, resumes.
		kerr := killCopy(fctx, in.rt, c.Name)
		in.d.log().Error("post-copy: the page stream broke and the copy could not be frozen: killed", "container", c.Name, "error", err, "kill", kerr)
	}
	serve := func(conn halfCloser) error { return spliceVia(conn, ch, plainCopy, plainCopy, lp.lost) }
	if in.store != nil {
		// Hybrid, and post-copy with its push: answer from the pages held here.
		serve = func(conn halfCloser) error {
			var await pagestream.Await
			var served func(pagestream.PageKey)
			if in.push != nil {
				// Post-copy: a pushed page is needed until the daemon has
				// it, then the store reuses its room: the destination holds
				// what the daemon has not taken yet, not a second copy of
				// all the memory.
				await, served = in.push.await, in.store.Delete
			} else {
				// Hybrid: the store only empties from here, and each slab
				// the daemon has taken whole goes back to the kernel, to
				// become the copy's next pages.
				in.store.GiveBackEmpty()
				served = in.store.Delete
			}
			st, err := pagestream.ServeLazyAwaiting(conn, ch, func(k pagestream.PageKey) ([]byte, pagestream.Hash, bool) {
				return in.store.Get(k)
			}, await, served)
			lp.local.Store(st.LocalPages)
			if err != nil {
				lp.lost()
			}
			_ = conn.CloseWrite()
			return errors.Join(err, ch.CloseWrite())
		}
	}
	link, err := criu.NewLazyPagesLink()
	if err != nil {
		return nil, err
	}
	var conn halfCloser = link.Conn
	if in.d.RelayExe != "" {
		relay, rconn, err := lazyrelay.Start(in.d.RelayExe, link.Conn.UnixConn, in.work)
		link.Conn.UnixConn.Close() // this copy only: the relay's stays open
		if err != nil {
			link.Close()
			return nil, err
		}
		lp.relay, conn = relay, rconn
	}
	if err := <-imagesIn; err != nil {
		link.Close() // the relay, if any, ends with it
		conn.Close()
		return nil, err
	}
	daemon, err := criu.StartLazyPages(link, in.images, in.work, in.store != nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	lp.daemon = daemon
	err = daemon.Listening()
	if err == nil {
		ch, err = router.Wait(ctx, sess, ChanLazy)
	}
	if err != nil {
		daemon.Stop() // and with it the relay
		conn.Close()
		return nil, err
	}
	lp.ch, lp.conn = ch, conn
	served := make(chan error, 1)
	go func() {
		hc := newHoldingReads(conn, daemon, in.d.log())
		defer hc.stop()
		defer conn.Close()
		served <- serve(hc)
	}()
	lp.tunnel = func() error { return <-served }
	return lp, nil
}

// holdEvery spaces the lazy-pages daemon's fault holds after its first:
// a fork's new userfaultfd is held within about this long of the child's
// first request, for a few system calls per hold.
const holdEvery = 10 * time.Millisecond

// holdingReads is the daemon's connection, keeping this agent's copies of
// the daemon's userfaultfds (criu.LazyPages.HoldFaults) current while the
// daemon asks for pages. The daemon asks for its first pages once it holds
// every userfaultfd of the restore: they are held before that request is
// handed on. A restored process that forks later hands the daemon the
// child's userfaultfd, and the daemon soon asks for the child's pages:
// later requests renew the hold, in the background, at most every
// holdEvery.
type holdingReads struct {
	halfCloser
	daemon *criu.LazyPages
	log    *slog.Logger
	held   bool // by Read, which one goroutine calls
	asked  chan struct{}
	done   chan struct{}
	warned atomic.Bool
}

func newHoldingReads(conn halfCloser, daemon *criu.LazyPages, log *slog.Logger) *holdingReads {
	c := &holdingReads{halfCloser: conn, daemon: daemon, log: log, asked: make(chan struct{}, 1), done: make(chan struct{})}
	go c.renew()
	return c
}

func (c *holdingReads) Read(p []byte) (int, error) {
	n, err := c.halfCloser.Read(p)
	switch {
	case n > 0 && !c.held:
		c.held = true
		c.hold()
	case n > 0:
		select {
		case c.asked <- struct{}{}:
		default:
		}
	}
	return n, err
}

func (c *holdingReads) hold() {
	if _, err := c.daemon.HoldFaults(); err != nil && !c.warned.Swap(true) {
		c.log.Warn("post-copy: some of the restored copy's faults are held by the lazy-pages daemon alone", "error", err)
	}
}

func (c *holdingReads) renew() {
	for {
		select {
		case <-c.asked:
		case <-c.done:
			return
		}
		c.hold()
		select {
		case <-time.After(holdEvery):
		case <-c.done:
			return
		}
	}
}

// stop ends the renewals; the copies held stay until ReleaseFaults.
func (c *holdingReads) stop() { close(c.done) }

// wait returns once the daemon has transferred every page or failed, or
// (stranded) once the source was lost with a relay to wait in: the pull
// then waits for the source to come back (strand). A session lost
// (the source gone past the outage timeout) breaks the stream of a pull
// without a relay: a daemon that saw its page server close may wait on
// forever. A channel the source ended while its session lives breaks it
// too.
func (lp *lazyPages) wait(lost <-chan struct{}, outage time.Duration) (done LazyDone, stranded bool) {
	exited := make(chan struct{})
	decided := make(chan bool, 1) // stranded
	go func() {
		select {
		case <-lost:
			if lp.relay != nil {
				decided <- true
				return
			}
			lp.broken()
		case <-lp.cut:
			select {
			case <-lost:
				decided <- true
				return
			case <-time.After(outage + lostGrace):
				lp.broken()
			case <-exited:
			}
		case <-exited:
		}
		decided <- false
	}()
	var r criu.LazyResult
	daemonDone := make(chan struct{})
	go func() { r = lp.daemon.Wait(); close(daemonDone) }()
	select {
	case <-daemonDone:
	case s := <-decided:
		if s {
			return LazyDone{}, true
		}
		<-daemonDone
	}
	close(exited)
	if r.Err != nil {
		// The daemon died with pages still missing: freeze the copy while
		// this agent's hold keeps its faults waiting, then let go.
		lp.broken()
	}
	lp.daemon.ReleaseFaults()
	if lp.broke.Load() && r.Err == nil {
		r.Err = errors.New("the page stream from the source broke before every page was in")
	}
	d := LazyDone{Ms: units.Millis(r.Elapsed), Faulted: r.Faulted, Pushed: r.Pushed}
	// The tunnel ends right after the daemon's last request.
	lp.tunnelEnds(2 * time.Second)
	d.Local = lp.local.Load()
	if r.Err != nil {
		d.Error = r.Err.Error()
	}
	return d, false
}

// tunnelEnds waits up to patience for the tunnel to end, and says
// whether it did.
func (lp *lazyPages) tunnelEnds(patience time.Duration) bool {
	done := make(chan struct{})
	go func() { _ = lp.tunnel(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(patience):
		return false
	}
}

// lostGrace is how long, past the session's outage timeout, a pull whose
// source channel failed waits for the session's loss to say the source is
// gone rather than ending the pull itself: a source agent that dies resets
// its streams at once, and its session is lost only once the outage
// timeout passed without it.
const lostGrace = 2 * time.Second

func (lp *lazyPages) stop() {
	if lp.handedOff {
		return
	}
	lp.daemon.Stop()
	lp.daemon.ReleaseFaults()
	lp.ch.Close()
	if lp.endPush != nil {
		lp.endPush()
	}
	if lp.relay != nil {
		_ = lp.relay.Wait() // it ends with the daemon
	}
}

// pull is what the journal keeps of a pull that has a relay: what a
// restarted agent needs to take it over.
func (lp *lazyPages) pull(dir string) *journal.Pull {
	if lp == nil || lp.relay == nil {
		return nil
	}
	return &journal.Pull{Daemon: lp.daemon.Pid(), Dir: dir}
}

// pullFailed ends a migration whose destination dropped its copy because
// the pull after the commit failed (it said so in done): the source's
// copy, complete but as it was at the freeze, is the one left.
func (m *migration) pullFailed(ctx context.Context, done LazyDone) error {
	return m.abort(ctx, failAt("lazy pages on "+m.sess.Peer.Name, fmt.Errorf("%s: the destination dropped the container; the source copy resumes as it was at the freeze", done.Error)))
}

// killCopy kills a destination's copy's processes (SIGKILL to its init:
// admission gives every container a PID namespace of its own, so the rest
// die with it), for a copy that must not run another instruction.
func killCopy(ctx context.Context, rt runtime.Runtime, name string) error {
	c, err := rt.Inspect(ctx, name)
	if err != nil {
		return err
	}
	if c.PID <= 0 {
		return nil // nothing runs
	}
	return syscall.Kill(c.PID, syscall.SIGKILL)
}

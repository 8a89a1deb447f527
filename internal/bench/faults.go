package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	agentclient "github.com/ferry-migrate/ferry/api/client"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Outcomes of a fault case, once recovery is over.
const (
	RunningAtSource      = "running-at-source"
	RunningAtDestination = "running-at-destination"
	RunningTwice         = "running-twice"
	Lost                 = "lost"
	FrozenInDoubt        = "frozen-in-doubt"
)

// FaultsOptions describe one `ferry-lab bench faults`.
type FaultsOptions struct {
	// Runtimes run the workload (empty: runc). Modes, Phases and Actions
	// narrow the matrix (empty: all of each the runtime allows).
	Runtimes, Modes, Phases, Actions []string
	// Cases, when set, is the matrix (Modes, Phases and Actions are then
	// ignored).
	Cases       []FaultCase
	MemoryBytes int64
	DirtyRate   int
	// OutageTimeout is the lab agents' --outage-timeout; cut-link keeps
	// the source's paths down for this long plus 3 s.
	OutageTimeout time.Duration
	// Settle bounds the wait for recovery after each case.
	Settle time.Duration
	// Address runs the workload with an address of its own on the lab's
	// segment (runc), probed there: a copy that resumes but does not
	// answer at its address shows as its state broken, and a network
	// namespace left on a host without the container as a leak.
	Address  bool
	FerryBin string
	Log      io.Writer
}

// faultsIP is the workload's address with FaultsOptions.Address.
const faultsIP = lab.SegmentSubnet + "60"

// FaultCase is one cell of the matrix and what became of it.
type FaultCase struct {
	// Runtime runs the container (runc when not set).
	Runtime string `json:"runtime"`
	Mode    string `json:"mode"`
	Phase   string `json:"phase"`
	Fault   string `json:"fault"`
	// Outcome is where the container runs once recovery is over.
	Outcome string `json:"outcome"`
	// StateOK: the workload's client saw its state intact throughout.
	StateOK bool     `json:"state_ok"`
	Leaks   []string `json:"leaks"`
	// RecoveredMs: from the migration's end (its report, or its agent's
	// death) until the container ran in exactly one place again.
	RecoveredMs float64 `json:"recovered_ms"`
	// What the source's report said (none when the source agent died).
	Report string `json:"report,omitempty"`
	// Hung: the migration had not ended after caseTimeout.
	Hung bool   `json:"hung,omitempty"`
	Note string `json:"note,omitempty"`
}

// FaultsSummary counts the matrix's bad outcomes.
type FaultsSummary struct {
	Cases         int `json:"cases"`
	RunningTwice  int `json:"running_twice"`
	Lost          int `json:"lost"`
	FrozenInDoubt int `json:"frozen_in_doubt"`
	StateBad      int `json:"state_bad"`
	Hung          int `json:"hung"`
	Leaks         int `json:"leaks"`
}

// FaultsResult is the whole matrix.
type FaultsResult struct {
	Cases   []FaultCase   `json:"cases"`
	Summary FaultsSummary `json:"summary"`
}

// FaultMatrix lists the cases worth running: for each runtime, each mode
// it can run, each phase, each fault where its side has something to
// break at that phase.
func FaultMatrix(runtimes, modes, phases, actions []string) []FaultCase {
	if len(runtimes) == 0 {
		runtimes = []string{"runc"}
	}
	var out []FaultCase
	for _, rt := range runtimes {
		for _, m := range faultModes {
			if len(modes) > 0 && !slices.Contains(modes, m) {
				continue
			}
			for _, p := range fault.Phases {
				if len(phases) > 0 && !slices.Contains(phases, p) {
					continue
				}
				for _, a := range fault.Actions {
					if len(actions) > 0 && !slices.Contains(actions, a) {
						continue
					}
					if applies(rt, m, p, a) {
						out = append(out, FaultCase{Runtime: rt, Mode: m, Phase: p, Fault: a})
					}
				}
			}
		}
	}
	return out
}

// faultModes are the techniques the matrix runs, in every runtime (each
// restores lazily too where CRIU's lazy pages work).
var faultModes = []string{engine.ModeCold, engine.ModePrecopy, engine.ModePostcopy, engine.ModeHybrid}

// labFeatures are what the matrix assumes a lab host offers its
// runtimes: CRIU's lazy pages and Docker's ferry-runc, as a plan does.
var labFeatures = runtime.PlanFeatures

// coldRebuilds says whether the engine moves kind's containers cold
// through the rebuild switchover on a lab host (a restore that copies its
// images: Docker's).
func coldRebuilds(kind string) bool {
	g, ok := all.Registry.Get(kind)
	return ok && engine.ColdSwitchover("", g.Caps(labFeatures)) == engine.SwitchoverRebuild
}

// applies says whether fault a at phase p of mode m in runtime rt breaks
// something. Pre-copy has a lazy-pages phase too: the destination's copy
// runs while its memory
// arrives from the destination's own images, the source waiting, frozen.
// So has a cold migration through the rebuild switchover (Docker's),
// which runs no page server at the destination during the dump.
func applies(rt, m, p, a string) bool {
	lazy := m == engine.ModePostcopy || m == engine.ModeHybrid
	coldRebuild := m == engine.ModeCold && coldRebuilds(rt)
	pulls := lazy || m == engine.ModePrecopy || coldRebuild
	switch p {
	case fault.Rounds:
		if m != engine.ModePrecopy && m != engine.ModeHybrid {
			return false
		}
	case fault.LazyPages:
		if !pulls {
			return false
		}
	}
	switch a {
	case fault.KillSource, fault.TermSource:
		return true
	case fault.KillDestination, fault.TermDestination:
		return p != fault.Freeze // the destination takes no part in it
	case fault.KillSourceCRIU: // the dump, and a lazy dump's page server
		return p == fault.Dump || (lazy && p == fault.LazyPages)
	case fault.KillDestinationCRIU: // the page server, the restore, the lazy-pages daemon
		return (p == fault.Dump && !lazy && !coldRebuild) || p == fault.Restore || (pulls && p == fault.LazyPages)
	case fault.StrandDestinationCRIU: // the restore's CRIU, below the agent only under runc
		return p == fault.Restore && rt == "runc"
	case fault.RestoreFails:
		return p == fault.Restore
	case fault.CutLink:
		return p == fault.Rounds || p == fault.Dump || p == fault.Restore || p == fault.Commit || p == fault.LazyPages
	case fault.ScratchFull:
		return p == fault.Dump
	}
	return false
}

// Faults runs the matrix in a 3-host lab (h1 source, h2 destination, h3
// the workload's client) and reports each case's outcome and leaks.
func Faults(ctx context.Context, o FaultsOptions) (res FaultsResult, err error) {
	if o.MemoryBytes == 0 {
		o.MemoryBytes = 64 << 20
	}
	if o.DirtyRate == 0 {
		o.DirtyRate = 200
	}
	if o.OutageTimeout == 0 {
		o.OutageTimeout = 3 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = 60 * time.Second
	}
	cases, images, err := o.plan()
	if err != nil {
		return res, err
	}
	l, down, err := upLab(ctx, lab.Options{Hosts: 3, OutageTimeout: o.OutageTimeout, FerryBin: o.FerryBin})
	if err != nil {
		return res, err
	}
	defer down(&err)
	for _, kind := range images {
		o.logf("importing the workload image into h1's and h2's %s", kind)
		if err := l.ImportWorkloadImage(ctx, kind, l.Hosts[0].Name, l.Hosts[1].Name); err != nil {
			return res, err
		}
	}
	res.Cases = []FaultCase{}
	for i, c := range cases {
		o.logf("case %d/%d: %s, %s, %s at %s", i+1, len(cases), c.Runtime, c.Mode, c.Fault, c.Phase)
		c = o.runCase(ctx, l, c, fmt.Sprintf("fault-%d", i+1))
		o.logf("case %d/%d: %s (state_ok=%v, recovered in %.0f ms) leaks %v %s", i+1, len(cases), c.Outcome, c.StateOK, c.RecoveredMs, c.Leaks, c.Note)
		res.Cases = append(res.Cases, c)
		res.Summary.add(c)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		for _, leak := range c.Leaks {
			if strings.Contains(leak, "could not remove") {
				// It may hold the workload's port: every case after it
				// would fail for that alone.
				return res, fmt.Errorf("case %d left a container behind (%s): the matrix stops here", i+1, leak)
			}
		}
	}
	return res, nil
}

// plan is the cases o asks for, each with its runtime named (runc when
// not), and the runtimes whose workload runs from an image, to import
// first; it refuses what the matrix cannot run, before any lab comes up.
func (o FaultsOptions) plan() (cases []FaultCase, images []string, err error) {
	cases = o.Cases
	if len(cases) == 0 {
		for _, rt := range o.Runtimes {
			if kinds := lab.RunnableKinds(); !slices.Contains(kinds, rt) {
				return nil, nil, fmt.Errorf("unknown runtime %q (one of %s)", rt, strings.Join(kinds, ", "))
			}
		}
		for _, m := range o.Modes {
			if !slices.Contains(faultModes, m) {
				return nil, nil, fmt.Errorf("unknown mode %q (one of %s)", m, strings.Join(faultModes, ", "))
			}
		}
		for _, a := range o.Actions {
			if !slices.Contains(fault.Actions, a) {
				return nil, nil, fmt.Errorf("unknown fault %q (one of %s)", a, strings.Join(fault.Actions, ", "))
			}
		}
		for _, p := range o.Phases {
			if !slices.Contains(fault.Phases, p) {
				return nil, nil, fmt.Errorf("unknown phase %q (one of %s)", p, strings.Join(fault.Phases, ", "))
			}
		}
		cases = FaultMatrix(o.Runtimes, o.Modes, o.Phases, o.Actions)
	}
	if o.Address {
		for _, c := range cases {
			if c.Runtime != "" && c.Runtime != "runc" {
				return nil, nil, fmt.Errorf("--address runs the workload on the lab's segment under runc only, not %s", c.Runtime)
			}
		}
	}
	cases = slices.Clone(cases)
	for i, c := range cases {
		if c.Runtime == "" {
			cases[i].Runtime = "runc"
		}
		rt, err := lab.RuntimeOf(c.Runtime)
		if err != nil {
			return nil, nil, err
		}
		if rt.Tool == "" {
			continue
		}
		if _, err := exec.LookPath(rt.Tool); err != nil {
			return nil, nil, fmt.Errorf("%s cases need %s, which this host lacks (make setup installs it)", c.Runtime, rt.Tool)
		}
		if rt.ImportImage != nil && !slices.Contains(images, c.Runtime) {
			images = append(images, c.Runtime)
		}
	}
	if len(cases) == 0 {
		return nil, nil, errors.New("no fault case matches: see `ferry-lab bench faults --help` for which faults apply to which phases")
	}
	return cases, images, nil
}

func (s *FaultsSummary) add(c FaultCase) {
	s.Cases++
	switch c.Outcome {
	case RunningTwice:
		s.RunningTwice++
	case Lost:
		s.Lost++
	case FrozenInDoubt:
		s.FrozenInDoubt++
	}
	if !c.StateOK && (c.Outcome == RunningAtSource || c.Outcome == RunningAtDestination) {
		s.StateBad++
	}
	s.Leaks += len(c.Leaks)
	if c.Hung {
		s.Hung++
	}
}

func (o FaultsOptions) logf(format string, args ...any) { logTo(o.Log, format, args...) }

// runCase runs one migration with one fault, brings killed or stopped
// agents back, waits for recovery and looks for what was left behind.
func (o FaultsOptions) runCase(ctx context.Context, l *lab.Lab, c FaultCase, name string) FaultCase {
	src, dst, client := &l.Hosts[0], &l.Hosts[1], &l.Hosts[2]
	kind := c.Runtime
	c.Leaks = []string{}
	before := snapshot(l)
	mo := MigrateOptions{MemoryBytes: o.MemoryBytes}
	args := []string{"/bin/memhog", "--memory", strconv.FormatInt(o.MemoryBytes, 10), "--dirty-rate", strconv.Itoa(o.DirtyRate), "--port", strconv.Itoa(workloadPort)}
	addrs := workloadAddrs(1, src, dst)
	var err error
	if o.Address {
		err = l.RunOnSegment(ctx, src.Name, name, faultsIP, nil, args)
		addrs = []string{fmt.Sprintf("%s:%d", faultsIP, workloadPort)}
	} else {
		err = l.RunIn(ctx, kind, src.Name, name, args)
	}
	if err != nil {
		c.Outcome, c.Note = Lost, "the workload did not start: "+err.Error()
		return c
	}
	// removeBoth says what it could not remove: a copy left behind (a
	// frozen one holds the workload's port) would spoil the next cases.
	removeBoth := func() (left []string) {
		cctx := context.WithoutCancel(ctx)
		for _, h := range []*lab.Host{src, dst} {
			if err := l.RemoveFrom(cctx, kind, h.Name, name); err != nil {
				left = append(left, fmt.Sprintf("container: %s's %s could not remove %s: %v", h.Name, kind, name, err))
			}
			if o.Address {
				_ = cnet.Delete(cnet.Name(h.Name, name))
			}
		}
		return left
	}
	defer removeBoth()
	p, _, err := StartProbe(ctx, client, o.FerryBin, addrs, mo.readyTimeout())
	if err != nil {
		c.Outcome, c.Note = Lost, err.Error()
		return c
	}
	time.Sleep(300 * time.Millisecond)

	req := engine.Request{Container: name, To: dst.AgentAddr, Mode: c.Mode, Runtime: kind}
	var unmount func()
	var cut sync.WaitGroup
	var cutOnce atomic.Bool
	progress := func(pr engine.Progress) {}
	switch c.Fault {
	case fault.ScratchFull:
		um, err := fillScratch(dst.ScratchDir)
		if err != nil {
			_, _ = p.Stop()
			c.Outcome, c.Note = Lost, "scratch-full: "+err.Error()
			return c
		}
		unmount = um
	case fault.CutLink:
		progress = func(pr engine.Progress) {
			if fault.PhaseOf(pr.Phase) == c.Phase && cutOnce.CompareAndSwap(false, true) {
				cut.Add(1)
				go func() {
					defer cut.Done()
					setAllPaths(l, src.Name, false)
					time.Sleep(o.OutageTimeout + 3*time.Second)
					setAllPaths(l, src.Name, true)
				}()
			}
		}
	default:
		req.Faults = []string{fault.Fault{Action: c.Fault, Phase: c.Phase}.String()}
	}
	mctx, cancel := context.WithTimeout(ctx, caseTimeout)
	var restarts []string
	stopRestarts := func() {}
	if c.Fault == fault.KillSource || c.Fault == fault.KillDestination {
		// A killed agent comes back while the migration goes on, as
		// systemd brings it back (ferry-agent.service: RestartSec=2s).
		stopRestarts = restartKilled(mctx, l, []*lab.Host{src, dst}, 2*time.Second, &restarts)
	}
	rep, merr := agentclient.Migrate(mctx, agentclient.Socket(src.ControlSock), req, progress)
	stopRestarts()
	hung := mctx.Err() != nil && ctx.Err() == nil
	cancel()
	cut.Wait()
	if unmount != nil {
		unmount()
	}
	ended := time.Now()
	switch {
	case merr != nil:
		c.Report = "no report: " + merr.Error()
	case rep.OK:
		c.Report = "ok, source " + rep.SourceState
	default:
		c.Report = fmt.Sprintf("failed at %s, source %s: %s", rep.FailedAt, rep.SourceState, rep.Error)
	}
	if c.Fault == fault.CutLink && !cutOnce.Load() {
		c.Note = "the phase passed before the cut"
	}

	notes := restarts
	c.Hung = hung
	if hung {
		// A migration that never ends is a finding in itself; the agents
		// are killed (as an operator would) and recovery takes over.
		notes = append(notes, fmt.Sprintf("HUNG: the migration had not ended after %v; both agents killed", caseTimeout))
		for _, h := range []*lab.Host{src, dst} {
			if h.AgentAlive() {
				notes = append(notes, keepStacks(h))
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Agents that were killed or told to stop come back, as systemd would
	// bring them.
	for _, h := range []*lab.Host{src, dst} {
		if n := bringBack(ctx, l, h); n != "" {
			notes = append(notes, n)
		}
	}
	twice := false
	var s, d string
	// Settled means the journals are final, no CRIU runs, and the
	// container runs in one place, seen so on two polls in a row: a copy
	// being removed passes through states (thawed, its processes not yet
	// dead) that one poll could take for the last.
	stable, settledAt := 0, time.Time{}
	for deadline := time.Now().Add(o.Settle); ; time.Sleep(200 * time.Millisecond) {
		quiet := len(labCRIUs(l)) == 0 && len(pending(src, name))+len(pending(dst, name)) == 0
		s, d = containerState(kind, src, name), containerState(kind, dst, name)
		if s == "running" && d == "running" {
			twice = true
		}
		if quiet && (s == "running") != (d == "running") && (s == "absent" || d == "absent") {
			if stable++; stable == 1 {
				settledAt = time.Now()
			}
		} else {
			stable = 0
		}
		if stable == 2 || time.Now().After(deadline) {
			break
		}
	}
	if stable < 2 {
		settledAt = time.Now()
	}
	c.RecoveredMs = units.Millis(settledAt.Sub(ended))
	// Late answers after the recovery, then the client's verdict.
	time.Sleep(500 * time.Millisecond)
	pr, perr := p.Stop()
	c.StateOK = perr == nil && pr.StateOK
	if perr == nil && !pr.StateOK {
		notes = append(notes, "client: "+pr.Reason)
	}
	c.Outcome = outcome(s, d, twice)
	if c.Outcome != RunningAtSource && c.Outcome != RunningAtDestination {
		notes = append(notes, fmt.Sprintf("source %s, destination %s after %v", s, d, o.Settle))
	}
	for _, e := range append(pending(src, name), pending(dst, name)...) {
		c.Leaks = append(c.Leaks, "journal: "+e)
	}
	for _, h := range []struct{ name, state string }{{src.Name, s}, {dst.Name, d}} {
		if h.state == "exited" {
			c.Leaks = append(c.Leaks, fmt.Sprintf("container: %s's %s keeps %s, not running", h.name, kind, name))
		}
	}
	if o.Address {
		// The namespace ferry made for a copy goes with the copy.
		for _, h := range []struct{ name, state string }{{src.Name, s}, {dst.Name, d}} {
			if _, err := os.Stat(cnet.Path(cnet.Name(h.name, name))); err == nil && h.state == "absent" {
				c.Leaks = append(c.Leaks, fmt.Sprintf("netns: %s kept %s's network namespace without the container", h.name, name))
			}
		}
	}
	// What is left once the container is gone counts as leaked.
	c.Leaks = append(c.Leaks, removeBoth()...)
	c.Leaks = append(c.Leaks, leftSince(l, before)...)
	cleanLeaks(l)
	c.Note = strings.TrimSpace(strings.Join(append([]string{c.Note}, notes...), "; "))
	return c
}

// caseTimeout bounds one faulty migration: 64 MiB move in seconds, and
// the slowest recovery paths (a cut past the outage timeout, a commit
// window) take tens of seconds.
const caseTimeout = 2 * time.Minute

// outcome names where the container ended up.
func outcome(s, d string, twice bool) string {
	switch {
	case twice || (s == "running" && d == "running"):
		return RunningTwice
	case s == "paused" || d == "paused" || s == "stopped" || d == "stopped":
		return FrozenInDoubt
	case s == "running":
		return RunningAtSource
	case d == "running":
		return RunningAtDestination
	}
	return Lost
}

// containerState is a lab container's state as its clients see it:
// absent, running, paused (frozen), stopped (restored but held with
// SIGSTOP: runc and Podman call that running), or exited (its runtime
// keeps it, not running: Podman's exited or created, LXC's STOPPED).
func containerState(kind string, h *lab.Host, name string) string {
	rt, err := lab.RuntimeOf(kind)
	if err == nil && rt.Inspect == nil {
		err = fmt.Errorf("the lab inspects no %s containers", rt.Kind)
	}
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	c, err := rt.Inspect(context.Background(), h, name)
	if errors.Is(err, runc.ErrNotFound) || errors.Is(err, runtime.ErrNotFound) {
		return "absent"
	}
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	switch ps, _ := procs.State(c.PID); {
	case c.Status == "running" && ps == 'T':
		return "stopped"
	case c.Status == "stopped":
		return "exited"
	}
	return c.Status
}

// restartKilled watches hosts' agents until stop is called, restarting
// each that died after delay, and notes what it did in notes (read once
// stop returned).
func restartKilled(ctx context.Context, l *lab.Lab, hosts []*lab.Host, delay time.Duration, notes *[]string) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, h := range hosts {
				if h.AgentPID <= 0 || h.AgentAlive() {
					continue
				}
				select {
				case <-quit:
					return
				case <-time.After(delay):
				}
				if err := l.RestartAgent(ctx, h.Name); err != nil {
					*notes = append(*notes, fmt.Sprintf("restarting %s's agent mid-migration: %v", h.Name, err))
				} else {
					*notes = append(*notes, "restarted "+h.Name+"'s agent mid-migration")
				}
			}
		}
	}()
	return func() { close(quit); <-done }
}

// bringBack restarts a host's agent if it died, after letting a stopping
// one finish its drain; it says what it did.
func bringBack(ctx context.Context, l *lab.Lab, h *lab.Host) string {
	if h.AgentAlive() {
		// A SIGTERMed agent drains, then exits: give it the time a
		// migration's abort takes.
		deadline := time.Now().Add(3 * time.Second)
		for h.AgentAlive() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if h.AgentAlive() {
			return ""
		}
	}
	if err := l.RestartAgent(ctx, h.Name); err != nil {
		return fmt.Sprintf("restarting %s's agent: %v", h.Name, err)
	}
	return "restarted " + h.Name + "'s agent"
}

// pending lists a host's journal entries for a container not in a final
// state.
func pending(h *lab.Host, container string) []string {
	j, err := journal.Open(filepath.Join(h.StateDir, "journal"))
	if err != nil {
		return []string{err.Error()}
	}
	es, err := j.Pending()
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range es {
		if e.Container == container {
			out = append(out, fmt.Sprintf("%s: %s %s %s", h.Name, e.ID, e.Role, e.State))
		}
	}
	return out
}

// fillScratch mounts a 64 KiB tmpfs over dir: the destination's images
// no longer fit. The returned func unmounts it.
func fillScratch(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		return nil, err
	}
	return func() {
		// A CRIU still writing keeps it busy for a moment.
		for i := 0; i < 50; i++ {
			if err := unix.Unmount(dir, 0); err == nil || errors.Is(err, syscall.EINVAL) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}, nil
}

// keepStacks ends a hung case's agent with SIGQUIT, so that it writes
// every goroutine's stack into its log (SIGKILL after 3 s), and keeps a
// copy of that log, which the lab removes, in the temporary directory:
// the evidence of where it waited.
func keepStacks(h *lab.Host) string {
	_ = syscall.Kill(h.AgentPID, syscall.SIGQUIT)
	for deadline := time.Now().Add(3 * time.Second); h.AgentAlive() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if h.AgentAlive() {
		_ = syscall.Kill(h.AgentPID, syscall.SIGKILL)
	}
	log, err := os.ReadFile(h.AgentLog())
	if err != nil {
		return fmt.Sprintf("%s's agent log: %v", h.Name, err)
	}
	out := filepath.Join(os.TempDir(), fmt.Sprintf("ferry-hung-%s-%s.log", h.Name, time.Now().Format("20060102-150405")))
	if err := os.WriteFile(out, log, 0o600); err != nil {
		return fmt.Sprintf("%s's agent log: %v", h.Name, err)
	}
	return fmt.Sprintf("%s's agent quit with its goroutines' stacks: %s", h.Name, out)
}

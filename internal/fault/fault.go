// Package fault names the failures ferry injects into its own migrations,
// for tests and `ferry-lab bench faults`: an agent killed or stopped at a
// phase, CRIU killed under it, a restore that fails. Agents honour them
// only when started with --allow-faults. A fault is ACTION@PHASE, e.g.
// "kill-destination@restore"; the agent on the action's side carries it
// out when its migration reaches the phase.
//
// Two faults come from outside the agents, and the lab carries them out:
// cut-link (every path of the source down past the outage timeout) and
// scratch-full (the destination's scratch space full).
package fault

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// Actions.
const (
	KillSource          = "kill-source"           // SIGKILL the source agent
	KillDestination     = "kill-destination"      // SIGKILL the destination agent
	TermSource          = "term-source"           // SIGTERM the source agent (it drains)
	TermDestination     = "term-destination"      // SIGTERM the destination agent
	KillSourceCRIU      = "kill-source-criu"      // SIGKILL the source's CRIU
	KillDestinationCRIU = "kill-destination-criu" // SIGKILL the destination's CRIU
	// SIGKILL the destination's restoring CRIU alone, once it forked the
	// first task it restores, which waits for it (runc: its CRIU runs
	// below the agent).
	StrandDestinationCRIU = "strand-destination-criu"
	RestoreFails          = "restore-fails" // the restore's images are incomplete
	CutLink               = "cut-link"      // the lab: the source's paths down past the outage timeout
	ScratchFull           = "scratch-full"  // the lab: the destination's scratch space is full
)

// Phases, as the source's report names them (pre-copy's rounds are
// round-0, round-1, ...: "rounds" is the second, so one has moved).
const (
	Rounds    = "rounds"
	Freeze    = "freeze"
	Dump      = "dump"
	Restore   = "restore"
	Commit    = "commit"
	LazyPages = "lazy-pages"
	Cleanup   = "cleanup"
	// VolumeSync is a volume's live sync, at the destination. Only a
	// container with volumes reaches it, so the matrix leaves it out.
	VolumeSync = "volume-sync"
)

// Actions and Phases list every action and phase, in matrix order.
var (
	Actions = []string{KillSource, KillDestination, TermSource, TermDestination, KillSourceCRIU, KillDestinationCRIU, StrandDestinationCRIU, RestoreFails, CutLink, ScratchFull}
	Phases  = []string{Rounds, Freeze, Dump, Restore, Commit, LazyPages, Cleanup}
)

// Fault is one injected failure.
type Fault struct {
	Action string
	Phase  string
}

func (f Fault) String() string { return f.Action + "@" + f.Phase }

// Parse reads ACTION@PHASE.
func Parse(s string) (Fault, error) {
	a, p, ok := strings.Cut(s, "@")
	if !ok || !slices.Contains(Actions, a) || !slices.Contains(slices.Concat(Phases, []string{VolumeSync}), p) {
		return Fault{}, fmt.Errorf("bad fault %q: want ACTION@PHASE (ACTION one of %s; PHASE one of %s) or %s or %s",
			s, strings.Join(Actions, ", "), strings.Join(slices.Concat(Phases, []string{VolumeSync}), ", "), ForgetPages, RootfsFinal)
	}
	return Fault{a, p}, nil
}

// Knobs are single-word test faults the engine acts on where they belong:
// the destination forgets some pre-copy pages (the switchover must fetch
// them), or refuses the frozen root filesystem sync.
const (
	ForgetPages = "forget-pages"
	RootfsFinal = "rootfs-final"
)

// Set is a migration's faults.
type Set struct {
	faults []Fault
	knobs  []string
}

// ParseSet reads faults: ACTION@PHASE or a knob.
func ParseSet(ss []string) (Set, error) {
	var out Set
	var errs []error
	for _, s := range ss {
		if s == ForgetPages || s == RootfsFinal {
			out.knobs = append(out.knobs, s)
			continue
		}
		f, err := Parse(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out.faults = append(out.faults, f)
	}
	return out, errors.Join(errs...)
}

// Has says whether the set holds action at phase.
func (s Set) Has(action, phase string) bool {
	return slices.Contains(s.faults, Fault{action, phase})
}

// Knob says whether the set holds a knob.
func (s Set) Knob(k string) bool { return slices.Contains(s.knobs, k) }

// PhaseOf maps the source's phase names onto the matrix's: round-1 is
// "rounds" (round-0 has nothing before it to lose), the others are
// themselves.
func PhaseOf(name string) string {
	if r, ok := strings.CutPrefix(name, "round-"); ok {
		if n, err := strconv.Atoi(r); err == nil && n == 1 {
			return Rounds
		}
		return ""
	}
	return name
}

// Side is which agent carries out an action.
type Side int

const (
	Source Side = iota
	Destination
)

// At carries out, on this agent (side), the faults of s due at phase: a
// CRIU kill once CRIU runs (it starts after the phase does), the agent's
// own kill or SIGTERM at once, or in the dump phase once CRIU dumps
// (after at most 2 s where this side runs no CRIU then).
func (s Set) At(side Side, phase string) {
	s.CRIU(side, phase)
	if phase == Dump && s.agent(side, phase) {
		go func() {
			waitCRIU(os.Getpid(), 2*time.Second)
			s.Agent(side, phase)
		}()
		return
	}
	s.Agent(side, phase)
}

// actions are the side's own: killing its agent, stopping it, killing
// its CRIU.
func (side Side) actions() (kill, term, criu string) {
	if side == Destination {
		return KillDestination, TermDestination, KillDestinationCRIU
	}
	return KillSource, TermSource, KillSourceCRIU
}

// CRIU kills this side's CRIU once it has run a moment, if s asks for it
// at phase; at the destination, it may strand the restore instead.
func (s Set) CRIU(side Side, phase string) {
	if _, _, criu := side.actions(); s.Has(criu, phase) {
		go func() {
			if waitCRIU(os.Getpid(), 10*time.Second) {
				for _, p := range procs.Descendants(os.Getpid(), "criu") {
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
			}
		}()
	}
	if side == Destination && s.Has(StrandDestinationCRIU, phase) {
		go strand(10 * time.Second)
	}
}

// strand kills a restoring CRIU below this agent (one whose parent is not
// the agent: the runtime's), and nothing else, once it forked the first
// task it restores: CRIU forks it as its own sibling, a second CRIU below
// the same parent. Let run a millisecond at a time until then, CRIU
// cannot get past the fork unseen; the task waits for it (to set up its
// namespaces) when it dies, holding the runtime's socket.
func strand(within time.Duration) {
	deadline := time.Now().Add(within)
	restoring := func() (criu, parent int) {
		for _, p := range procs.Descendants(os.Getpid(), "criu") {
			if pp, ok := procs.Parent(p); ok && pp != os.Getpid() {
				return p, pp
			}
		}
		return 0, 0
	}
	criu, parent := restoring()
	for ; criu == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		criu, parent = restoring()
	}
	if criu == 0 {
		return
	}
	forked := func() bool {
		for _, p := range procs.Descendants(parent, "criu") {
			if pp, _ := procs.Parent(p); pp == parent && p != criu {
				return true
			}
		}
		return false
	}
	var hit bool
	if !procs.StopWhen(criu, time.Millisecond, func() bool {
		hit = forked()
		return hit || !time.Now().Before(deadline)
	}) {
		return // it ended
	}
	if hit {
		_ = syscall.Kill(criu, syscall.SIGKILL)
		return
	}
	_ = syscall.Kill(criu, syscall.SIGCONT)
}

// Agent kills this agent (SIGKILL: it does not return) or asks it to stop
// (SIGTERM), if s asks for it at phase.
func (s Set) Agent(side Side, phase string) {
	kill, term, _ := side.actions()
	if s.Has(term, phase) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
	if s.Has(kill, phase) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

func (s Set) agent(side Side, phase string) bool {
	kill, term, _ := side.actions()
	return s.Has(kill, phase) || s.Has(term, phase)
}

// waitCRIU waits until a CRIU process runs below pid, then 50 ms more so
// that it is at work; false if none came within the time given. One that
// runs already when the phase begins is a dump or restore begun early,
// waiting at its gate for this very step (or a lazy-pages daemon beside
// it): it is at work within milliseconds, and done within ~25 ms, so the
// wait is 5 ms.
func waitCRIU(pid int, within time.Duration) bool {
	settle := 5 * time.Millisecond
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if len(procs.Descendants(pid, "criu")) > 0 {
			time.Sleep(settle)
			return true
		}
		settle = 50 * time.Millisecond
	}
	return false
}

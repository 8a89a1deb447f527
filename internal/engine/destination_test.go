package engine

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// An offer the destination cannot honour is refused before the runtime
// prepares anything (but for the runtime's own refusal, which is its
// Prepare): nothing to discard, nothing journaled, no scratch left.
func TestDestinationRefusesBadOffers(t *testing.T) {
	for _, c := range []struct {
		name     string
		change   func(*harness)
		offer    func(*Offer)
		want     string
		prepared int // Prepare calls: 1 only when the runtime refuses
	}{
		{name: "unknown mode", offer: func(o *Offer) { o.Mode = "teleport" }, want: `unknown mode "teleport"`},
		{name: "empty mode", offer: func(o *Offer) { o.Mode = "" }, want: "unknown mode"},
		{name: "container ../x", offer: func(o *Offer) { o.Container = "../x" }, want: `bad container name "../x"`},
		{name: "container a/b", offer: func(o *Offer) { o.Container = "a/b" }, want: "bad container name"},
		{name: "container ..", offer: func(o *Offer) { o.Container = ".." }, want: "bad container name"},
		{name: "container .", offer: func(o *Offer) { o.Container = "." }, want: "bad container name"},
		{name: "no container name", offer: func(o *Offer) { o.Container = "" }, want: "bad container name"},
		{name: "a runtime this host lacks", offer: func(o *Offer) { o.Runtime = "podman" }, want: `runtime "podman" is not available on this host (present: fake)`},
		{name: "no runtime named means runc", offer: func(o *Offer) { o.Runtime = "" }, want: `runtime "runc" is not available`},
		{name: "memory beyond the admission policy", offer: func(o *Offer) { o.MemoryBytes = 1<<30 + 1 }, want: "announced memory 1073741825 bytes exceeds 1073741824"},
		{name: "negative memory", offer: func(o *Offer) { o.MemoryBytes = -1 }, want: "announced memory -1 bytes"},
		{name: "more rounds than the policy allows", offer: func(o *Offer) { o.Mode, o.Precopy.MaxRounds = ModePrecopy, 65 }, want: "65 pre-copy rounds asked, at most 64"},
		{name: "negative rounds", offer: func(o *Offer) { o.Precopy.MaxRounds = -1 }, want: "-1 pre-copy rounds"},
		{name: "a volume named ../x", offer: func(o *Offer) { o.Volumes = []runtime.Volume{{Name: "../x", Path: "/data"}} }, want: `bad volume name "../x"`},
		{name: "a volume named twice", offer: func(o *Offer) { o.Volumes = []runtime.Volume{{Name: "d", Path: "/a"}, {Name: "d", Path: "/b"}} }, want: `bad volume name "d"`},
		{name: "a volume at a relative path", offer: func(o *Offer) { o.Volumes = []runtime.Volume{{Name: "d", Path: "data/../../x"}} }, want: "bad path in the container"},
		{name: "a volume over the root", offer: func(o *Offer) { o.Volumes = []runtime.Volume{{Name: "d", Path: "/"}} }, want: "bad path in the container"},
		{name: "a volume of negative size", offer: func(o *Offer) { o.Volumes = []runtime.Volume{{Name: "d", Path: "/d", Bytes: -1}} }, want: "negative size"},
		{name: "a technique the runtime cannot receive", offer: func(o *Offer) { o.Mode = ModePostcopy }, want: "h2: postcopy cannot move fake containers on this host: it needs a lazy restore"},
		{name: "native pre-copy without pre-dump", offer: func(o *Offer) { o.Mode, o.Precopy.Engine = ModePrecopy, PrecopyNative }, want: "soft-dirty"},
		{name: "a bind mount of a path this host does not allow", offer: func(o *Offer) { o.Shared = []shareddir.Dir{{Source: "/etc", Path: "/x", Identity: "1:2.3:4"}} },
			want: "bind mount /etc (at /x in the container): not under a directory this host allows"},
		{name: "a bind mount of another directory than the source's", change: func(h *harness) { h.d.Admission.BindSources = []string{"/"} },
			offer: func(o *Offer) { o.Shared = []shareddir.Dir{{Source: "/etc", Path: "/x", Identity: "1:2.3:4"}} },
			want:  "this host's /etc is another directory than the source's"},
		{name: "CRIU missing", change: func(h *harness) { h.d.CRIUError = errors.New("criu: executable file not found") },
			want: "CRIU cannot restore on h2: criu: executable file not found"},
		{name: "an address of its own without a segment bridge",
			offer: func(o *Offer) {
				o.Network = &cnet.Spec{Ifaces: []cnet.Iface{{Name: "eth0", MAC: "02:00:00:00:00:01", MTU: 1500, Addrs: []string{"10.77.0.5/24"}}}}
			},
			want: "h2 has no bridge to the shared segment"},
		{name: "the runtime refuses (name taken)", change: func(h *harness) { h.rt.prepareErr = errors.New(`container "web" exists`) },
			want: `fake on h2: container "web" exists`, prepared: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var change []func(*harness)
			if c.change != nil {
				change = append(change, c.change)
			}
			h := newHarness(t, change...)
			o := testOffer(ModeCold)
			if c.offer != nil {
				c.offer(&o)
			}
			_, err := h.offer(o)
			if !transport.IsRemote(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("offer answered with %v, want a refusal saying %q", err, c.want)
			}
			h.returned()
			h.want(counts{prepared: c.prepared})
			h.allDropped()
			h.scratchGone(o.ID)
		})
	}
}

// Mode auto settles the technique after the offer: a step the host
// cannot honour is refused then, and what Prepare made is discarded.
func TestDestinationRefusesBadAutoSteps(t *testing.T) {
	maxRounds := 65
	for _, c := range []struct {
		name string
		step any
		want string // "": the destination closes without a word
	}{
		{name: "a technique the runtime cannot receive", step: Step{Do: "mode", Mode: ModeHybrid}, want: "it needs a lazy restore"},
		{name: "an unknown mode", step: Step{Do: "mode", Mode: "teleport"}},
		{name: "auto again", step: Step{Do: "mode", Mode: ModeAuto}},
		{name: "another step than mode", step: Step{Do: "restore"}},
		{name: "rounds beyond the policy", step: Step{Do: "mode", Mode: ModePrecopy, Precopy: &PrecopyOptions{MaxRounds: maxRounds}}, want: "65 pre-copy rounds asked"},
		{name: "no step at all", step: []int{1, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.accepted(testOffer(ModeAuto))
			if err := h.ctl.Send(c.step); err != nil {
				t.Fatal(err)
			}
			if c.want != "" {
				h.failure(c.want)
			} else {
				var v any
				if err := h.ctl.Recv(&v); err == nil || transport.IsRemote(err) {
					t.Fatalf("the source heard %v (%v), want the channel closed", err, v)
				}
			}
			h.abandoned()
		})
	}
}

// Until the source asks for the restore it can take the migration back:
// whatever else it does, the destination discards its copy, never
// restores it, journals nothing and leaves no scratch.
func TestDestinationAbandonsBeforeRestore(t *testing.T) {
	for _, c := range []struct {
		name string
		act  func(h *harness)
		want string // the failure the source hears, "": none (it hung up)
	}{
		{name: "the source closes the control channel", act: func(h *harness) { h.ctl.Close() }},
		{name: "the session is lost", act: func(h *harness) { h.src.Close() }},
		{name: "the source ends its control stream", act: func(h *harness) { _ = h.ctl.CloseWrite() },
			want: "migration abandoned by the source: transport: expected a control message"},
		{name: "the source reports a failure", act: func(h *harness) { _ = h.ctl.Fail(errors.New("dump on h1: criu failed")) },
			want: "migration abandoned by the source: dump on h1: criu failed"},
		{name: "the source asks to commit", act: func(h *harness) { _ = h.ctl.Send(Step{Do: "commit"}) },
			want: `migration abandoned by the source: source asked to "commit" before restore`},
		{name: "the source asks to abort", act: func(h *harness) { _ = h.ctl.Send(Step{Do: "abort"}) },
			want: `source asked to "abort" before restore`},
		{name: "a mode step outside mode auto", act: func(h *harness) { _ = h.ctl.Send(Step{Do: "mode", Mode: ModeCold}) },
			want: `source asked to "mode" before restore`},
		{name: "an empty step", act: func(h *harness) { _ = h.ctl.Send(Step{}) },
			want: `source asked to "" before restore`},
		{name: "a message that is no step", act: func(h *harness) { _ = h.ctl.Send(42) },
			want: "migration abandoned by the source: transport: bad control message"},
		{name: "the restore, in capitals", act: func(h *harness) { _ = h.ctl.Send(Step{Do: "RESTORE"}) },
			want: `source asked to "RESTORE" before restore`},
		{name: "the address handed over, then an abort", act: func(h *harness) {
			_ = h.ctl.Send(Step{Do: "address"})
			_ = h.ctl.Recv(&AddressTaken{})
			_ = h.ctl.Send(Step{Do: "abort"})
		}, want: `source asked to "abort" before restore`},
		{name: "the address handed over, then the session is lost", act: func(h *harness) {
			_ = h.ctl.Send(Step{Do: "address"})
			h.src.Close()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.accepted(testOffer(ModeCold))
			c.act(h)
			if c.want != "" {
				h.failure(c.want)
			}
			h.abandoned()
		})
	}
}

// The same in every technique (and after part of the state arrived): a
// step other than the restore discards the copy.
func TestDestinationAbandonsBeforeRestoreInEveryTechnique(t *testing.T) {
	for _, c := range []struct {
		name string
		o    Offer
		auto *Step // mode auto's step
	}{
		{name: "cold", o: testOffer(ModeCold)},
		{name: "precopy", o: testOffer(ModePrecopy)},
		{name: "precopy/rebuild", o: rebuildOffer()},
		{name: "precopy/native", o: func() Offer { o := testOffer(ModePrecopy); o.Precopy.Engine = PrecopyNative; return o }()},
		{name: "postcopy", o: testOffer(ModePostcopy)},
		{name: "hybrid", o: testOffer(ModeHybrid)},
		{name: "auto, then cold", o: testOffer(ModeAuto), auto: &Step{Do: "mode", Mode: ModeCold}},
		{name: "auto, then hybrid", o: testOffer(ModeAuto), auto: &Step{Do: "mode", Mode: ModeHybrid, Precopy: &PrecopyOptions{MaxRounds: 3}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, func(h *harness) { h.rt.caps = allCaps })
			h.accepted(c.o)
			if c.auto != nil {
				if err := h.ctl.Send(*c.auto); err != nil {
					t.Fatal(err)
				}
				var a Accept
				if err := h.ctl.Recv(&a); err != nil {
					t.Fatalf("mode step: %v", err)
				}
			}
			// Part of the state: the live rootfs sync.
			if err := h.syncRootfs(ChanRootfsLive, sourceRoot(t)); err != nil {
				t.Fatal(err)
			}
			if err := h.ctl.Send(Step{Do: "commit"}); err != nil {
				t.Fatal(err)
			}
			h.failure(`source asked to "commit" before restore`)
			h.abandoned()
		})
	}
}

// A stopping agent (its context cancelled) abandons a migration whose
// source has not asked for the restore: the source hears why and the
// session closes, so every transfer stops at both ends.
func TestDestinationStoppingBeforeRestore(t *testing.T) {
	for _, c := range []struct {
		name   string
		offer  Offer
		before func(h *harness)
	}{
		{name: "right after the offer", offer: testOffer(ModeCold)},
		{name: "during the transfer", offer: rebuildOffer(), before: func(h *harness) {
			if err := h.syncRootfs(ChanRootfsLive, sourceRoot(h.t)); err != nil {
				h.t.Fatal(err)
			}
			if err := h.sendRounds(); err != nil {
				h.t.Fatal(err)
			}
		}},
		{name: "with every piece of state in", offer: rebuildOffer(), before: func(h *harness) { h.sendState(sourceRoot(h.t)) }},
		{name: "mode auto, before its mode step", offer: testOffer(ModeAuto)},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.accepted(c.offer)
			if c.before != nil {
				c.before(h)
			}
			h.cancel()
			// The stop is the cause, but a receiver waiting for a channel
			// fails with the cancelled context too: the source may hear
			// either first (the destination's code as of this test).
			h.failure("h2 is stopping: the migration was abandoned before the restore", "receiving state on h2: context canceled")
			h.sessionClosed()
			h.abandoned()
		})
	}
}

// The whole protocol without CRIU (pre-copy's rebuild switchover with the
// fake runtime): the state arrives, the destination journals before it
// restores, keeps the copy stopped until the commit, journals the commit
// before it starts the copy, and acknowledges.
func TestDestinationCommits(t *testing.T) {
	h := newHarness(t)
	h.accepted(rebuildOffer())
	h.sendState(sourceRoot(t))
	r, err := h.restored()
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if r.Pid != fakePid {
		t.Errorf("restored pid %d, want %d", r.Pid, fakePid)
	}
	tg := h.rt.target(t)
	if b, err := os.ReadFile(filepath.Join(tg.RootfsDir(), "etc", "hostname")); err != nil || string(b) != "web\n" {
		t.Errorf("the root filesystem did not arrive: %q %v", b, err)
	}
	tg.mu.Lock()
	ro := tg.restores[0]
	tg.mu.Unlock()
	work := h.d.Host.WorkDir(testID)
	if ro.ImagesDir != filepath.Join(work, "images") || ro.WorkDir != work || ro.Lazy || ro.TCPEstablished {
		t.Errorf("restore options %+v", ro)
	}
	if tg.opts.WorkDir != work || tg.opts.NetNS != "" {
		t.Errorf("prepare options %+v", tg.opts)
	}
	// Restored, not yet committed: journaled, stopped.
	if e := h.journaled(testID); e.State != journal.Restoring || e.Role != journal.Destination || e.Peer != "h1" || e.Container != "web" || e.Runtime != "fake" {
		t.Errorf("journal after the restore: %+v", e)
	}
	h.want(counts{prepared: 1, restored: 1})
	h.commit()
	h.returned()
	h.want(counts{prepared: 1, restored: 1, started: 1})
	if e := h.journaled(testID); e.State != journal.Started {
		t.Errorf("journal after the commit: %s, want %s", e.State, journal.Started)
	}
	h.scratchGone(testID)
}

// A source that hands the address over (a container without an address
// of its own here: nothing to take) is told nothing was taken, and goes on
// to the restore and the commit as before; asking twice changes nothing.
func TestDestinationHearsTheHandOver(t *testing.T) {
	h := newHarness(t)
	h.accepted(rebuildOffer())
	for i := 0; i < 2; i++ {
		if err := h.ctl.Send(Step{Do: "address"}); err != nil {
			t.Fatal(err)
		}
		var taken AddressTaken
		if err := h.ctl.Recv(&taken); err != nil || taken.Taken {
			t.Fatalf("answer %+v, %v: there was no address to take", taken, err)
		}
	}
	h.sendState(sourceRoot(t))
	if _, err := h.restored(); err != nil {
		t.Fatalf("restore: %v", err)
	}
	c := h.commit()
	if c.HeldPackets != 0 || c.HoldError != "" {
		t.Errorf("committed %+v: nothing was to be held", c)
	}
	h.returned()
	h.want(counts{prepared: 1, restored: 1, started: 1})
}

// After the restore only the commit lets the copy run: anything else
// drops it, and the journal says so.
func TestDestinationDropsUncommittedCopies(t *testing.T) {
	for _, c := range []struct {
		name string
		act  func(h *harness)
		want string
	}{
		{name: "the source asks to abort", act: func(h *harness) { _ = h.ctl.Send(Step{Do: "abort"}) },
			want: `migration not committed, restored copy dropped: source sent "abort" instead of commit`},
		{name: "the source asks to restore again", act: func(h *harness) { _ = h.ctl.Send(Step{Do: "restore"}) },
			want: `source sent "restore" instead of commit`},
		{name: "the source reports a failure", act: func(h *harness) { _ = h.ctl.Fail(errors.New("the source is stopping")) },
			want: "restored copy dropped: the source is stopping"},
		{name: "the source closes the control channel", act: func(h *harness) { h.ctl.Close() }},
		{name: "the session is lost", act: func(h *harness) { h.src.Close() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.accepted(rebuildOffer())
			h.sendState(sourceRoot(t))
			if _, err := h.restored(); err != nil {
				t.Fatalf("restore: %v", err)
			}
			c.act(h)
			if c.want != "" {
				h.failure(c.want)
			}
			h.returned()
			h.want(counts{prepared: 1, restored: 1, discarded: 1})
			if e := h.journaled(testID); e.State != journal.Dropped {
				t.Errorf("journal: %q, want %s", e.State, journal.Dropped)
			}
			h.scratchGone(testID)
		})
	}
}

// A failed restore is reported only after the copy is gone (the source
// resumes on hearing it), and journaled dropped.
func TestDestinationRestoreFails(t *testing.T) {
	h := newHarness(t, func(h *harness) { h.rt.restoreErr = errors.New("runc restore: criu failed") })
	h.accepted(rebuildOffer())
	h.sendState(sourceRoot(t))
	_, err := h.restored()
	if !transport.IsRemote(err) || !strings.Contains(err.Error(), "runc restore: criu failed") {
		t.Fatalf("restore answered %v", err)
	}
	// The failure travels after the discard: the count is final already.
	h.want(counts{prepared: 1, restored: 1, discarded: 1})
	h.returned()
	if e := h.journaled(testID); e.State != journal.Dropped {
		t.Errorf("journal: %q, want %s", e.State, journal.Dropped)
	}
	h.scratchGone(testID)
}

// Nothing is restored that the journal could not record first: a
// restarted agent would not know to drop it.
func TestDestinationNeverRestoresUnjournaled(t *testing.T) {
	h := newHarness(t)
	o := rebuildOffer()
	h.accepted(o)
	// The journal's directory becomes a file: it cannot record anything.
	jdir := filepath.Join(h.d.Host.StateDir, "journal")
	if err := os.RemoveAll(jdir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jdir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.sendState(sourceRoot(t))
	if _, err := h.restored(); !transport.IsRemote(err) || !strings.Contains(err.Error(), "journal") {
		t.Fatalf("restore answered %v", err)
	}
	h.returned()
	h.want(counts{prepared: 1, discarded: 1})
	h.allDropped()
	h.scratchGone(o.ID)
}

// From the restore request on, the migration runs to its end even when
// the agent is asked to stop: a restored copy still commits.
func TestDestinationStoppingAfterRestore(t *testing.T) {
	h := newHarness(t)
	h.accepted(rebuildOffer())
	h.sendState(sourceRoot(t))
	if _, err := h.restored(); err != nil {
		t.Fatalf("restore: %v", err)
	}
	h.cancel()
	if err := h.ctl.Send(Step{Do: "commit"}); err != nil {
		t.Fatal(err)
	}
	var c Committed
	if err := h.ctl.Recv(&c); err != nil {
		t.Fatalf("commit after the agent was asked to stop: %v", err)
	}
	h.returned()
	h.want(counts{prepared: 1, restored: 1, started: 1})
	if e := h.journaled(testID); e.State != journal.Started {
		t.Errorf("journal: %s, want %s", e.State, journal.Started)
	}
	select {
	case <-h.src.Done():
		t.Error("the stopping destination closed the session of a committed migration")
	default:
	}
}

// A source may ask for the restore before the last of its state arrived
// (its channels run independently of the control channel): the
// destination waits for the state, then restores.
func TestDestinationRestoreWaitsForTheState(t *testing.T) {
	h := newHarness(t)
	h.accepted(rebuildOffer())
	root := sourceRoot(t)
	if err := h.syncRootfs(ChanRootfsLive, root); err != nil {
		t.Fatal(err)
	}
	if err := h.ctl.Send(Step{Do: "restore"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the step is in before the rest
	if err := h.sendRounds(); err != nil {
		t.Fatal(err)
	}
	h.want(counts{prepared: 1})
	if err := h.syncRootfs(ChanRootfsFinal, root); err != nil {
		t.Fatal(err)
	}
	if err := h.sendImages(); err != nil {
		t.Fatal(err)
	}
	if err := h.serveLazy(); err != nil {
		t.Fatal(err)
	}
	var r Restored
	if err := h.ctl.Recv(&r); err != nil || r.Pid != fakePid {
		t.Fatalf("restore: %+v %v", r, err)
	}
	h.commit()
	h.returned()
	h.want(counts{prepared: 1, restored: 1, started: 1})
}

// A source asks for the restore as soon as it sent its frozen state, not
// once the destination acknowledged it (pendingAcks): a piece of that
// state the destination then fails to take (here its frozen root
// filesystem, refused) means no restore, the source told why (it
// resumes on hearing it), the copy dropped.
func TestDestinationRestoreAskedBeforeStateItRefuses(t *testing.T) {
	h := newHarness(t, func(h *harness) { h.d.AllowFaults = true })
	o := rebuildOffer()
	o.Faults = []string{fault.RootfsFinal}
	h.accepted(o)
	root := sourceRoot(t)
	if err := h.syncRootfs(ChanRootfsLive, root); err != nil {
		t.Fatal(err)
	}
	if err := h.ctl.Send(Step{Do: "restore"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the step is in before the rest
	if err := h.sendRounds(); err != nil {
		t.Fatal(err)
	}
	if err := h.sendImages(); err != nil {
		t.Fatal(err)
	}
	if err := h.serveLazy(); err != nil {
		t.Fatal(err)
	}
	if err := h.syncRootfs(ChanRootfsFinal, root); !transport.IsRemote(err) {
		t.Fatalf("frozen rootfs sync: %v, want the destination's refusal", err)
	}
	h.failure("frozen rootfs sync refused")
	h.returned()
	h.want(counts{prepared: 1, discarded: 1})
	h.allDropped()
	h.scratchGone(o.ID)
}

// The images' channel is open from the migration's start: one that ends
// without the source's end of stream (the source gone, or its tar cut
// off between two files, which tar reads as whole) is a failure, not
// images to restore.
func TestDestinationImagesCutOff(t *testing.T) {
	h := newHarness(t)
	h.accepted(rebuildOffer())
	root := sourceRoot(t)
	if err := h.syncRootfs(ChanRootfsLive, root); err != nil {
		t.Fatal(err)
	}
	if err := h.sendRounds(); err != nil {
		t.Fatal(err)
	}
	if err := h.syncRootfs(ChanRootfsFinal, root); err != nil {
		t.Fatal(err)
	}
	ch, err := h.src.Open(ChanImages)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	h.failure("the images stopped coming before their end")
	h.sessionClosed()
	h.abandoned()
}

// A source lost after it asked for the restore, before all its state
// arrived: nothing can be restored, the copy is discarded, and nothing is
// journaled (the journal records a copy only as it is restored).
func TestDestinationLostAfterRestoreRequest(t *testing.T) {
	for _, o := range []Offer{testOffer(ModeCold), testOffer(ModePostcopy), testOffer(ModeHybrid), rebuildOffer()} {
		t.Run(techniqueKey(o.Mode, o.Precopy), func(t *testing.T) {
			h := newHarness(t, func(h *harness) { h.rt.caps = allCaps })
			h.accepted(o)
			if err := h.ctl.Send(Step{Do: "restore"}); err != nil {
				t.Fatal(err)
			}
			// The images, but never the pages (nor, for a lazy restore,
			// the lazy channel: no CRIU runs here).
			if err := h.sendImages(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			h.src.Close()
			h.abandoned()
		})
	}
}

// A source that goes silent before asking for the restore (it may answer
// keepalives forever, holding one of this host's incoming slots) is given
// up after the stall timeout: told why, its session closed, the target
// discarded.
func TestDestinationGivesUpASilentSource(t *testing.T) {
	h := newHarness(t, func(h *harness) { h.d.StallTimeout = 400 * time.Millisecond })
	h.accepted(testOffer(ModeCold))
	h.failure("the source sent nothing for")
	h.sessionClosed()
	h.abandoned()
}

// TestNoParentWhereTheRestoreCopiesImages: a runtime whose restore reads a
// copy of the images (Docker) gets whole images, never a parent directory
// that the copy would leave behind; the others get the parent.
func TestNoParentWhereTheRestoreCopiesImages(t *testing.T) {
	for _, copies := range []bool{false, true} {
		in := &incoming{rt: &fakeRuntime{caps: runtime.Caps{Freeze: true, LazyDump: true, CopiesImages: copies}}, work: t.TempDir(), store: pages.NewStore()}
		in.startParent()
		if got := in.parent != nil; got == copies {
			t.Errorf("CopiesImages %v: parent image made: %v", copies, got)
		}
	}
}

// Where the runtime can (runtime.EarlyTarget), the destination begins its
// restore once the root filesystem is final, once, and lets it go only
// when the source asks for the restore, after the journal says a copy may
// be here.
func TestDestinationBeginsTheRestoreEarly(t *testing.T) {
	h := newHarness(t, func(h *harness) { h.rt.early = true })
	h.accepted(rebuildOffer())
	tg := h.rt.target(t)
	early := func() (begun, went, cancelled, restores int) {
		tg.mu.Lock()
		defer tg.mu.Unlock()
		return tg.begun, tg.went, tg.cancelled, len(tg.restores)
	}
	if err := h.syncRootfs(ChanRootfsLive, sourceRoot(t)); err != nil {
		t.Fatal(err)
	}
	if err := h.sendRounds(); err != nil {
		t.Fatal(err)
	}
	if begun, _, _, _ := early(); begun != 0 {
		t.Fatal("the restore was begun before the root filesystem was final")
	}
	if err := h.syncRootfs(ChanRootfsFinal, sourceRoot(t)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if begun, _, _, _ := early(); begun > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restore was not begun once the root filesystem was final")
		}
	}
	if err := h.sendImages(); err != nil {
		t.Fatal(err)
	}
	if err := h.serveLazy(); err != nil {
		t.Fatal(err)
	}
	if begun, went, _, restores := early(); begun != 1 || went != 0 || restores != 0 {
		t.Fatalf("before the restore step: begun %d, went %d, restored %d", begun, went, restores)
	}
	if _, err := h.restored(); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if _, went, cancelled, restores := early(); went != 1 || cancelled != 0 || restores != 1 {
		t.Fatalf("the early restore went %d times, was cancelled %d, restored %d: want it to go once", went, cancelled, restores)
	}
	if e := h.journaled(testID); e.State != journal.Restoring {
		t.Errorf("journal after the restore: %s", e.State)
	}
	h.commit()
	h.returned()
	h.want(counts{prepared: 1, restored: 1, started: 1})
}

// A migration given up before the restore cancels the restore begun
// early, which never went, before its copy is discarded.
func TestDestinationCancelsAnEarlyRestore(t *testing.T) {
	h := newHarness(t, func(h *harness) { h.rt.early = true })
	h.accepted(rebuildOffer())
	for _, kind := range []string{ChanRootfsLive, ChanRootfsFinal} {
		if err := h.syncRootfs(kind, sourceRoot(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.ctl.Send(Step{Do: "abort"}); err != nil {
		t.Fatal(err)
	}
	h.failure(`source asked to "abort" before restore`)
	h.abandoned()
	tg := h.rt.target(t)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if tg.begun != 1 || tg.cancelled != 1 || tg.went != 0 {
		t.Errorf("early restore begun %d, cancelled %d, went %d: want begun, cancelled, never gone", tg.begun, tg.cancelled, tg.went)
	}
}

// elsewhereTarget has its runtime's CRIU work in dirs of its own.
type elsewhereTarget struct {
	*fakeTarget
	dirs []string
}

func (t elsewhereTarget) CRIUDirs() []string { return t.dirs }

// The restore watches the work directory for what a killed CRIU left,
// and the runtime's own directories where its CRIU works there.
func TestRestoreWatchesWhereCRIUWorks(t *testing.T) {
	in := &incoming{work: "/scratch/m1", target: &fakeTarget{}}
	if got := in.criuDirs(); !slices.Equal(got, []string{"/scratch/m1"}) {
		t.Errorf("plain target: %v", got)
	}
	in.target = elsewhereTarget{fakeTarget: &fakeTarget{}, dirs: []string{"/shim/work", "/ckpt/ferry"}}
	if got := in.criuDirs(); !slices.Equal(got, []string{"/scratch/m1", "/shim/work", "/ckpt/ferry"}) {
		t.Errorf("a target whose CRIU works elsewhere: %v", got)
	}
}

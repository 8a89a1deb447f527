package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// technique is one way to move a container, its source and destination
// halves side by side (QEMU's per-device handlers, go-criu's phaul
// Local/Remote): what it needs of the runtime, the channels its source
// opens, and what each end runs.
type technique struct {
	// needs is what the container's runtime must be able to do; a
	// technique it cannot do is refused before anything is frozen.
	needs runtime.Caps
	// lazy: the destination restores with a lazy-pages daemon serving the
	// memory; rebuild: it completes a memory-less dump's images first.
	lazy, rebuild bool
	// push: once the copy runs at the destination, the source sends all
	// of the frozen memory at link speed (push.go).
	push bool
	// rounds: live rounds carry the memory before the freeze, so in a
	// line (line.go) the next may start at this one's freeze.
	rounds bool
	// channels lists the channels the source opens, besides the rootfs
	// and images channels every technique uses.
	channels func(o PrecopyOptions) []string
	// source runs the source half, from the live rootfs sync to the commit.
	source func(m *migration, ctx context.Context) error

	// The destination half, which incoming.run drives (destination.go):
	// receive starts the receivers for the channels; arrive, when set,
	// starts what the restore needs beside them once the images are in
	// (imagesIn), and returns the arrival that readies the restore and
	// brings the memory after the commit. Without arrive, the restore
	// writes all of the memory from the images received (plainArrival).
	receive func(in *incoming, ctx context.Context, rx receivers)
	arrive  func(in *incoming, ctx context.Context, rx receivers, imagesIn <-chan error) arrival
}

// arrival is a technique's restore at the destination, for one migration.
type arrival interface {
	// abandon stops what arrive started: the migration was given up
	// before the restore, its receivers have ended.
	abandon()
	// ready readies the restore once the source asked for it and every
	// receiver ended. Its pull, when set, is ended by the driver
	// (pulling.end) even when ready fails.
	ready(ctx context.Context, rx receivers) (readied, error)
}

// readied is what an arrival readied for the restore, and what the
// source is told of it (Restored).
type readied struct {
	// pull brings the copy's memory once it runs (nil: the restore
	// writes all of it).
	pull pulling
	// filled: completing a memory-less dump's images (rebuild);
	// lastWrites: the pages the restore writes itself (lastwrites.go).
	filled, lastWrites filled
	fromOwnImages      bool // the pull reads images here (localpull.go)
}

// pulling is the memory of a restored copy that arrives once it runs: a
// lazy-pages daemon served by the source (lazyPull, postcopy.go) or by
// this host's images (localPull, localpull.go).
type pulling interface {
	// restored runs once the restore handed the daemon the copy.
	restored()
	// journal is the state and pull the journal records at the commit.
	journal() (string, *journal.Pull)
	// unheard ends a pull whose source may not have heard the commit
	// (err: sending it failed); finish waits for the pull's end after
	// the commit and tells the source. Each says whether the copy stays.
	unheard(ctx context.Context, sess *transport.Session, err error) (bool, error)
	finish(ctx context.Context, sess *transport.Session, ctl *transport.Channel) (bool, error)
	// end stops what is left of the pull as the migration's run ends.
	end(committed bool)
}

// plainArrival is a restore that writes all of the memory from the images.
type plainArrival struct{}

func (plainArrival) abandon() {}

func (plainArrival) ready(context.Context, receivers) (readied, error) { return readied{}, nil }

// receivers is what a destination half needs to take its channels: the
// session and router they arrive on, and the group whose end means every
// piece of state has arrived.
type receivers struct {
	sess   *transport.Session
	router *transport.Router
	g      *receiving
}

// Technique keys: a mode, and for pre-copy its engine or switchover.
const (
	keyPrecopyRebuild = ModePrecopy + "/" + SwitchoverRebuild
	keyPrecopyNative  = ModePrecopy + "/" + PrecopyNative
	keyColdRebuild    = ModeCold + "/" + SwitchoverRebuild
)

func fixed(chans ...string) func(PrecopyOptions) []string {
	return func(PrecopyOptions) []string { return chans }
}

// techniques is every technique ferry runs, by key. Each one's halves are
// in its own file: its source, receive and arrive beside each other.
var techniques = map[string]technique{
	ModeCold: {
		channels: fixed(ChanPages),
		source:   (*migration).cold,
		receive:  receiveCold,
	},
	// Content pre-copy, dump switchover: rounds, then a full dump whose
	// pages the destination holds travel as references.
	ModePrecopy: {
		rounds:   true,
		channels: fixed(ChanRounds, ChanPages),
		source:   (*migration).precopy,
		receive:  receivePrecopy,
	},
	// Cold through pre-copy's rebuild switchover with no live round: all
	// of the frozen memory goes as one round beside CRIU's memory-less
	// dump (coldRebuild). For runtimes whose restore copies its images.
	keyColdRebuild: {
		needs:    runtime.Caps{Freeze: true, LazyDump: true},
		rebuild:  true,
		channels: fixed(ChanRounds, ChanLazy),
		source:   (*migration).coldRebuild,
		receive:  receiveRebuild,
		arrive:   arriveRebuild,
	},
	keyPrecopyRebuild: {
		rounds:   true,
		needs:    runtime.Caps{Freeze: true, LazyDump: true},
		rebuild:  true,
		channels: fixed(ChanRounds, ChanLazy),
		source:   (*migration).precopy,
		receive:  receiveRebuild,
		arrive:   arriveRebuild,
	},
	keyPrecopyNative: {
		rounds:   true,
		needs:    runtime.Caps{PreDump: true},
		channels: nativeChannels,
		source:   (*migration).precopyNative,
		receive:  receiveNative,
	},
	ModePostcopy: {
		needs:    runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true},
		lazy:     true,
		push:     true,
		channels: fixed(ChanRounds, ChanLazy, ChanPush),
		source:   (*migration).postcopy,
		receive:  receivePostcopy,
		arrive:   arriveLazy,
	},
	ModeHybrid: {
		rounds:   true,
		needs:    runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true},
		lazy:     true,
		channels: fixed(ChanRounds, ChanLazy),
		source:   (*migration).hybrid,
		receive:  receiveHybrid,
		arrive:   arriveLazy,
	},
}

// techniqueKey names the technique a mode and its pre-copy options select.
func techniqueKey(mode string, o PrecopyOptions) string {
	if mode == ModeCold && o.Switchover == SwitchoverRebuild {
		return keyColdRebuild
	}
	if mode != ModePrecopy {
		return mode
	}
	switch {
	case o.Engine == PrecopyNative:
		return keyPrecopyNative
	case o.Switchover == SwitchoverRebuild:
		return keyPrecopyRebuild
	}
	return ModePrecopy
}

// techniqueFor finds the technique a mode and its pre-copy options select
// and checks that rt can run it here, returning its key.
func techniqueFor(mode string, o PrecopyOptions, rt runtime.Runtime) (string, technique, error) {
	key := techniqueKey(mode, o)
	t, ok := techniques[key]
	if !ok {
		return key, technique{}, fmt.Errorf("technique %q has no engine", key)
	}
	return key, t, t.allows(key, rt.Kind(), rt.Caps())
}

// allows says why a runtime cannot do a technique, or nil.
func (t technique) allows(key string, kind string, c runtime.Caps) error {
	var missing []string
	if t.needs.Freeze && !c.Freeze {
		missing = append(missing, "freezing a container without dumping it")
	}
	if t.needs.LazyDump && !c.LazyDump {
		missing = append(missing, "a lazy dump (CRIU's lazy pages; see ferry check)")
	}
	if t.needs.LazyRestore && !c.LazyRestore {
		missing = append(missing, "a lazy restore (memory filled on demand)")
	}
	if t.needs.PreDump && !c.PreDump {
		missing = append(missing, "CRIU's pre-dump (soft-dirty page tracking)")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s cannot move %s containers on this host: it needs %s", key, kind, strings.Join(missing, " and "))
}

// Modes lists the techniques a runtime with caps can run here, for ferry
// check and error messages.
func Modes(c runtime.Caps) []string {
	var out []string
	for _, k := range []string{ModeCold, keyColdRebuild, ModePrecopy, keyPrecopyRebuild, keyPrecopyNative, ModePostcopy, ModeHybrid} {
		if techniques[k].allows(k, "", c) == nil {
			out = append(out, k)
		}
	}
	return out
}

// channelsFor lists every channel a technique's source opens.
func channelsFor(key string, o PrecopyOptions) []string {
	chans := []string{ChanRootfsLive, ChanRootfsFinal, ChanImages}
	if t, ok := techniques[key]; ok {
		chans = append(chans, t.channels(o)...)
	}
	return chans
}

// storeSlack is how far past what its source announced a container's
// memory may grow during the rounds: the store holds no more than twice
// the announced resident memory and this, so a peer cannot make it hold
// whatever it sends.
const storeSlack = 512 << 20

// newStore is the store the rounds (or the push) fill, bounded by what the
// source announced.
func (in *incoming) newStore() *pages.Store {
	s := pages.NewStore()
	limit := 2*max(in.offer.MemoryBytes, 0) + storeSlack
	if m := in.d.Admission.MaxMemoryBytes; m > 0 {
		limit = min(limit, max(m, storeSlack))
	}
	s.Limit(int(limit / pages.PageSize))
	return s
}

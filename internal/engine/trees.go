package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/fault"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/rootfs"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Volume sync channels: ChanVolumeLive+NAME and ChanVolumeFinal+NAME carry
// a volume as ChanRootfsLive and ChanRootfsFinal carry the root
// filesystem.
const (
	ChanVolumeLive  = "volume.live/"
	ChanVolumeFinal = "volume.final/"
)

// treeChannel names the channel that syncs a tree (the root filesystem
// when volume is empty) live or frozen.
func treeChannel(volume string, live bool) string {
	switch {
	case volume == "" && live:
		return ChanRootfsLive
	case volume == "":
		return ChanRootfsFinal
	case live:
		return ChanVolumeLive + volume
	}
	return ChanVolumeFinal + volume
}

// volumeChannels are the channels the volumes of an offer sync on.
func volumeChannels(vols []runtime.Volume) []string {
	var out []string
	for _, v := range vols {
		out = append(out, treeChannel(v.Name, true), treeChannel(v.Name, false))
	}
	return out
}

// tree is a directory whose contents move with the container: its root
// filesystem or one of its volumes, synced live and then frozen, each on
// its own pair of channels.
type tree struct {
	volume string // "" for the root filesystem
	dir    string // this host's copy
	inside string // where the container sees it
	// base is what the destination's copy holds after the live sync, so
	// the frozen sync scans only this side; watch, from before the live
	// sync's scan, what changed since (nil: walk it all); blocks, the
	// large files it holds, for patches.
	base   rootfs.Manifest
	blocks rootfs.Blocks
	watch  *rootfs.Watcher
	// The report's lines for it.
	liveBytes, frozenBytes int64
	liveEntries            int
	frozenScan             string
}

// makeTrees lists what syncs: the root filesystem first, then each
// volume, whose size the offer announces.
func (m *migration) makeTrees() error {
	m.trees = []*tree{{dir: m.ctr.Rootfs, inside: "/"}}
	for i, v := range m.ctr.Volumes {
		man, err := rootfs.Scan(v.Dir)
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		m.ctr.Volumes[i].Bytes = man.Bytes()
		m.trees = append(m.trees, &tree{volume: v.Name, dir: v.Dir, inside: v.Path})
	}
	return nil
}

// watchTrees watches every tree from before the live sync's scan, so
// that the frozen sync looks only at what changed after it.
func (m *migration) watchTrees() {
	for _, t := range m.trees {
		w, err := rootfs.Watch(t.dir)
		if err != nil {
			t.frozenScan = "full walk: " + err.Error()
		}
		t.watch = w
	}
}

func (m *migration) closeWatches() {
	for _, t := range m.trees {
		if t.watch != nil {
			_ = t.watch.Close()
			t.watch = nil
		}
	}
}

// syncTrees syncs every tree, live or frozen, side by side.
func (m *migration) syncTrees(live bool) error {
	return m.sendTrees(live, func(_ string, acked func() error) error { return acked() })
}

// sendFrozenTrees sends every tree's last changes, side by side, and
// leaves the destination's word on each to the switchover's pendingAcks.
func (m *migration) sendFrozenTrees() error {
	return m.sendTrees(false, func(name string, acked func() error) error {
		m.acks.expect("rootfs sync (frozen)", func() error {
			if err := acked(); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
		return nil
	})
}

// sendTrees sends every tree, side by side, each then handed to then
// with the wait for the destination's word on it.
func (m *migration) sendTrees(live bool, then func(name string, acked func() error) error) error {
	var g errgroup.Group
	for _, t := range m.trees {
		g.Go(func() error {
			acked, err := m.sendTree(t, live)
			if err == nil {
				err = then(treeName(t.volume), acked)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", treeName(t.volume), err)
			}
			return nil
		})
	}
	err := g.Wait()
	m.reportTrees()
	return err
}

// reportTrees puts what the trees' syncs sent into the report.
func (m *migration) reportTrees() {
	m.report.Volumes = m.report.Volumes[:0]
	for _, t := range m.trees {
		if t.volume == "" {
			m.report.RootfsBytes, m.report.RootfsEntries = t.liveBytes, t.liveEntries
			m.report.FrozenRootfsBytes, m.report.FrozenRootfsScan = t.frozenBytes, t.frozenScan
			continue
		}
		m.report.Volumes = append(m.report.Volumes, VolumeSync{Name: t.volume, Path: t.inside,
			Bytes: t.liveBytes, Entries: t.liveEntries, FrozenBytes: t.frozenBytes, FrozenScan: t.frozenScan})
	}
}

// sendTree sends what the destination's copy of one tree lacks, and
// returns acked, which waits for the destination's word that it applied
// it, then closes the channel.
func (m *migration) sendTree(t *tree, live bool) (acked func() error, err error) {
	ch, err := m.sess.Open(treeChannel(t.volume, live))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ch.Close()
		}
	}()
	// This side's scan runs while the destination describes its copy.
	type scanned struct {
		m   rootfs.Manifest
		ch  *rootfs.Changes // the frozen pass, from a watch
		err error
	}
	sc := make(chan scanned, 1)
	go func() {
		if !live && t.watch != nil && t.base != nil {
			ch, err := m.rescanTree(t)
			sc <- scanned{ch: ch, err: err}
			return
		}
		man, err := rootfs.Scan(t.dir)
		sc <- scanned{m: man, err: err}
	}()
	// The frozen pass after a whole live sync knows what the destination
	// holds: what that sync left, t.base (nothing else writes there). It
	// sends at once, and reads the destination's description (AsLive)
	// after: a round trip less while frozen. The delta from t.base is
	// right whatever that says.
	ahead := !live && t.base != nil
	var have RootfsHave
	var rerr error
	if ahead {
		have.AsLive = true
	} else {
		rerr = ch.Recv(&have)
	}
	s := <-sc
	if rerr != nil {
		return nil, rerr
	}
	if s.err != nil {
		return nil, s.err
	}
	base := have.Manifest
	if have.AsLive {
		if t.base == nil {
			return nil, errors.New("the destination's copy is as after the live sync, which this side never finished")
		}
		base = t.base
	}
	want := s.m
	var delta rootfs.Delta
	switch {
	case s.ch != nil && have.AsLive:
		delta = s.ch.Delta() // what changed since the live sync, from the changes alone
	case s.ch != nil:
		want = s.ch.Manifest()
		fallthrough
	default:
		delta = rootfs.Diff(base, want)
	}
	// The frozen pass patches the large files the live sync sent: the
	// destination holds them exactly as sent.
	var known rootfs.Blocks
	if !live && have.AsLive {
		known = t.blocks
	}
	sent, err := rootfs.SendDelta(ch, t.dir, delta, known)
	if err != nil {
		return nil, err
	}
	if live {
		t.liveBytes, t.liveEntries = sent.Bytes, len(delta.Changed)-len(sent.Skipped)
		// The destination now holds what was scanned, but for entries
		// that vanished before they were sent: it keeps its own of those.
		for _, p := range sent.Skipped {
			if e, ok := base[p]; ok {
				want[p] = e
			} else {
				delete(want, p)
			}
		}
	} else {
		t.frozenBytes = sent.Bytes
	}
	if err := ch.CloseWrite(); err != nil {
		return nil, err
	}
	attrs, err := rootfs.ReadRootAttrs(t.dir)
	if err != nil {
		return nil, err
	}
	if err := ch.Send(attrs); err != nil {
		return nil, err
	}
	return func() error {
		defer ch.Close()
		if ahead {
			if err := ch.Recv(&RootfsHave{}); err != nil {
				return err
			}
		}
		var done RootfsDone
		if err := ch.Recv(&done); err != nil {
			return err
		}
		if live {
			t.base, t.blocks = want, sent.Blocks
		}
		return nil
	}, nil
}

// rescanTree is the frozen tree: the live sync's scan brought up to date
// by what the watch saw change since, and the files the container writes
// through shared mappings (which raise no event); or, where the watch
// cannot vouch for it, a walk of the whole tree.
func (m *migration) rescanTree(t *tree) (*rootfs.Changes, error) {
	w := t.watch
	t.watch = nil // one rescan per watch
	defer w.Close()
	var extra []string
	for _, p := range procs.WrittenFiles(m.ctr.PID) {
		if rel, ok := within(p, t.inside); ok {
			extra = append(extra, rel)
		}
	}
	ch, st, err := w.Rescan(t.base, extra)
	if err != nil {
		return nil, err
	}
	if st.Full != "" {
		t.frozenScan = "full walk: " + st.Full
	} else {
		t.frozenScan = fmt.Sprintf("%d changed paths", st.Paths)
	}
	return ch, nil
}

// within is p, a path as the container names it, relative to dir, a
// directory as the container names it, if p lies below dir.
func within(p, dir string) (string, bool) {
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		return strings.TrimPrefix(p, "/"), true
	}
	rel, ok := strings.CutPrefix(p, dir+"/")
	if !ok || rel == "" {
		return "", false
	}
	return rel, true
}

// destTree is a tree as the destination receives it.
type destTree struct {
	volume string
	dir    string
	// liveSynced: the live sync was applied whole.
	liveSynced atomic.Bool
}

// volumeName is what a volume may be called: Docker's and Podman's rule,
// nothing a path or a channel name could be made to mean more by.
var volumeName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}$`)

// checkVolumes refuses an offer's volumes that no runtime would make:
// bad names, a name twice, a path in the container that is not absolute
// and clean.
func checkVolumes(vols []runtime.Volume) error {
	seen := map[string]bool{}
	for _, v := range vols {
		if !volumeName.MatchString(v.Name) || seen[v.Name] {
			return fmt.Errorf("bad volume name %q", v.Name)
		}
		seen[v.Name] = true
		if !path.IsAbs(v.Path) || path.Clean(v.Path) != v.Path || v.Path == "/" {
			return fmt.Errorf("volume %s: bad path in the container %q", v.Name, v.Path)
		}
		if v.Bytes < 0 {
			return fmt.Errorf("volume %s: negative size", v.Name)
		}
	}
	return nil
}

// makeTrees finds where each tree goes here: the target's root
// filesystem, and each volume the runtime made for the offer.
func (in *incoming) makeTrees() error {
	in.trees = []*destTree{{dir: in.target.RootfsDir()}}
	if len(in.offer.Volumes) == 0 {
		return nil
	}
	vt, ok := in.target.(runtime.VolumeTarget)
	if !ok {
		return fmt.Errorf("%s on %s cannot receive volumes", in.offer.Runtime, in.d.Host.Name)
	}
	for _, v := range in.offer.Volumes {
		dir, err := vt.VolumeDir(v.Name)
		if err != nil {
			return err
		}
		in.trees = append(in.trees, &destTree{volume: v.Name, dir: dir})
	}
	return nil
}

// receiveTrees receives every tree's live sync, and then its frozen one;
// restorable runs once the last frozen one is applied.
func (in *incoming) receiveTrees(ctx context.Context, sess *transport.Session, router *transport.Router, recv *receiving, restorable func()) {
	for _, t := range in.trees {
		recv.Go(func() error { return in.receiveTree(ctx, sess, router, t, true) })
	}
	recv.Go(func() error {
		var g errgroup.Group
		for _, t := range in.trees {
			g.Go(func() error { return in.receiveTree(ctx, sess, router, t, false) })
		}
		if err := g.Wait(); err != nil {
			return err
		}
		restorable()
		return nil
	})
}

func (in *incoming) receiveTree(ctx context.Context, sess *transport.Session, router *transport.Router, t *destTree, live bool) error {
	ch, err := router.Wait(ctx, sess, treeChannel(t.volume, live))
	if err != nil {
		return err
	}
	defer ch.Close()
	if !live && t.volume == "" && in.faults.Knob(fault.RootfsFinal) {
		// Tests: the frozen rootfs sync fails while the dump runs beside it.
		err := errors.New("injected fault: frozen rootfs sync refused")
		_ = ch.Fail(err)
		return err
	}
	if live && t.volume != "" {
		in.faults.Agent(fault.Destination, fault.VolumeSync)
	}
	// After a complete live sync the source knows what this copy holds:
	// the frozen sync then spends no time scanning or describing it here.
	have := RootfsHave{AsLive: !live && t.liveSynced.Load()}
	if !have.AsLive {
		m, err := rootfs.Scan(t.dir)
		if err != nil {
			return err
		}
		have.Manifest = m
	}
	if err := ch.Send(have); err != nil {
		return err
	}
	st, err := rootfs.ApplyDelta(ch, t.dir)
	if err != nil {
		return fmt.Errorf("apply %s delta: %w", treeName(t.volume), err)
	}
	// The tar reader stops at its end marker: read up to the stream's end.
	if _, err := io.Copy(io.Discard, ch); err != nil {
		return err
	}
	var attrs rootfs.RootAttrs
	if err := ch.Recv(&attrs); err != nil {
		return err
	}
	if err := attrs.Apply(t.dir); err != nil {
		return err
	}
	if err := ch.Send(RootfsDone{Files: st.Files, Bytes: st.Bytes}); err != nil {
		return err
	}
	if live {
		t.liveSynced.Store(true)
	}
	return nil
}

func treeName(volume string) string {
	if volume == "" {
		return "rootfs"
	}
	return "volume " + volume
}

// spaceSlack is what a filesystem must keep free beyond the volumes
// moved into it: a volume grows while it syncs, and a full filesystem
// fails more than this migration.
const spaceSlack = 64 << 20

// checkSpace refuses, before anything is frozen, volumes that the
// filesystems they go to here cannot hold.
func (in *incoming) checkSpace() error {
	type fs struct {
		free, need int64
		names      []string
	}
	byFS := map[unix.Fsid]*fs{}
	for i, v := range in.offer.Volumes {
		var st unix.Statfs_t
		if err := unix.Statfs(in.trees[i+1].dir, &st); err != nil {
			return err
		}
		f := byFS[st.Fsid]
		if f == nil {
			f = &fs{free: int64(st.Bavail) * st.Bsize}
			byFS[st.Fsid] = f
		}
		f.need += v.Bytes
		f.names = append(f.names, v.Name)
	}
	for _, f := range byFS {
		if f.need+spaceSlack > f.free {
			return fmt.Errorf("%s: volumes %s need %s and %s to spare, the filesystem they go to has %s free",
				in.d.Host.Name, strings.Join(f.names, ", "), units.Bytes(f.need), units.Bytes(spaceSlack), units.Bytes(f.free))
		}
	}
	return nil
}

// JournaledContainer is the container a journal entry names, with the
// volumes that moved with it, for whoever removes it after a restart.
func JournaledContainer(e journal.Entry) *runtime.Container {
	c := &runtime.Container{Runtime: e.Runtime, Name: e.Container, ID: e.Container}
	for _, v := range e.Volumes {
		c.Volumes = append(c.Volumes, runtime.Volume{Name: v})
	}
	return c
}

func volumeNames(vols []runtime.Volume) []string {
	var out []string
	for _, v := range vols {
		out = append(out, v.Name)
	}
	return out
}

// removedVolumes name the volumes the source removes with its copy after
// the commit (none with Request.KeepVolumes).
func (m *migration) removedVolumes() []string {
	if m.req.KeepVolumes || m.ctr == nil {
		return nil
	}
	return volumeNames(m.ctr.Volumes)
}

package bench

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/images"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// Bench hostile: a peer holding a valid certificate (lab host h1's) sends
// h2's agent what an attacker would (configurations that reach into the
// host, paths that climb out of the scratch space, sizes and counts that
// lie, offers that never finish, floods), and each case checks that the
// destination refused it before anything ran, that nothing was left
// behind, and that the agent still serves: at the end an honest peer
// migrates a container to it.

// HostileOptions configures bench hostile.
type HostileOptions struct {
	FerryBin string
	Log      io.Writer
	// Only runs the cases whose names contain it ("": every case).
	Only string
}

// HostileCase is one hostile input and what became of it.
type HostileCase struct {
	Name string `json:"name"`
	// Accepted: the destination went ahead with it (a defect).
	Accepted bool `json:"accepted"`
	// Refusal is the destination's answer, as the peer heard it.
	Refusal string `json:"refusal,omitempty"`
	// Leaks are what the case left on the destination once it ended.
	Leaks []string `json:"leaks,omitempty"`
	// AgentDown: the destination's agent died or stopped answering.
	AgentDown bool   `json:"agent_down,omitempty"`
	Note      string `json:"note,omitempty"`
}

// HostileSummary counts the cases and what went wrong in them.
type HostileSummary struct {
	Cases     int `json:"cases"`
	Accepted  int `json:"accepted"`
	Leaks     int `json:"leaks"`
	AgentDown int `json:"agent_down"`
}

// HostileResult is every case, the summary, and the honest migration
// that followed them.
type HostileResult struct {
	Cases   []HostileCase  `json:"cases"`
	Summary HostileSummary `json:"summary"`
	// Honest is the report's error of the honest migration after the
	// cases ("" when it moved).
	Honest   string `json:"honest_error,omitempty"`
	HonestOK bool   `json:"honest_ok"`
}

// hostile is one case: run sends the input over a session of its own and
// says whether the destination went ahead with it, and its answer. A case
// that is an offer the destination must refuse has the change it makes
// to a valid offer in edit, and refusedAt(edit) as its run.
type hostile struct {
	name string
	run  func(ctx context.Context, p *peer) (accepted bool, answer string, err error)
	edit func(*engine.Offer)
}

// peer is the hostile end: h1's certificate, dialing h2 from h1's network.
type peer struct {
	l    *lab.Lab
	cfg  *transport.Config
	base engine.Offer // a valid offer, each case changes it
	n    int
}

func (p *peer) dial(ctx context.Context) (*transport.Session, error) {
	c := *p.cfg
	return p.l.Hosts[0].DialFrom(ctx, p.l.Hosts[1].AgentAddr, &c)
}

// offer returns a valid offer of a fresh container name and ID.
func (p *peer) offer() engine.Offer {
	p.n++
	o := p.base
	o.ID = engine.NewID()
	o.Container = fmt.Sprintf("hostile-%d", p.n)
	return o
}

// send opens a session and the control channel, sends o and reads the
// destination's first answer; the session stays open for the caller
// (nil on error).
func (p *peer) send(ctx context.Context, o any) (sess *transport.Session, ctl *transport.Channel, accepted bool, answer string, err error) {
	sess, err = p.dial(ctx)
	if err != nil {
		return nil, nil, false, "", err
	}
	ctl, err = sess.Open(engine.ChanIncoming)
	if err != nil {
		sess.Close()
		return nil, nil, false, "", err
	}
	if err := ctl.Send(o); err != nil {
		sess.Close()
		return nil, nil, false, "", err
	}
	var a engine.Accept
	rerr := ctl.Recv(&a)
	if rerr != nil {
		if transport.IsRemote(rerr) {
			return sess, ctl, false, rerr.Error(), nil
		}
		return sess, ctl, false, "", rerr
	}
	return sess, ctl, true, "accepted by " + a.Host, nil
}

// refusedAt sends o and closes the session: the destination must refuse it.
func refusedAt(edit func(*engine.Offer)) func(context.Context, *peer) (bool, string, error) {
	return func(ctx context.Context, p *peer) (bool, string, error) {
		o := p.offer()
		edit(&o)
		sess, _, accepted, answer, err := p.send(ctx, o)
		if sess != nil {
			sess.Close()
		}
		return accepted, answer, err
	}
}

// withSpec changes the base offer's config.json.
func withSpec(edit func(*specs.Spec)) func(*engine.Offer) {
	return func(o *engine.Offer) {
		var s specs.Spec
		if err := json.Unmarshal(o.Spec, &s); err != nil {
			panic(err) // the base spec is the lab's own
		}
		edit(&s)
		b, err := json.Marshal(&s)
		if err != nil {
			panic(err)
		}
		o.Spec = b
	}
}

// hostileCases are the inputs, by kind.
func hostileCases() []hostile {
	var cs []hostile
	add := func(name string, edit func(*engine.Offer)) { cs = append(cs, hostile{name, refusedAt(edit), edit}) }
	spec := func(name string, edit func(*specs.Spec)) { add("config: "+name, withSpec(edit)) }
	i64 := func(v int64) *int64 { return &v }

	// Identity and names: files and journal entries are named after them.
	add("id: path traversal", func(o *engine.Offer) { o.ID = "../../../../tmp/ferry-hostile" })
	add("id: too long", func(o *engine.Offer) { o.ID = strings.Repeat("ab", 40) })
	add("name: path traversal", func(o *engine.Offer) { o.Container = "../../../tmp/ferry-hostile" })
	add("name: a path", func(o *engine.Offer) { o.Container = "a/b" })
	add("name: dot-dot", func(o *engine.Offer) { o.Container = ".." })
	add("name: empty", func(o *engine.Offer) { o.Container = "" })
	add("name: taken at the destination", func(o *engine.Offer) { o.Container = hostileTaken })
	add("mode: unknown", func(o *engine.Offer) { o.Mode = "teleport" })
	add("runtime: unknown", func(o *engine.Offer) { o.Runtime = "nope" })
	add("faults: asked of an agent", func(o *engine.Offer) { o.Faults = []string{"bogus@nowhere"} })
	// Sizes and counts that lie.
	add("memory: negative", func(o *engine.Offer) { o.MemoryBytes = -1 })
	add("memory: beyond the host", func(o *engine.Offer) { o.MemoryBytes = 1 << 50 })
	add("rounds: a million", func(o *engine.Offer) { o.Precopy.MaxRounds = 1_000_000 })
	add("rounds: negative", func(o *engine.Offer) { o.Precopy.MaxRounds = -1 })
	// Addresses announced on the destination's segment.
	add("address: outside the segment", func(o *engine.Offer) {
		o.Network = &cnet.Spec{Ifaces: []cnet.Iface{{Name: "eth0", Addrs: []string{"8.8.8.8/32"}}}}
	})
	add("address: a whole range", func(o *engine.Offer) {
		o.Network = &cnet.Spec{Ifaces: []cnet.Iface{{Name: "eth0", Addrs: []string{lab.SegmentSubnet + "0/8"}}}}
	})
	add("address: not an address", func(o *engine.Offer) {
		o.Network = &cnet.Spec{Ifaces: []cnet.Iface{{Name: "eth0", Addrs: []string{"; rm -rf /"}}}}
	})
	// Volumes: their names become directories and channels.
	add("volume: path traversal", func(o *engine.Offer) {
		o.Volumes = []runtime.Volume{{Name: "../../../tmp/ferry-hostile", Path: "/data", Bytes: 1}}
	})
	add("volume: over the root", func(o *engine.Offer) { o.Volumes = []runtime.Volume{{Name: "data", Path: "/", Bytes: 1}} })
	add("volume: beyond the disk", func(o *engine.Offer) { o.Volumes = []runtime.Volume{{Name: "data", Path: "/data", Bytes: 1 << 60}} })
	add("config: not JSON", func(o *engine.Offer) { o.Spec = json.RawMessage(`"not a spec"`) })
	// Configurations that reach into the host.
	hook := []specs.Hook{{Path: "/bin/sh", Args: []string{"sh", "-c", "touch /tmp/ferry-hostile-hook"}}}
	spec("prestart hook", func(s *specs.Spec) { s.Hooks = &specs.Hooks{Prestart: hook} }) //nolint:staticcheck // runc still runs it
	spec("createRuntime hook", func(s *specs.Spec) { s.Hooks = &specs.Hooks{CreateRuntime: hook} })
	spec("poststop hook", func(s *specs.Spec) { s.Hooks = &specs.Hooks{Poststop: hook} })
	spec("host PID namespace", func(s *specs.Spec) { s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.PIDNamespace) })
	spec("host mount namespace", func(s *specs.Spec) { s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.MountNamespace) })
	spec("joins init's PID namespace", func(s *specs.Spec) {
		s.Linux.Namespaces = append(dropNS(s.Linux.Namespaces, specs.PIDNamespace), specs.LinuxNamespace{Type: specs.PIDNamespace, Path: "/proc/1/ns/pid"})
	})
	spec("host network", func(s *specs.Spec) { s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.NetworkNamespace) })
	spec("bind mount of /", func(s *specs.Spec) {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind"}})
	})
	spec("bind mount of /etc/shadow by option", func(s *specs.Spec) {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/x", Type: "none", Source: "/etc/shadow", Options: []string{"bind"}})
	})
	spec("host disk mount", func(s *specs.Spec) {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/mnt", Type: "ext4", Source: "/dev/sda1"})
	})
	spec("overlay of host directories", func(s *specs.Spec) {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/mnt", Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/etc", "upperdir=/tmp/u", "workdir=/tmp/w"}})
	})
	spec("CAP_SYS_ADMIN", func(s *specs.Spec) {
		s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
		s.Process.Capabilities.Effective = append(s.Process.Capabilities.Effective, "CAP_SYS_ADMIN")
	})
	spec("ambient CAP_SYS_MODULE", func(s *specs.Spec) { s.Process.Capabilities.Ambient = []string{"CAP_SYS_MODULE"} })
	spec("host device node", func(s *specs.Spec) {
		s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/sda", Type: "b", Major: 8}}
	})
	spec("device rule: every device", func(s *specs.Spec) {
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Access: "rwm"})
	})
	spec("device rule: the host's disk b 8:0", func(s *specs.Spec) {
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "b", Major: i64(8), Minor: i64(0), Access: "rwm"})
	})
	spec("device rule: /dev/mem c 1:1", func(s *specs.Spec) {
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: i64(1), Minor: i64(1), Access: "r"})
	})
	spec("/proc/kcore unmasked", func(s *specs.Spec) { s.Linux.MaskedPaths = nil })
	spec("/proc/sys writable", func(s *specs.Spec) { s.Linux.ReadonlyPaths = nil })
	spec("sysfs writable", func(s *specs.Spec) {
		for i, m := range s.Mounts {
			if m.Type == "sysfs" {
				s.Mounts[i].Options = []string{"nosuid", "noexec", "nodev"}
			}
		}
	})
	spec("a second proc", func(s *specs.Spec) {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/hostproc", Type: "proc", Source: "proc"})
	})
	spec("writable cgroupfs", func(s *specs.Spec) {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup"})
	})
	spec("host sysctl kernel.core_pattern", func(s *specs.Spec) {
		s.Linux.Sysctl = map[string]string{"kernel.core_pattern": "|/tmp/ferry-hostile"}
	})
	spec("AppArmor unconfined", func(s *specs.Spec) { s.Process.ApparmorProfile = "unconfined" })
	spec("no linux section", func(s *specs.Spec) { s.Linux = nil })

	// Past the offer: what climbs out of the scratch space.
	cs = append(cs,
		hostile{name: "rootfs: entries climbing out of the root", run: rootfsEscape},
		hostile{name: "images: entries climbing out of the images", run: imagesEscape},
		hostile{name: "images: a task holding CAP_SYS_ADMIN", run: imagesPrivileged},
		hostile{name: "images: a mount of the host's disk", run: imagesMountHostDisk},
		hostile{name: "a second offer for a name in flight", run: secondOffer},
		hostile{name: "a flood of offers", run: floodOffers},
		hostile{name: "an offer that never finishes", run: neverFinishes},
		hostile{name: "control: an unknown step", run: unknownStep},
	)
	return cs
}

// hostileTaken is the container h2 runs all along: offers for its name
// must not touch it.
const hostileTaken = "hostile-taken"

// escapes are the paths the escape cases try to write, on the host.
var escapes = []string{"/tmp/ferry-hostile-escape", "/tmp/ferry-hostile-hook", "/etc/ferry-hostile"}

func dropNS(nss []specs.LinuxNamespace, t specs.LinuxNamespaceType) []specs.LinuxNamespace {
	return slices.DeleteFunc(slices.Clone(nss), func(ns specs.LinuxNamespace) bool { return ns.Type == t })
}

// escapeTar writes a tar whose entries climb out of where it is unpacked:
// relative climbs, an absolute path, and a symlink followed by a write
// through it.
func escapeTar(w io.Writer) error {
	tw := tar.NewWriter(w)
	body := []byte("hostile\n")
	for _, h := range []*tar.Header{
		{Name: "../../../../../../tmp/ferry-hostile-escape", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg},
		{Name: "/etc/ferry-hostile", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg},
		{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "/tmp", Mode: 0o777},
		{Name: "up/ferry-hostile-escape", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(body); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// acceptedOffer opens a session with a valid offer the destination
// accepts; the caller goes on with the protocol.
func acceptedOffer(ctx context.Context, p *peer) (*transport.Session, *transport.Channel, error) {
	sess, ctl, accepted, answer, err := p.send(ctx, p.offer())
	if err != nil {
		return nil, nil, err
	}
	if !accepted {
		sess.Close()
		return nil, nil, fmt.Errorf("a valid offer was refused: %s", answer)
	}
	return sess, ctl, nil
}

// openAfterOffer opens a channel of kind after a valid offer the
// destination accepted; the caller closes the session.
func openAfterOffer(ctx context.Context, p *peer, kind string) (*transport.Session, *transport.Channel, *transport.Channel, error) {
	sess, ctl, err := acceptedOffer(ctx, p)
	if err != nil {
		return nil, nil, nil, err
	}
	ch, err := sess.Open(kind)
	if err != nil {
		sess.Close()
		return nil, nil, nil, err
	}
	return sess, ctl, ch, nil
}

// rootfsEscape sends a live rootfs delta whose entries climb out.
func rootfsEscape(ctx context.Context, p *peer) (bool, string, error) {
	sess, ctl, ch, err := openAfterOffer(ctx, p, engine.ChanRootfsLive)
	if err != nil {
		return false, "", err
	}
	defer sess.Close()
	var have engine.RootfsHave
	if err := ch.Recv(&have); err != nil {
		return false, "", err
	}
	_ = escapeTar(ch)
	_ = ch.CloseWrite()
	_ = ch.Send(struct{}{})
	var done engine.RootfsDone
	if err := ch.Recv(&done); err != nil {
		// The destination says why on the control channel.
		return false, refusalOr(ctl, err), nil
	}
	return true, fmt.Sprintf("applied %d files", done.Files), nil
}

// errNoAnswer: the destination said nothing on the control channel in time.
var errNoAnswer = errors.New("no answer")

// nextAnswer waits up to within for the destination's next message on
// the control channel: nil for an ordinary message, its failure (a
// refusal names its reason), or errNoAnswer.
func nextAnswer(ctl *transport.Channel, within time.Duration) error {
	got := make(chan error, 1)
	go func() {
		var any json.RawMessage
		got <- ctl.Recv(&any)
	}()
	select {
	case err := <-got:
		return err
	case <-time.After(within):
		return errNoAnswer
	}
}

// refusalOr is the reason the destination gave on ctl for failing a
// migration, or else fallback (the error its data channel ended with).
func refusalOr(ctl *transport.Channel, fallback error) string {
	if err := nextAnswer(ctl, 5*time.Second); err != nil && transport.IsRemote(err) {
		return err.Error()
	}
	return fallback.Error()
}

// imagesEscape sends CRIU images whose entries climb out.
func imagesEscape(ctx context.Context, p *peer) (bool, string, error) {
	sess, ctl, ch, err := openAfterOffer(ctx, p, engine.ChanImages)
	if err != nil {
		return false, "", err
	}
	defer sess.Close()
	_ = escapeTar(ch)
	_ = ch.CloseWrite()
	// The destination fails the migration on its control channel.
	switch err := nextAnswer(ctl, 10*time.Second); {
	case err == nil:
		return true, "answered as if nothing happened", nil
	case errors.Is(err, errNoAnswer):
		return true, "no refusal within 10 s", nil
	default:
		return false, err.Error(), nil
	}
}

// imagesPrivileged sends CRIU images whose task holds CAP_SYS_ADMIN and
// CAP_SYS_MODULE under a configuration that gives neither.
func imagesPrivileged(ctx context.Context, p *peer) (bool, string, error) {
	core, err := images.EncodeTaskCaps(^uint64(0))
	if err != nil {
		return false, "", err
	}
	return sendImages(ctx, p, map[string][]byte{"core-1.img": core}, "CAP_SYS_ADMIN")
}

// imagesMountHostDisk sends CRIU images of a modest task whose mount tree
// has CRIU mount a block device of the host's (/dev/sda1, ext4) at /mnt,
// which the configuration does not mount.
func imagesMountHostDisk(ctx context.Context, p *peer) (bool, string, error) {
	core, err := images.EncodeTaskCaps(0)
	if err != nil {
		return false, "", err
	}
	mounts, err := images.EncodeMounts([]images.Mount{{ID: 1, Parent: 0, Type: "tmpfs", Point: "/", Root: "/", Source: "tmpfs"},
		{ID: 2, Parent: 1, Type: "ext4", Point: "/mnt", Root: "/", Source: "/dev/sda1"}})
	if err != nil {
		return false, "", err
	}
	return sendImages(ctx, p, map[string][]byte{"core-1.img": core, "mountpoints-1.img": mounts}, "/dev/sda1")
}

// sendImages sends files as the migration's images after an honest offer;
// the destination must refuse them saying want.
func sendImages(ctx context.Context, p *peer, files map[string][]byte, want string) (bool, string, error) {
	sess, ctl, ch, err := openAfterOffer(ctx, p, engine.ChanImages)
	if err != nil {
		return false, "", err
	}
	defer sess.Close()
	tw := tar.NewWriter(ch)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		b := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return false, "", err
		}
		if _, err := tw.Write(b); err != nil {
			return false, "", err
		}
	}
	_ = tw.Close()
	_ = ch.CloseWrite()
	answer := refusalOr(ctl, errNoAnswer)
	if strings.Contains(answer, want) {
		return false, answer, nil
	}
	return true, answer, nil
}

// secondOffer sends a second offer for a name whose first offer is still
// arriving: the second is refused, and the first, abandoned, leaves
// nothing.
func secondOffer(ctx context.Context, p *peer) (bool, string, error) {
	first := p.offer()
	sess, _, accepted, answer, err := p.send(ctx, first)
	if err != nil {
		return false, "", err
	}
	defer sess.Close()
	if !accepted {
		return false, "", fmt.Errorf("a valid offer was refused: %s", answer)
	}
	second := p.offer()
	second.Container = first.Container
	s2, _, accepted, answer, err := p.send(ctx, second)
	if s2 != nil {
		s2.Close()
	}
	return accepted, answer, err
}

// floodOffers sends many valid offers at once, each on a session of its
// own, then drops them all: whatever the destination accepted it must
// clean up, and it must go on serving.
func floodOffers(ctx context.Context, p *peer) (bool, string, error) {
	const n = 24
	var mu sync.Mutex
	var sessions []*transport.Session
	accepted, refused := 0, 0
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		o := p.offer()
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess, _, ok, _, err := p.send(ctx, o)
			mu.Lock()
			defer mu.Unlock()
			if sess != nil {
				sessions = append(sessions, sess)
			}
			if err == nil && ok {
				accepted++
			} else {
				refused++
			}
		}()
	}
	wg.Wait()
	for _, s := range sessions {
		s.Close()
	}
	// Accepting some is right (they are valid offers); what matters is
	// what they leave and that the agent serves on.
	return false, fmt.Sprintf("%d of %d accepted, %d refused or cut off, all dropped", accepted, n, refused), nil
}

// neverFinishes accepts a valid offer's answer, then keeps its session
// open and sends nothing, long enough for the destination to have had to
// hold whatever it made; then goes silent for good (closes).
func neverFinishes(ctx context.Context, p *peer) (bool, string, error) {
	sess, _, err := acceptedOffer(ctx, p)
	if err != nil {
		return false, "", err
	}
	time.Sleep(3 * time.Second)
	sess.Close()
	return false, "accepted, then the peer sent nothing and left", nil
}

// unknownStep asks for a step no migration has.
func unknownStep(ctx context.Context, p *peer) (bool, string, error) {
	sess, ctl, err := acceptedOffer(ctx, p)
	if err != nil {
		return false, "", err
	}
	defer sess.Close()
	if err := ctl.Send(engine.Step{Do: "format-disk"}); err != nil {
		return false, "", err
	}
	var any json.RawMessage
	if err := ctl.Recv(&any); err != nil {
		return false, err.Error(), nil
	}
	return true, "answered " + string(any), nil
}

// Hostile runs every case against a lab's h2 and an honest migration after.
func Hostile(ctx context.Context, o HostileOptions) (res HostileResult, err error) {
	l, down, err := upLab(ctx, lab.Options{Hosts: 2, FerryBin: o.FerryBin})
	if err != nil {
		return res, err
	}
	defer down(&err)
	src, dst := &l.Hosts[0], &l.Hosts[1]
	workload := []string{"/bin/memhog", "--memory", "16M"}
	if err := l.Run(ctx, src.Name, "honest", workload); err != nil {
		return res, err
	}
	// On another port: the honest container comes to h2's network too.
	if err := l.Run(ctx, dst.Name, hostileTaken, append(workload, "--port", "7998")); err != nil {
		return res, err
	}
	sec, err := transport.LoadSecurity(src.TLSDir(), src.Name, []string{dst.Name})
	if err != nil {
		return res, err
	}
	cfg := transport.DefaultConfig()
	cfg.Security, cfg.Hello = sec, transport.Hello{Name: src.Name, Role: "agent"}
	spec, err := os.ReadFile(filepath.Join(src.BundleDir("honest"), "config.json"))
	if err != nil {
		return res, err
	}
	p := &peer{l: l, cfg: cfg, base: engine.Offer{Mode: engine.ModeCold, SourceHost: src.Name, Runtime: "runc", Spec: spec, MemoryBytes: 16 << 20}}
	for _, path := range escapes {
		_ = os.Remove(path)
	}
	before := snapshot(l)
	res.Cases = []HostileCase{}
	for _, c := range hostileCases() {
		if o.Only != "" && !strings.Contains(c.name, o.Only) {
			continue
		}
		hc := HostileCase{Name: c.name}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		accepted, answer, rerr := c.run(cctx, p)
		cancel()
		hc.Accepted, hc.Refusal = accepted, answer
		if rerr != nil {
			hc.Note = "the peer's side failed: " + rerr.Error()
		}
		hc.Leaks = waitClean(l, before, 20*time.Second)
		for _, path := range escapes {
			if _, err := os.Lstat(path); err == nil {
				hc.Leaks = append(hc.Leaks, "written outside the destination's directories: "+path)
				hc.Accepted = true
				_ = os.Remove(path)
			}
		}
		if !dst.AgentAlive() {
			hc.AgentDown = true
		} else if _, err := client.Status(ctx, client.Socket(dst.ControlSock)); err != nil {
			hc.AgentDown = true
			hc.Note = strings.TrimSpace(hc.Note + " status: " + err.Error())
		}
		if st := containerState("runc", dst, hostileTaken); st != "running" {
			hc.Leaks = append(hc.Leaks, "h2's own "+hostileTaken+" is "+st)
		}
		o.logf("%s: accepted=%v leaks=%v agent_down=%v %s", hc.Name, hc.Accepted, hc.Leaks, hc.AgentDown, firstLine(hc.Refusal))
		res.Cases = append(res.Cases, hc)
		res.Summary.add(hc)
		if hc.AgentDown {
			if berr := bringBackAgent(ctx, l, dst); berr != nil {
				return res, berr
			}
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	rep, merr := client.Migrate(ctx, client.Socket(src.ControlSock), engine.Request{Container: "honest", To: dst.AgentAddr, Mode: engine.ModeCold}, nil)
	switch {
	case merr != nil:
		res.Honest = merr.Error()
	case !rep.OK:
		res.Honest = rep.Error
	default:
		res.HonestOK = true
	}
	o.logf("honest migration after the cases: ok=%v %s", res.HonestOK, res.Honest)
	return res, nil
}

func (s *HostileSummary) add(c HostileCase) {
	s.Cases++
	if c.Accepted {
		s.Accepted++
	}
	if len(c.Leaks) > 0 {
		s.Leaks++
	}
	if c.AgentDown {
		s.AgentDown++
	}
}

// waitClean waits until the lab holds nothing the case added (the
// destination cleans up as the peer's session ends), or within runs out.
func waitClean(l *lab.Lab, before leakSet, within time.Duration) []string {
	var left []string
	for deadline := time.Now().Add(within); ; time.Sleep(250 * time.Millisecond) {
		left = snapshot(l).since(before)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
	}
}

// bringBackAgent restarts a destination agent a case killed, so that the
// next cases (and the honest peer) meet one.
func bringBackAgent(ctx context.Context, l *lab.Lab, h *lab.Host) error {
	if h.AgentAlive() {
		return nil
	}
	if err := l.RestartAgent(ctx, h.Name); err != nil {
		return fmt.Errorf("the destination's agent died in a hostile case and could not be restarted: %w", err)
	}
	return nil
}

func (o HostileOptions) logf(format string, args ...any) { logTo(o.Log, format, args...) }

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

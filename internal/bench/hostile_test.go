package bench

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/transport/transporttest"
)

// labOffer is the hostile peer's valid offer, as Hostile makes it from a
// lab container's config.json, and labPolicy what the lab's agents
// admit (their --allow-bind and --segment-range).
func labOffer(t *testing.T) (engine.Offer, admission.Policy) {
	t.Helper()
	h := lab.Host{}
	h.Name, h.NetNS, h.CgroupParent = "h1", "/var/run/netns/ferry-h1", "ferry-h1"
	spec, err := json.Marshal(runc.NewSpec(runc.SpecOptions{Args: []string{"/bin/memhog", "--memory", "16M"}, Hostname: "honest",
		CgroupsPath: h.CgroupsPath("honest"), NetNS: h.NetNS}))
	if err != nil {
		t.Fatal(err)
	}
	policy := admission.Policy{BindSources: []string{lab.SharedStorage}, MaxMemoryBytes: 64 << 30,
		Addresses: []netip.Prefix{netip.MustParsePrefix(lab.SegmentSubnet + "0/24")}}
	return engine.Offer{Mode: engine.ModeCold, SourceHost: h.Name, Runtime: "runc", Spec: spec, MemoryBytes: 16 << 20}, policy
}

// Every hostile offer changes the valid one (an edit that changes
// nothing would have the destination rightly accept it, and the bench
// count that as a defect), and what the lab's admission policy judges it
// refuses: each configuration, each size, each address; the valid offer
// it admits.
func TestHostileOffersAreRefusedByAdmission(t *testing.T) {
	base, policy := labOffer(t)
	if err := policy.CheckSpec(base.Spec); err != nil {
		t.Fatalf("the valid offer's configuration is refused: %v", err)
	}
	if err := policy.CheckOffer(admission.Offer{MemoryBytes: base.MemoryBytes, MaxRounds: base.Precopy.MaxRounds}); err != nil {
		t.Fatalf("the valid offer's sizes are refused: %v", err)
	}
	p := &peer{base: base}
	judged := 0
	for _, c := range hostileCases() {
		if c.edit == nil {
			continue
		}
		valid := p.offer()
		o := valid
		c.edit(&o)
		if reflect.DeepEqual(o, valid) {
			t.Errorf("%s: the offer is the valid one", c.name)
			continue
		}
		var err error
		switch kind, _, _ := strings.Cut(c.name, ":"); kind {
		case "config":
			err = policy.CheckSpec(o.Spec)
		case "memory", "rounds":
			err = policy.CheckOffer(admission.Offer{MemoryBytes: o.MemoryBytes, MaxRounds: o.Precopy.MaxRounds})
		case "address":
			err = policy.CheckAddresses(o.Network.Ifaces[0].Addrs)
		default:
			continue // the engine's own checks: names, modes, volumes
		}
		judged++
		if err == nil {
			t.Errorf("%s: admitted", c.name)
		}
	}
	if judged < 30 {
		t.Errorf("admission judged %d hostile offers", judged)
	}
}

// withSpec changes the offer's configuration and nothing else of it, and
// leaves the configuration it was given as it was.
func TestWithSpec(t *testing.T) {
	base, _ := labOffer(t)
	given := bytes.Clone(base.Spec)
	o := base
	withSpec(func(s *specs.Spec) { s.Hostname = "other" })(&o)
	if !bytes.Equal(base.Spec, given) {
		t.Error("the valid offer's configuration changed")
	}
	var got, want map[string]any
	if err := json.Unmarshal(o.Spec, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(given, &want); err != nil {
		t.Fatal(err)
	}
	if got["hostname"] != "other" {
		t.Errorf("hostname %v", got["hostname"])
	}
	delete(got, "hostname")
	delete(want, "hostname")
	if !reflect.DeepEqual(got, want) {
		t.Error("withSpec changed more than the hostname")
	}
	o.Spec = base.Spec
	if !reflect.DeepEqual(o, base) {
		t.Error("withSpec changed the offer beyond its configuration")
	}
}

// The escape archive's every file lands outside the directory it is
// unpacked in, were its paths followed: climbing, absolute, or through
// its own symlink.
func TestEscapeTarClimbsOut(t *testing.T) {
	var b bytes.Buffer
	if err := escapeTar(&b); err != nil {
		t.Fatal(err)
	}
	const root = "/scratch/images"
	links := map[string]string{}
	files := 0
	tr := tar.NewReader(&b)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeSymlink {
			links[h.Name] = h.Linkname
			continue
		}
		files++
		target := filepath.Join(root, h.Name)
		if filepath.IsAbs(h.Name) {
			target = h.Name
		}
		if dir, rest, ok := strings.Cut(h.Name, "/"); ok && links[dir] != "" {
			target = filepath.Join(links[dir], rest)
		}
		if strings.HasPrefix(target, root+"/") {
			t.Errorf("%s stays in the directory it is unpacked in", h.Name)
		}
		if !slices.Contains(escapes, target) {
			t.Errorf("%s lands at %s, which the bench does not look for", h.Name, target)
		}
	}
	if files < 3 {
		t.Errorf("%d files", files)
	}
}

// dropNS drops one namespace from a copy, not from the spec it is given.
func TestDropNSLeavesItsInputAlone(t *testing.T) {
	base, _ := labOffer(t)
	var s specs.Spec
	if err := json.Unmarshal(base.Spec, &s); err != nil {
		t.Fatal(err)
	}
	n := len(s.Linux.Namespaces)
	out := dropNS(s.Linux.Namespaces, specs.PIDNamespace)
	if len(out) != n-1 || len(s.Linux.Namespaces) != n {
		t.Fatalf("%d namespaces of %d dropped, the input has %d", n-len(out), n, len(s.Linux.Namespaces))
	}
	for _, ns := range out {
		if ns.Type == specs.PIDNamespace {
			t.Error("the PID namespace is still there")
		}
	}
}

// controlPair is a control channel as the hostile peer holds it, and the
// destination's end of it.
func controlPair(t *testing.T) (peerEnd, destEnd *transport.Channel) {
	t.Helper()
	p, d := transporttest.Pipe(t, "h1", "h2")
	peerEnd, err := p.Open(engine.ChanIncoming)
	if err != nil {
		t.Fatal(err)
	}
	// A channel reaches its acceptor with its first frame.
	if err := peerEnd.Send(engine.Offer{}); err != nil {
		t.Fatal(err)
	}
	if destEnd, err = d.Accept(); err != nil {
		t.Fatal(err)
	}
	var o engine.Offer
	if err := destEnd.Recv(&o); err != nil {
		t.Fatal(err)
	}
	return peerEnd, destEnd
}

// What the destination said on the control channel: its refusal's
// reason, else what the data channel ended with; nothing said in time is
// errNoAnswer, an ordinary message nil.
func TestRefusalOr(t *testing.T) {
	ctl, dest := controlPair(t)
	if err := dest.Fail(errors.New("images refused: CAP_SYS_ADMIN")); err != nil {
		t.Fatal(err)
	}
	if got := refusalOr(ctl, io.ErrUnexpectedEOF); got != "images refused: CAP_SYS_ADMIN" {
		t.Errorf("after a refusal: %q", got)
	}

	ctl, dest = controlPair(t)
	for range 2 {
		if err := dest.Send(engine.Accept{Host: "h2"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nextAnswer(ctl, 5*time.Second); err != nil {
		t.Errorf("an ordinary answer: %v", err)
	}
	if got := refusalOr(ctl, io.ErrUnexpectedEOF); got != io.ErrUnexpectedEOF.Error() {
		t.Errorf("after an ordinary answer: %q", got)
	}

	// (A wait given up leaves its read behind: this channel is done.)
	ctl, _ = controlPair(t)
	if err := nextAnswer(ctl, 50*time.Millisecond); !errors.Is(err, errNoAnswer) {
		t.Errorf("a silent destination: %v", err)
	}
}

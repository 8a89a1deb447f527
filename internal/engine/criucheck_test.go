package engine

import (
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// ferrys is a CRIU with every ferry patch; stock one without the mark.
func ferrys() *CRIUCaps {
	return &CRIUCaps{Path: "/usr/libexec/ferry/criu", Version: "4.2.1", Patches: criu.Ferrys()}
}

func stock() *CRIUCaps { return &CRIUCaps{Path: "/usr/sbin/criu", Version: "4.2.1"} }

// A destination whose CRIU lacks a patch the technique needs, or cannot
// restore what the source's CRIU dumps, refuses the offer (or mode auto's
// step) before the runtime prepares anything, naming the host, the patch
// and the fix.
func TestDestinationRefusesWhatItsCRIUCannotDo(t *testing.T) {
	lazy := func(h *harness) { h.rt.caps = runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true} }
	for _, c := range []struct {
		name   string
		here   *CRIUCaps
		caps   func(*harness)
		offer  Offer
		source *CRIUCaps
		want   []string // "": accepted
	}{
		{name: "stock CRIU, a rebuild restored lazily", here: stock(), caps: lazy, offer: rebuildOffer(),
			want: []string{"h2's CRIU 4.2.1 at /usr/sbin/criu (ferry patches: none) lacks ferry's CRIU patch 0006", "precopy/rebuild fails", "the copy hangs", "install the ferry-criu package on h2, or run `make setup` there"}},
		{name: "stock CRIU, a rebuild restored plainly", here: stock(), offer: rebuildOffer()},
		{name: "stock CRIU, cold from a stock source", here: stock(), offer: testOffer(ModeCold), source: stock()},
		{name: "stock CRIU, cold from ferry's", here: stock(), offer: testOffer(ModeCold), source: ferrys(),
			want: []string{"h2's CRIU", "lacks ferry's CRIU patches 0005 (dump: skip empty tmpfs, untracked conntrack), 0010 (tmpfs: archive without gzip): it cannot restore what h1 dumps", "on h2"}},
		{name: "ferry's CRIU, a rebuild restored lazily, from a stock source", here: ferrys(), caps: lazy, offer: rebuildOffer(), source: stock()},
		{name: "ferry's CRIU before the mark, a rebuild", here: &CRIUCaps{Version: "4.2.1"}, caps: lazy, offer: rebuildOffer(), want: []string{"patch 0006"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			change := []func(*harness){func(h *harness) { h.d.CRIU = c.here }}
			if c.caps != nil {
				change = append(change, c.caps)
			}
			h := newHarness(t, change...)
			o := c.offer
			o.SourceCRIU = c.source
			a, err := h.offer(o)
			if c.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if a.CRIU == nil || a.CRIU.Path != c.here.Path {
					t.Errorf("the accept tells %+v of the destination's CRIU, want %+v", a.CRIU, c.here)
				}
				return
			}
			if !transport.IsRemote(err) {
				t.Fatalf("offer answered with %v, want a refusal", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
			h.returned()
			h.want(counts{})
			h.allDropped()
			h.scratchGone(o.ID)
		})
	}
}

// Mode auto: the destination learns the technique at the step, and
// refuses it there if its CRIU cannot run it.
func TestDestinationRefusesAnAutoStepItsCRIUCannotDo(t *testing.T) {
	h := newHarness(t, func(h *harness) {
		h.d.CRIU = stock()
		h.rt.caps = runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true}
	})
	h.accepted(testOffer(ModeAuto))
	o := rebuildOffer().Precopy
	if err := h.ctl.Send(Step{Do: StepMode, Mode: ModePrecopy, Precopy: &o}); err != nil {
		t.Fatal(err)
	}
	h.failure("lacks ferry's CRIU patch 0006")
	h.abandoned()
}

// The source hears the destination's refusal before it freezes anything;
// the report says where and why.
func TestSourceRefusedForTheDestinationsCRIU(t *testing.T) {
	r := newSourceRun(t, func(r *sourceRun) {
		r.s.CRIU = ferrys()
		r.d.CRIU = stock()
	})
	rep := r.migrate(ModeCold)
	if rep.OK || !strings.HasPrefix(rep.FailedAt, "destination h2 refused") ||
		!strings.Contains(rep.Error, "h2's CRIU 4.2.1 at /usr/sbin/criu (ferry patches: none) lacks ferry's CRIU patches 0005") ||
		!strings.Contains(rep.Error, "install the ferry-criu package on h2") {
		t.Fatalf("report: ok %v at %q: %s", rep.OK, rep.FailedAt, rep.Error)
	}
	r.calls()
	if r.src.state() != "running" {
		t.Errorf("the runtime holds the container %q, want running", r.src.state())
	}
}

// The source checks what the destination's Accept tells, for a
// destination that accepted all the same.
func TestCRIURefusalAtTheSource(t *testing.T) {
	if err := criuRefusal(ModeCold, criu.Source, "h1", ferrys(), "h2", stock(), false); err == nil ||
		!strings.Contains(err.Error(), "h2's CRIU") || !strings.Contains(err.Error(), "what h1 dumps") {
		t.Errorf("ferry's source, stock destination: %v", err)
	}
	if err := criuRefusal(ModeCold, criu.Source, "h1", stock(), "h2", ferrys(), false); err != nil {
		t.Errorf("stock source, ferry's destination: %v", err)
	}
	if err := criuRefusal(ModeCold, criu.Source, "h1", ferrys(), "h2", nil, false); err != nil {
		t.Errorf("a destination that did not tell: %v", err)
	}
	if err := criuRefusal(keyPrecopyRebuild, criu.Source, "h1", stock(), "", nil, true); err != nil {
		t.Errorf("0006 is the destination's to need, not the source's: %v", err)
	}
}

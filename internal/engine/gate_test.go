package engine

import (
	"context"
	"strings"
	"testing"
)

// Whichever of a cancel and the commit comes first wins, and the other
// hears it lost.
func TestCommitGate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g := NewCommitGate(cancel)
	if !g.Cancel() || ctx.Err() == nil {
		t.Fatal("a cancel before the commit did not cancel")
	}
	if g.pass() {
		t.Error("the commit went after a cancel")
	}
	ctx, cancel = context.WithCancel(context.Background())
	g = NewCommitGate(cancel)
	if !g.pass() {
		t.Fatal("the commit was held without a cancel")
	}
	if g.Cancel() || ctx.Err() != nil {
		t.Error("a cancel after the commit said it cancelled")
	}
	if !(*CommitGate)(nil).pass() {
		t.Error("a migration without a gate cannot commit")
	}
}

// A second offer for a name (or an ID) arriving is refused while the
// first holds it, and taken again once the first let go.
func TestReserveName(t *testing.T) {
	d := &Destination{}
	release, err := d.reserveName("web", "0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.reserveName("web", "ba9876543210"); err == nil || !strings.Contains(err.Error(), "already receiving a container named") {
		t.Errorf("second offer for web: %v", err)
	}
	if _, err := d.reserveName("db", "0123456789ab"); err == nil {
		t.Error("second offer with the same ID admitted")
	}
	release()
	if r, err := d.reserveName("web", "ba9876543210"); err != nil {
		t.Errorf("after the release: %v", err)
	} else {
		r()
	}
}

// An offer for a name this host's runtime holds is refused before the
// runtime prepares anything (issue 46 (a): the destination's own container
// lost its network to the offer's clean-up).
func TestDestinationRefusesATakenName(t *testing.T) {
	h := newHarness(t, func(h *harness) { h.rt.taken = "web" })
	if _, err := h.offer(testOffer(ModeCold)); err == nil || !strings.Contains(err.Error(), `already has a container named "web"`) {
		t.Fatalf("offer for a taken name: %v", err)
	}
	h.returned()
	h.want(counts{})
	if _, ok, _ := h.j.Get(testID); ok {
		t.Error("a refused offer was journaled")
	}
}

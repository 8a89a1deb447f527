package engine

import (
	"context"
	"testing"
	"time"
)

func hasTurn(t *ticket) bool { return t.ready() }

// Turns go in the order the migrations joined, width at a time, whoever
// leaves; a line that empties is gone.
func TestLineTurns(t *testing.T) {
	var ls Lines
	spec := &LineSpec{Name: "drain-1"}
	a, b, c := ls.join(spec), ls.join(spec), ls.join(spec)
	if !hasTurn(a) || hasTurn(b) || hasTurn(c) {
		t.Fatalf("turns at the start: %v %v %v, want only the first", hasTurn(a), hasTurn(b), hasTurn(c))
	}
	// One that leaves before its turn (a failed setup) takes no turn away.
	b.leave()
	if hasTurn(c) {
		t.Fatal("the third got its turn when the second left")
	}
	a.leave()
	a.leave() // twice: nothing more
	if !hasTurn(c) {
		t.Fatal("the first left, the last never got its turn")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.wait(ctx); err != nil {
		t.Fatal(err)
	}
	c.leave()
	if len(ls.m) != 0 {
		t.Errorf("an empty line stays: %v", ls.m)
	}

	// Width 2, and another line beside it that does not wait for it.
	wide := &LineSpec{Name: "drain-2", Width: 2}
	w1, w2, w3 := ls.join(wide), ls.join(wide), ls.join(wide)
	other := ls.join(&LineSpec{Name: "drain-3"})
	if !hasTurn(w1) || !hasTurn(w2) || hasTurn(w3) || !hasTurn(other) {
		t.Fatalf("width 2: %v %v %v, other line %v", hasTurn(w1), hasTurn(w2), hasTurn(w3), hasTurn(other))
	}
	w2.leave()
	if !hasTurn(w3) {
		t.Error("the second of two crossing left, the third did not get its turn")
	}
	for _, x := range []*ticket{w1, w3, other} {
		x.leave()
	}
	if len(ls.m) != 0 {
		t.Errorf("lines left: %v", ls.m)
	}
}

// A migration waiting for its turn gives up with its context; one outside
// any line never waits.
func TestLineWaitEnds(t *testing.T) {
	var ls Lines
	spec := &LineSpec{Name: "drain"}
	first, second := ls.join(spec), ls.join(spec)
	defer first.leave()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := second.wait(ctx); err == nil {
		t.Fatal("waited past its context")
	}
	second.leave()
	var noLines *Lines
	if noLines.join(spec) != nil {
		t.Error("a ticket from a host that keeps no lines")
	}
	var none *ticket
	if !none.ready() {
		t.Error("outside any line, not ready")
	}
	if ls.join(nil) != nil || ls.join(&LineSpec{}) != nil {
		t.Error("a ticket without a line")
	}
	if err := none.wait(context.Background()); err != nil {
		t.Error(err)
	}
	none.leave()
}

package engine

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/runtime"
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
func TestReserveArrival(t *testing.T) {
	d := &Destination{Admission: admission.Policy{MaxMemoryBytes: 100}}
	release, err := d.reserveArrival("web", "0123456789ab", 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.reserveArrival("web", "ba9876543210", 1); err == nil || !strings.Contains(err.Error(), "already receiving a container named") {
		t.Errorf("second offer for web: %v", err)
	}
	if _, err := d.reserveArrival("db", "0123456789ab", 1); err == nil {
		t.Error("second offer with the same ID admitted")
	}
	// Memory is counted over every arriving offer, not each alone.
	if _, err := d.reserveArrival("db", "ba9876543210", 41); !admission.IsRefused(err) {
		t.Errorf("two offers above the memory bound together: %v", err)
	}
	release()
	if r, err := d.reserveArrival("web", "ba9876543210", 100); err != nil {
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

// pidRuntime is fakeRuntime with one container running as pid.
type pidRuntime struct {
	*fakeRuntime
	pid int
}

func (p pidRuntime) Inspect(_ context.Context, name string) (*runtime.Container, error) {
	return &runtime.Container{Name: name, ID: name, Status: "running", PID: p.pid}, nil
}

// A post-copy copy that could not be frozen when its page stream broke is
// killed, never left to run on the zero pages its daemon's end leaves.
func TestKillCopy(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	if err := killCopy(context.Background(), pidRuntime{&fakeRuntime{}, cmd.Process.Pid}, "web"); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the copy was not killed: %v", err)
	}
}

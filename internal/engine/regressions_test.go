package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/transport"
)

// Regressions: bugs the fake-runtime harness found in the destination.

// The offer's ID names the migration's scratch directory
// (Host.WorkDir(ID)), which the destination creates and, when the
// migration ends, removes with everything below it (mounts first). An ID
// must therefore be refused unless it is a plain name: "../../victim"
// must not reach outside the work root.
func TestOfferIDStaysInTheWorkRoot(t *testing.T) {
	for _, id := range []string{"../../victim", "../..", "", "."} {
		t.Run(id, func(t *testing.T) {
			h := newHarness(t, func(h *harness) { h.rt.prepareErr = errors.New("refused after the scratch was made") })
			// The harness's layout: BASE/state/work/ID; the victim is BASE/victim.
			base := filepath.Dir(h.d.Host.StateDir)
			victim := filepath.Join(base, "victim")
			if err := os.MkdirAll(victim, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(victim, "precious"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			// Another migration's scratch, under way.
			other := filepath.Join(h.d.Host.WorkDir("a1b2c3d4e5f6"), "images")
			if err := os.MkdirAll(other, 0o700); err != nil {
				t.Fatal(err)
			}
			o := testOffer(ModeCold)
			o.ID = id
			_, err := h.offer(o)
			h.returned()
			if _, serr := os.Stat(filepath.Join(victim, "precious")); serr != nil {
				t.Errorf("offer ID %q: a file outside the work root is gone (%v)", id, serr)
			}
			if _, serr := os.Stat(other); serr != nil {
				t.Errorf("offer ID %q: another migration's scratch is gone (%v)", id, serr)
			}
			if _, serr := os.Stat(h.d.Host.StateDir); serr != nil {
				t.Errorf("offer ID %q: the state directory is gone (%v)", id, serr)
			}
			if !transport.IsRemote(err) || !strings.Contains(err.Error(), "ID") || h.rt.counts().prepared != 0 {
				t.Errorf("offer ID %q answered %v after %d Prepare calls, want a refusal naming the ID before Prepare", id, err, h.rt.counts().prepared)
			}
		})
	}
}

// An agent asked to stop as the restore request arrives must take one
// decision: either the source hears "abandoned before the restore" (and
// resumes its copy) and nothing is restored here, or the restore goes on
// and the stop waits for it. The two used to race (a channel checked in
// one place, closed in another); with Podman or LXC, whose restore lets
// the copy run at once, the container ran at both ends until the
// discard. The window is narrow: the test tries it many times, cancelling
// at spread moments around the request.
func TestStoppingDestinationRestoresNothingItAbandoned(t *testing.T) {
	attempts := 1000 // about 20 s; the race showed at attempts 35, 62 and 1271
	if testing.Short() {
		attempts = 300
	}
	for i := 0; i < attempts; i++ {
		h := newHarness(t)
		h.accepted(rebuildOffer())
		h.sendState(sourceRoot(t))
		go func() {
			spin := time.Duration(i%60) * time.Microsecond
			for start := time.Now(); time.Since(start) < spin; {
			}
			h.cancel()
		}()
		if err := h.ctl.Send(Step{Do: "restore"}); err != nil {
			h.src.Close() // the stop came first and closed the session
			h.returned()
			continue
		}
		var r Restored
		err := h.ctl.Recv(&r)
		h.src.Close()
		h.returned()
		c := h.rt.counts()
		if err != nil && strings.Contains(err.Error(), "abandoned before the restore") && c.restored > 0 {
			t.Fatalf("attempt %d: the source heard %q, yet the runtime saw %+v and the journal says %+v", i, err, c, h.journaled(testID))
		}
	}
}

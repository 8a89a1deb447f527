package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// How many round trips between the agents a switchover waits for, mode
// by mode: whole migrations from the fake source to the destination
// harness, once over a link without latency and once over one with
// switchoverRTT, the difference in RTTs. Issue 51 bounds each live
// mode's downtime at a far link to its near one's plus 3 round trips.

// switchoverRTT is long against what the fakes do locally (a few ms on a
// loaded machine), so that the count is of round trips.
const switchoverRTT = 200 * time.Millisecond

// reconnect starts the harness's session again over a link of oneWay
// latency each way (before the migration dials it).
func (h *harness) reconnect(oneWay time.Duration) {
	h.src.Close()
	h.oneWay = oneWay
	h.connect()
}

// switchoverTimes is what one migration's switchover took: the report's
// downtime (the freeze until the source heard the commit acknowledged)
// and from the freeze until the destination started its copy (when its
// clients hear it again).
type switchoverTimes struct {
	downtime, toStart time.Duration
}

// switchoverMode is a technique's migration in the fakes: lazyRun's
// container, with its runtimes' caps at each end, and the round trips
// its switchover waits for: until the source hears the commit
// acknowledged (downtime), until the destination starts its copy.
type switchoverMode struct {
	name              string
	mode              string
	src, dst          runtime.Caps
	downtime, toStart float64
}

// switchoverModes are the live modes issue 51 measures: pre-copy with
// its default rebuild switchover (restored plainly here: the fake
// lazy-pages daemon serves a page server, not images), post-copy and
// hybrid.
//
// Each waits for the same round trips: the restore request, sent right
// behind the frozen state, and the destination's answer (one); the commit
// (half, then the copy runs) and its acknowledgement (half).
var switchoverModes = []switchoverMode{
	{name: "precopy/rebuild", mode: ModePrecopy, src: lazyCaps, dst: runtime.Caps{Freeze: true, LazyDump: true, RestoreStopped: true}, downtime: 2, toStart: 1.5},
	{name: "postcopy", mode: ModePostcopy, src: lazyCaps, dst: lazyCaps, downtime: 2, toStart: 1.5},
	{name: "hybrid", mode: ModeHybrid, src: lazyCaps, dst: lazyCaps, downtime: 2, toStart: 1.5},
}

// roundTripSlack is what a count may exceed its round trips by: the
// fakes' own work, on a loaded machine, against switchoverRTT. One round
// trip more is a wait the switchover should not have.
const roundTripSlack = 0.45

// set gives the run's runtimes the mode's caps.
func (c switchoverMode) set(r *sourceRun) { r.src.caps, r.rt.caps = c.src, c.dst }

// measureSwitchover runs one migration of c over a link of oneWay each
// way, and returns what its switchover took.
func measureSwitchover(t *testing.T, c switchoverMode, oneWay time.Duration) switchoverTimes {
	t.Helper()
	var mu sync.Mutex
	var frozen, started time.Time
	r := newLazyRun(t, 0, c.set, func(r *sourceRun) {
		// Past a new channel's first window (yamux's, 256 KiB), as a
		// real dump's often are.
		r.src.imageBytes = 1 << 20
		r.src.beforeFreeze = func() {
			mu.Lock()
			frozen = time.Now()
			mu.Unlock()
		}
		r.rt.afterStart = func() {
			mu.Lock()
			started = time.Now()
			mu.Unlock()
		}
		r.reconnect(oneWay)
	})
	rep := r.migrateLazily(c.mode)
	if !rep.OK {
		t.Fatalf("%s over %v each way: failed at %s: %s", c.name, oneWay, rep.FailedAt, rep.Error)
	}
	r.returned()
	mu.Lock()
	defer mu.Unlock()
	if frozen.IsZero() || started.IsZero() {
		t.Fatalf("%s: frozen at %v, started at %v", c.name, frozen, started)
	}
	return switchoverTimes{downtime: time.Duration(rep.DowntimeMs * float64(time.Millisecond)), toStart: started.Sub(frozen)}
}

// roundTrips is how many round trips of rtt far took longer than near.
func roundTrips(near, far, rtt time.Duration) float64 {
	return float64(far-near) / float64(rtt)
}

// TestSwitchoverRoundTrips counts them (go test -run
// TestSwitchoverRoundTrips -v says how many).
func TestSwitchoverRoundTrips(t *testing.T) {
	if testing.Short() {
		t.Skip("each mode migrates twice, once over a 200 ms round trip")
	}
	for _, c := range switchoverModes {
		t.Run(c.name, func(t *testing.T) {
			near := measureSwitchover(t, c, 0)
			far := measureSwitchover(t, c, switchoverRTT/2)
			down := roundTrips(near.downtime, far.downtime, switchoverRTT)
			start := roundTrips(near.toStart, far.toStart, switchoverRTT)
			msg := fmt.Sprintf("%s: downtime %v -> %v (+%.2f round trips); freeze to the copy's start %v -> %v (+%.2f round trips)",
				c.name, near.downtime.Round(time.Millisecond), far.downtime.Round(time.Millisecond), down,
				near.toStart.Round(time.Millisecond), far.toStart.Round(time.Millisecond), start)
			t.Log(msg)
			if down > c.downtime+roundTripSlack || start > c.toStart+roundTripSlack {
				t.Errorf("%s waits for more round trips than %.1f (downtime) and %.1f (to the copy's start)", c.name, c.downtime, c.toStart)
			}
		})
	}
}

package follow

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func cfg() TriggerConfig {
	return TriggerConfig{Threshold: 30 * time.Millisecond, Dwell: 10 * time.Second, Hysteresis: 0.2, MinInterval: time.Minute}
}

// feed gives the trigger one sample a second from start, and returns the
// seconds at which it fired (each firing counted as a move).
func feed(tr *Trigger, start time.Time, lat func(s int) time.Duration, seconds int) []int {
	var fired []int
	for s := 0; s <= seconds; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		if v := tr.Observe(now, lat(s)); v.Fire {
			fired = append(fired, s)
			tr.Moved(now)
		}
	}
	return fired
}

func TestTriggerDwell(t *testing.T) {
	tr := NewTrigger(cfg(), time.Time{})
	// 5 s too far, then near: no move.
	if got := feed(tr, t0, func(s int) time.Duration {
		if s < 5 {
			return 40 * time.Millisecond
		}
		return 10 * time.Millisecond
	}, 20); len(got) != 0 {
		t.Errorf("fired at %v for a 5 s excursion (dwell 10 s)", got)
	}
	// Far for good: fires once the dwell has passed, at 10 s.
	tr = NewTrigger(cfg(), time.Time{})
	if got := feed(tr, t0, func(int) time.Duration { return 40 * time.Millisecond }, 15); len(got) != 1 || got[0] != 10 {
		t.Errorf("fired at %v, want once at 10 s", got)
	}
}

func TestTriggerHysteresis(t *testing.T) {
	tr := NewTrigger(cfg(), time.Time{})
	// Far, then dipping to 26 ms (inside the band, above 24 ms) every
	// other second: the dwell goes on and fires at 10 s.
	got := feed(tr, t0, func(s int) time.Duration {
		if s%2 == 1 {
			return 26 * time.Millisecond
		}
		return 35 * time.Millisecond
	}, 12)
	if len(got) != 1 || got[0] != 10 {
		t.Errorf("fired at %v, want 10 s: dips inside the band must not restart the dwell", got)
	}
	// A dip below the band restarts it.
	tr = NewTrigger(cfg(), time.Time{})
	got = feed(tr, t0, func(s int) time.Duration {
		if s == 6 {
			return 20 * time.Millisecond
		}
		return 35 * time.Millisecond
	}, 20)
	// Far again at 7 s, so the dwell ends at 17 s.
	if len(got) != 1 || got[0] != 17 {
		t.Errorf("fired at %v, want 17 s: a dip below the band at 6 s restarts the dwell", got)
	}
	// Inside the band without having been far: nothing starts.
	tr = NewTrigger(cfg(), time.Time{})
	if got := feed(tr, t0, func(int) time.Duration { return 28 * time.Millisecond }, 30); len(got) != 0 {
		t.Errorf("fired at %v with the latency below the threshold", got)
	}
}

func TestTriggerMinInterval(t *testing.T) {
	tr := NewTrigger(cfg(), t0.Add(-30*time.Second)) // moved 30 s before
	var first time.Duration
	for s := 0; s <= 60; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		v := tr.Observe(now, 50*time.Millisecond)
		if v.Fire {
			first = time.Duration(s) * time.Second
			break
		}
		if s >= 10 && !strings.Contains(v.Reason, "minimum interval") {
			t.Fatalf("at %d s: %q does not give the interval as the reason", s, v.Reason)
		}
	}
	if first != 30*time.Second {
		t.Errorf("first fired at %v, want 30 s (a minute after the last move)", first)
	}
}

func TestTriggerMedian(t *testing.T) {
	tr := NewTrigger(cfg(), time.Time{})
	var v Verdict
	for s := 0; s <= 10; s++ {
		lat := 40 * time.Millisecond
		if s == 3 {
			lat = 900 * time.Millisecond // one outlier
		}
		v = tr.Observe(t0.Add(time.Duration(s)*time.Second), lat)
	}
	if !v.Fire || v.Latency != 40*time.Millisecond {
		t.Errorf("verdict %+v: want a firing at the median, 40 ms", v)
	}
}

func TestTriggerConfigCheck(t *testing.T) {
	for _, c := range []TriggerConfig{
		{Threshold: 0},
		{Threshold: time.Millisecond, Dwell: -1},
		{Threshold: time.Millisecond, Hysteresis: 1},
		{Threshold: time.Millisecond, MinInterval: -1},
	} {
		if c.Check() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (TriggerConfig{Threshold: 0}).Check(); err == nil || !strings.Contains(err.Error(), "above zero") {
		t.Errorf("zero threshold: %v", err)
	}
	if err := DefaultTrigger().Check(); err != nil {
		t.Error(err)
	}
}

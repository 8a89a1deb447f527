package probe

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Result is what a client saw of the workload while a Prober ran.
type Result struct {
	// ClientDowntimeMs is the longest gap between two consecutive answers,
	// measured at the client.
	ClientDowntimeMs float64 `json:"client_downtime_ms"`
	Answers          int     `json:"answers"`
	// Timeouts counts polling rounds in which no address answered.
	Timeouts int  `json:"timeouts"`
	StateOK  bool `json:"state_ok"`
	// Reason says why StateOK is false.
	Reason       string `json:"reason,omitempty"`
	FirstCounter uint64 `json:"first_counter"`
	LastCounter  uint64 `json:"last_counter"`
	Boot         string `json:"boot"`
	// GapFrom and GapTo are the answers on either side of the longest
	// gap, on the wall clock: where it lies against a migration's phases.
	GapFrom time.Time `json:"gap_from,omitzero"`
	GapTo   time.Time `json:"gap_to,omitzero"`
	// LastAddr is the address that answered last: where the workload is
	// reached after a move.
	LastAddr string `json:"last_addr,omitempty"`
}

const (
	// DefaultInterval is the polling interval when Start is given none.
	DefaultInterval = 5 * time.Millisecond
	// MaxDuration bounds a Prober that is never stopped.
	MaxDuration = 30 * time.Minute
	// finalWait bounds Stop's wait for a last STAT answer when ctx has no
	// deadline.
	finalWait = 10 * time.Second
)

// Prober polls a workload's STAT in the background.
type Prober struct {
	addrs    []string
	interval time.Duration
	timeout  time.Duration

	stop chan struct{}
	done chan struct{}
	// cancel aborts in-flight queries; used only when Stop's ctx ends early.
	cancel context.CancelFunc
	ctx    context.Context

	// Owned by the polling goroutine until done is closed, then by Stop.
	t    tally
	cur  int  // index of the address that last answered
	lost bool // the last round had no answer

	once   sync.Once
	result Result
}

// Start begins polling STAT on addrs every interval (DefaultInterval if <= 0).
// It sticks to the address that last answered and, when that one fails, asks
// all of them at once, since during a migration the workload moves from one
// address to another.
func Start(addrs []string, interval time.Duration) *Prober { return StartFar(addrs, interval, 0) }

// StartFar is Start for a workload rtt away: each question waits at
// least three round trips for its answer (Start's 20 ms would give up on
// every answer from a far host).
func StartFar(addrs []string, interval, rtt time.Duration) *Prober {
	if interval <= 0 {
		interval = DefaultInterval
	}
	ctx, cancel := context.WithTimeout(context.Background(), MaxDuration)
	p := &Prober{
		addrs:    append([]string(nil), addrs...),
		interval: interval,
		timeout:  max(2*interval, 20*time.Millisecond, 3*rtt),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
	}
	go p.run()
	return p
}

func (p *Prober) run() {
	defer close(p.done)
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.ctx.Done():
			return
		case <-tick.C:
		}
		if _, ok := p.round(p.ctx, p.timeout); !ok && p.ctx.Err() == nil {
			p.t.timeouts++
		}
	}
}

// round asks the current address, then all of them, and records an answer.
// Once a round had no answer, the next ones ask all addresses at once: a
// workload moving between them answers first at the other, and asking its
// old address first put one timeout before every question to the new one,
// so a client saw up to that much more downtime than there was.
func (p *Prober) round(ctx context.Context, timeout time.Duration) (Stat, bool) {
	if len(p.addrs) == 0 {
		return Stat{}, false
	}
	askCurrent := func() (Stat, error) { return Query(ctx, p.addrs[p.cur], ReqStat, timeout) }
	askAll := func() (Stat, error) {
		s, addr, err := QueryAny(ctx, p.addrs, ReqStat, timeout)
		if err == nil {
			p.setCur(addr)
		}
		return s, err
	}
	var s Stat
	var err error
	switch {
	case len(p.addrs) == 1:
		s, err = askCurrent()
	case p.lost:
		s, err = askAll()
	default:
		if s, err = askCurrent(); err != nil {
			s, err = askAll()
		}
	}
	p.lost = err != nil
	if err != nil {
		return Stat{}, false
	}
	p.t.add(time.Now(), s)
	return s, true
}

func (p *Prober) setCur(addr string) {
	for i, a := range p.addrs {
		if a == addr {
			p.cur = i
			return
		}
	}
}

// Stop ends polling, waits for one more STAT answer (so a downtime still going
// on when Stop is called is counted), runs VERIFY and returns the result.
// Calling it again returns the same result.
func (p *Prober) Stop(ctx context.Context) Result {
	p.once.Do(func() {
		close(p.stop)
		select {
		case <-p.done:
		case <-ctx.Done():
			p.cancel()
			<-p.done
		}
		defer p.cancel()

		fctx := ctx
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			fctx, cancel = context.WithTimeout(ctx, finalWait)
			defer cancel()
		}
		for fctx.Err() == nil {
			if _, ok := p.round(fctx, p.timeout); ok {
				break
			}
			select {
			case <-fctx.Done():
			case <-time.After(p.interval):
			}
		}

		// Ask the address that answered last first; the rest follow.
		addrs := append([]string{}, p.addrs[p.cur:]...)
		addrs = append(addrs, p.addrs[:p.cur]...)
		v, _, err := verify(ctx, addrs)
		p.result = p.t.result(v, err)
		p.result.LastAddr = p.addrs[p.cur]
	})
	return p.result
}

// tally accumulates answers into a Result without keeping them all.
type tally struct {
	answers      int
	timeouts     int
	last         time.Time
	maxGap       time.Duration
	gapFrom      time.Time
	boot         string
	firstCounter uint64
	lastCounter  uint64
	reason       string // first problem seen
}

func (t *tally) add(at time.Time, s Stat) {
	if t.answers == 0 {
		t.boot, t.firstCounter = s.Boot, s.Counter
	} else {
		if gap := at.Sub(t.last); gap > t.maxGap {
			t.maxGap, t.gapFrom = gap, t.last
		}
		switch {
		case t.reason != "":
		case s.Boot != t.boot:
			t.reason = fmt.Sprintf("boot id changed from %s to %s after %d answers: the workload restarted", t.boot, s.Boot, t.answers)
		case s.Counter < t.lastCounter:
			t.reason = fmt.Sprintf("counter went backwards from %d to %d", t.lastCounter, s.Counter)
		}
	}
	if !s.Ready && t.reason == "" {
		t.reason = "workload answered not ready (memory not filled)"
	}
	t.answers++
	t.last = at
	t.lastCounter = s.Counter
}

// result combines the answers with the final VERIFY reply.
func (t *tally) result(v Stat, verr error) Result {
	r := Result{
		ClientDowntimeMs: float64(t.maxGap) / float64(time.Millisecond),
		Answers:          t.answers,
		Timeouts:         t.timeouts,
		FirstCounter:     t.firstCounter,
		LastCounter:      t.lastCounter,
		Boot:             t.boot,
		Reason:           t.reason,
	}
	if t.maxGap > 0 {
		r.GapFrom, r.GapTo = t.gapFrom, t.gapFrom.Add(t.maxGap)
	}
	if r.Reason == "" {
		switch {
		case t.answers == 0:
			r.Reason = "no STAT answer at all"
		case verr != nil:
			r.Reason = verr.Error()
		case v.Boot != t.boot:
			r.Reason = fmt.Sprintf("VERIFY answered with boot id %s, polling saw %s", v.Boot, t.boot)
		case v.Counter < t.lastCounter:
			r.Reason = fmt.Sprintf("VERIFY counter %d is below the last polled %d", v.Counter, t.lastCounter)
		case !v.Ready:
			r.Reason = "VERIFY answered not ready"
		case !v.VerifyOK:
			r.Reason = fmt.Sprintf("VERIFY failed: %d of %d pages do not match their hash, digest %s", v.BadPages, v.Pages, v.Digest)
		}
	}
	r.StateOK = r.Reason == ""
	return r
}

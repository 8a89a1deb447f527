package probe

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTallyGapsAndCounters(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	st := func(c uint64) Stat { return Stat{Boot: "b1", Counter: c, Ready: true} }
	good := Stat{Boot: "b1", Counter: 500, Ready: true, VerifyOK: true, Pages: 8}

	var tl tally
	for i, ms := range []int{0, 5, 10, 250, 255, 262} {
		tl.add(at(ms), st(uint64(10+i)))
	}
	tl.timeouts = 7
	r := tl.result(good, nil)
	if !r.StateOK || r.Reason != "" {
		t.Fatalf("result = %+v, want ok", r)
	}
	if r.ClientDowntimeMs != 240 || r.Answers != 6 || r.Timeouts != 7 || r.FirstCounter != 10 || r.LastCounter != 15 || r.Boot != "b1" {
		t.Errorf("result = %+v", r)
	}
	if !r.GapFrom.Equal(at(10)) || !r.GapTo.Equal(at(250)) {
		t.Errorf("the longest gap from %v to %v, want the answers at 10 and 250 ms", r.GapFrom.Sub(t0), r.GapTo.Sub(t0))
	}

	// An equal counter is fine (two answers within one tick).
	tl = tally{}
	tl.add(at(0), st(3))
	tl.add(at(1), st(3))
	if r := tl.result(good, nil); !r.StateOK {
		t.Errorf("equal counters: %+v", r)
	}

	cases := []struct {
		name   string
		answer []Stat
		verify Stat
		verr   error
		want   string
	}{
		{"counter reset", []Stat{st(100), st(101), st(2), st(3)}, good, nil, "counter went backwards from 101 to 2"},
		{"restart", []Stat{st(1), {Boot: "b2", Counter: 5, Ready: true}}, good, nil, "boot id changed from b1 to b2"},
		{"not ready", []Stat{st(1), {Boot: "b1", Counter: 2}}, good, nil, "not ready"},
		{"no answers", nil, good, nil, "no STAT answer"},
		{"verify unanswered", []Stat{st(1)}, Stat{}, errors.New("probe: verify: timeout"), "verify: timeout"},
		{"verify other boot", []Stat{st(1)}, Stat{Boot: "b9", Counter: 600, Ready: true, VerifyOK: true}, nil, "boot id b9"},
		{"verify counter low", []Stat{st(1000)}, good, nil, "VERIFY counter 500 is below"},
		{"verify bad", []Stat{st(1)}, Stat{Boot: "b1", Counter: 600, Ready: true, BadPages: 3, Pages: 8}, nil, "3 of 8 pages"},
	}
	for _, c := range cases {
		var tl tally
		for i, s := range c.answer {
			tl.add(at(i*5), s)
		}
		r := tl.result(c.verify, c.verr)
		if r.StateOK || !strings.Contains(r.Reason, c.want) {
			t.Errorf("%s: result = %+v, want reason containing %q", c.name, r, c.want)
		}
	}
}

func TestResultJSON(t *testing.T) {
	b, err := json.Marshal(Result{ClientDowntimeMs: 1.5, Answers: 2, StateOK: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"client_downtime_ms":1.5`, `"answers":2`, `"timeouts":0`, `"state_ok":true`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("%s lacks %s", b, k)
		}
	}
	if strings.Contains(string(b), "reason") {
		t.Errorf("%s has an empty reason", b)
	}
}

func listenLoopback(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestQueryTimeoutAndCancel(t *testing.T) {
	silent := listenLoopback(t) // reads nothing, answers nothing
	addr := silent.LocalAddr().String()
	if _, err := Query(context.Background(), addr, ReqStat, 30*time.Millisecond); err == nil {
		t.Error("query to a silent socket succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := Query(ctx, addr, ReqStat, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled query: %v, want context.Canceled", err)
	}
}

// fakeHog answers STAT and VERIFY like memhog, from a shared counter, and can
// be silenced, standing in for one address of a migrating workload.
type fakeHog struct {
	conn    *net.UDPConn
	on      atomic.Bool
	counter *atomic.Uint64
	asked   atomic.Int64 // requests received, answered or not
}

func startFake(t *testing.T, counter *atomic.Uint64, on bool) *fakeHog {
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // registered first, so it runs after the conn is closed
	f := &fakeHog{conn: listenLoopback(t), counter: counter}
	f.on.Store(on)
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64)
		for {
			n, from, err := f.conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			f.asked.Add(1)
			if !f.on.Load() {
				continue
			}
			s := Stat{Boot: "cafe", Counter: f.counter.Add(1), Ready: true, Pages: 1}
			if string(buf[:n]) == ReqVerify {
				s.VerifyOK = true
			}
			b, _ := json.Marshal(s)
			f.conn.WriteToUDP(b, from)
		}
	}()
	return f
}

func TestProberFollowsTheWorkload(t *testing.T) {
	var counter atomic.Uint64
	src := startFake(t, &counter, true)
	dst := startFake(t, &counter, false)
	p := Start([]string{src.conn.LocalAddr().String(), dst.conn.LocalAddr().String()}, 0)

	const gap = 150 * time.Millisecond
	time.Sleep(100 * time.Millisecond)
	src.on.Store(false) // the workload freezes at the source...
	time.Sleep(gap)
	dst.on.Store(true) // ...and resumes at the destination
	time.Sleep(100 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := p.Stop(ctx)
	if !r.StateOK {
		t.Fatalf("result = %+v", r)
	}
	if r.ClientDowntimeMs < float64(gap/time.Millisecond)*0.9 {
		t.Errorf("downtime %.1f ms, the workload was silent for %v", r.ClientDowntimeMs, gap)
	}
	if r.Timeouts == 0 || r.Answers < 2 || r.Boot != "cafe" || r.LastCounter <= r.FirstCounter {
		t.Errorf("result = %+v", r)
	}
	if r2 := p.Stop(ctx); r2 != r {
		t.Errorf("second Stop = %+v, first %+v", r2, r)
	}
}

// While no address answers, every round asks all of them at once, so the
// address a workload comes back at is asked as often as the one it left.
func TestProberAsksEveryAddressWhileSilent(t *testing.T) {
	var counter atomic.Uint64
	src := startFake(t, &counter, true)
	dst := startFake(t, &counter, false)
	p := Start([]string{src.conn.LocalAddr().String(), dst.conn.LocalAddr().String()}, 0)
	defer p.Stop(context.Background())

	time.Sleep(50 * time.Millisecond)
	src.on.Store(false)
	time.Sleep(50 * time.Millisecond) // the first silent round asks src alone
	s0, d0 := src.asked.Load(), dst.asked.Load()
	time.Sleep(400 * time.Millisecond)
	s1, d1 := src.asked.Load(), dst.asked.Load()
	dst.on.Store(true)
	if ds, dd := s1-s0, d1-d0; ds < 4 || dd < ds-1 {
		t.Errorf("while silent the old address was asked %d times, the new one %d: want both in every round", ds, dd)
	}
}

func TestStopWaitsForTheWorkloadToReturn(t *testing.T) {
	var counter atomic.Uint64
	f := startFake(t, &counter, true)
	p := Start([]string{f.conn.LocalAddr().String()}, 0)
	time.Sleep(50 * time.Millisecond)
	f.on.Store(false)
	time.Sleep(20 * time.Millisecond)
	time.AfterFunc(100*time.Millisecond, func() { f.on.Store(true) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := p.Stop(ctx) // called while the workload is silent
	if !r.StateOK || r.ClientDowntimeMs < 100 {
		t.Errorf("result = %+v; the outage still going on at Stop must be counted", r)
	}
}

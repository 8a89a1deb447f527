package labtool

import (
	"errors"
	"testing"
	"time"
)

func msd(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// Nearest rank: the smallest value at least p of the values are not above.
func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = msd(float64(i + 1))
	}
	for _, c := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"none", nil, 0.5, 0},
		{"one", []time.Duration{msd(7)}, 0.99, msd(7)},
		{"two, median", []time.Duration{msd(1), msd(9)}, 0.5, msd(1)},
		{"two, p99", []time.Duration{msd(1), msd(9)}, 0.99, msd(9)},
		{"1..100, p50", hundred, 0.5, msd(50)},
		{"1..100, p99", hundred, 0.99, msd(99)},
		{"1..100, max", hundred, 1, msd(100)},
	} {
		if got := percentile(c.sorted, c.p); got != c.want {
			t.Errorf("%s: p%v = %v, want %v", c.name, c.p*100, got, c.want)
		}
	}
}

// Buckets by send time, holes kept, errors apart from latencies.
func TestTimeline(t *testing.T) {
	samples := []sample{
		{sent: msd(10), latency: msd(2)},
		{sent: msd(20), latency: msd(4)},
		{sent: msd(90), latency: msd(400)}, // sent before a freeze, answered after it
		{sent: msd(95), failed: true},
		{sent: msd(350), latency: msd(1)},
	}
	got := timeline(samples, msd(400), msd(100))
	want := []Bucket{
		{TMs: 0, Ops: 3, Errors: 1, P50Ms: 4, P99Ms: 400, MaxMs: 400},
		{TMs: 100},
		{TMs: 200},
		{TMs: 300, Ops: 1, P50Ms: 1, P99Ms: 1, MaxMs: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("%d buckets, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("bucket %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// A request sent after the span still gets its bucket.
	if got := timeline([]sample{{sent: msd(250), latency: msd(1)}}, msd(100), msd(100)); len(got) != 3 || got[2].Ops != 1 {
		t.Errorf("a late request: %+v", got)
	}
}

// A stall is a wait with something outstanding and no answer: one
// request's latency on a request-response connection; the longest silence
// on a pipelined one; a wait still open at the end counts up to the end.
func TestStallClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(v float64) time.Time { return t0.Add(msd(v)) }

	var c stallClock
	c.sent(at(0))
	c.answered(at(5))
	c.sent(at(10)) // idle in between: not a wait
	c.answered(at(410))
	if got := c.end(at(1000)); got != msd(400) {
		t.Errorf("request-response: %v, want 400ms", got)
	}

	var p stallClock
	p.sent(at(0))
	p.sent(at(10))
	p.sent(at(20))
	p.answered(at(30)) // waited 30 since the first went out
	p.sent(at(40))
	p.answered(at(530)) // a freeze: 500 since the last answer
	p.answered(at(531))
	p.answered(at(532))
	if got := p.end(at(600)); got != msd(500) {
		t.Errorf("pipelined: %v, want 500ms", got)
	}

	var open stallClock
	open.sent(at(100))
	if got := open.end(at(900)); got != msd(800) {
		t.Errorf("still waiting at the end: %v, want 800ms", got)
	}
	// An answer nobody waited for changes nothing.
	var idle stallClock
	idle.answered(at(5))
	if got := idle.end(at(10)); got != 0 {
		t.Errorf("idle: %v", got)
	}
}

// The recorder's result: counts, reconnects, the worst lane's stall.
func TestRecorderFill(t *testing.T) {
	r := newRecorder(2)
	s0 := r.send(0)
	r.answer(0, s0, nil)
	s1 := r.send(1)
	time.Sleep(30 * time.Millisecond)
	r.answer(1, s1, errors.New("lost"))
	r.failed(time.Now())
	r.reconnected()
	var res LoadResult
	r.fill(&res, time.Now(), 10*time.Millisecond)
	if res.Sent != 3 || res.Ops != 1 || res.Errors != 2 || res.Reconnects != 1 || res.LongestStallMs < 30 || res.BucketMs != 10 || len(res.Timeline) < 3 {
		t.Errorf("%+v", res)
	}
}

// Values are the key's alone, and printable.
func TestValue(t *testing.T) {
	a, b := value("fill:1", 4096), value("fill:1", 4096)
	if string(a) != string(b) || string(a) == string(value("fill:2", 4096)) || len(a) != 4096 {
		t.Fatal("value is not a function of its key")
	}
	for _, c := range a {
		if c < '+' || c > 'z' {
			t.Fatalf("unprintable %q", c)
		}
	}
}

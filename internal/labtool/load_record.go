package labtool

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/units"
)

// sample is one request as the client saw it.
type sample struct {
	sent    time.Duration // from the recorder's start
	latency time.Duration // until its answer; meaningless when failed
	failed  bool
}

// stallClock times one connection's waits. A wait starts when a request
// goes out on an idle connection, or at an answer that leaves requests
// outstanding, and ends at the next answer (an error counts: the client
// learnt something). For a request-response client, one request at a
// time, a stall is that request's latency; for a pipelining one (MQTT),
// it is the longest silence while something was due.
type stallClock struct {
	outstanding int
	since       time.Time
	longest     time.Duration
}

func (c *stallClock) sent(t time.Time) {
	if c.outstanding == 0 {
		c.since = t
	}
	c.outstanding++
}

func (c *stallClock) answered(t time.Time) {
	if c.outstanding == 0 {
		return
	}
	c.longest = max(c.longest, t.Sub(c.since))
	c.outstanding--
	c.since = t
}

// end closes the books at t: a wait still open counts up to t.
func (c *stallClock) end(t time.Time) time.Duration {
	if c.outstanding > 0 && t.After(c.since) {
		c.longest = max(c.longest, t.Sub(c.since))
	}
	return c.longest
}

// recorder collects a load run's requests, per connection ("lane"), from
// the goroutines that send and answer them.
type recorder struct {
	start time.Time

	mu         sync.Mutex
	samples    []sample
	lanes      []stallClock
	reconnects int
}

func newRecorder(lanes int) *recorder {
	return &recorder{start: time.Now(), lanes: make([]stallClock, lanes)}
}

// restart sets the timeline's zero to now: the connections are up.
func (r *recorder) restart() {
	r.mu.Lock()
	r.start = time.Now()
	r.mu.Unlock()
}

// send marks a request going out on lane and returns its send time.
func (r *recorder) send(lane int) time.Time {
	t := time.Now()
	r.mu.Lock()
	r.lanes[lane].sent(t)
	r.mu.Unlock()
	return t
}

// answer records the request sent at sent on lane: answered, or failed
// when err is not nil.
func (r *recorder) answer(lane int, sent time.Time, err error) {
	t := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lanes[lane].answered(t)
	r.samples = append(r.samples, sample{sent: sent.Sub(r.start), latency: t.Sub(sent), failed: err != nil})
}

// failed records a failure that ends no wait on its lane: a request
// given up on at the end (its wait counts up to the end, see end), or a
// connection lost while the client kept its requests to resend (MQTT).
func (r *recorder) failed(sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, sample{sent: sent.Sub(r.start), failed: true})
}

// reconnected counts a connection dialed again after one was lost.
func (r *recorder) reconnected() {
	r.mu.Lock()
	r.reconnects++
	r.mu.Unlock()
}

// fill writes what was recorded up to end into res: counts, the longest
// stall and the timeline.
func (r *recorder) fill(res *LoadResult, end time.Time, bucket time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res.StartUnixMs = r.start.UnixMilli()
	res.Reconnects = r.reconnects
	var longest time.Duration
	for i := range r.lanes {
		longest = max(longest, r.lanes[i].end(end))
	}
	res.LongestStallMs = units.Millis(longest)
	res.Sent = len(r.samples)
	res.Ops, res.Errors = 0, 0
	for _, s := range r.samples {
		if s.failed {
			res.Errors++
		} else {
			res.Ops++
		}
	}
	res.BucketMs = units.Millis(bucket)
	res.Timeline = timeline(r.samples, end.Sub(r.start), bucket)
}

// timeline sorts samples into buckets of width by send time: one bucket
// for every width of span (empty ones too: a freeze shows as a hole),
// more if a sample was sent later than span.
func timeline(samples []sample, span, width time.Duration) []Bucket {
	if width <= 0 {
		return nil
	}
	n := int((span + width - 1) / width)
	for _, s := range samples {
		n = max(n, int(s.sent/width)+1)
	}
	lat := make([][]time.Duration, n)
	out := make([]Bucket, n)
	for i := range out {
		out[i].TMs = units.Millis(time.Duration(i) * width)
	}
	for _, s := range samples {
		i := int(max(s.sent, 0) / width)
		if s.failed {
			out[i].Errors++
			continue
		}
		out[i].Ops++
		lat[i] = append(lat[i], s.latency)
	}
	for i, l := range lat {
		if len(l) == 0 {
			continue
		}
		slices.Sort(l)
		out[i].P50Ms = units.Millis(percentile(l, 0.50))
		out[i].P99Ms = units.Millis(percentile(l, 0.99))
		out[i].MaxMs = units.Millis(l[len(l)-1])
	}
	return out
}

// percentile is the nearest-rank p-th percentile (0 < p <= 1) of sorted:
// the smallest value at least p of the values are not above.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps 0.99*100 (99.00000000000001) at rank 99.
	i := int(math.Ceil(p*float64(len(sorted))-1e-9)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

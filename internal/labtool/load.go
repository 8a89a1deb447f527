package labtool

// LoadResult is what `ferry-lab lab-tool load` prints, as one JSON line, once
// its stdin closes: what a real service's clients felt while it moved.
type LoadResult struct {
	// Service is the client's kind: redis, memcached, mqtt, postgres.
	Service string `json:"service"`
	// StartUnixMs is the wall-clock time of the timeline's zero, so that
	// it can be laid against the migration's phases.
	StartUnixMs int64 `json:"start_unix_ms"`
	// Run names this run's keys, rows or topics (w:<run>:<i>,
	// load/<run>), so that runs against one server do not mix.
	Run string `json:"run"`
	// Rate is the requests per second asked for, in total over Conns
	// connections.
	Rate  float64 `json:"rate"`
	Conns int     `json:"conns"`
	// Sent are requests sent and settled: Ops + Errors (for MQTT, whose
	// client keeps its messages to resend, a lost connection counts as
	// one error of its own).
	Sent int `json:"sent"`
	// Ops are requests answered; Errors, requests that failed (an error
	// reply or a lost connection); Reconnects, connections dialed again
	// after one was lost (0 when the migration kept every connection).
	Ops        int `json:"ops"`
	Errors     int `json:"errors"`
	Reconnects int `json:"reconnects"`
	// LongestStallMs is the longest any one connection went without an
	// answer while it had a request outstanding. A wait starts when a
	// request goes out on an idle connection, or at an answer that leaves
	// others outstanding, and ends at the next answer (or error): a
	// request-response client's slowest request; a pipelining one's
	// (MQTT: publish to delivery) longest silence. A wait still open when
	// the load stops counts up to then.
	LongestStallMs float64 `json:"longest_stall_ms"`
	// BucketMs is the width of each Timeline bucket.
	BucketMs float64 `json:"bucket_ms"`
	// Timeline holds one bucket per BucketMs from StartUnixMs, by when
	// each request was sent.
	Timeline []Bucket `json:"timeline"`
	// StateOK says the service's state checked out afterwards; State says
	// what was checked (keys and values, messages delivered once, rows
	// and checksum).
	StateOK bool   `json:"state_ok"`
	State   string `json:"state"`
	// Tool, when a real benchmark tool ran beside the observing client
	// (redis-benchmark, pgbench, mosquitto_pub), is its summary.
	Tool  string `json:"tool,omitempty"`
	Error string `json:"error,omitempty"`
}

// Bucket is one slice of a LoadResult's timeline.
type Bucket struct {
	// TMs is the bucket's start, from the timeline's zero.
	TMs    float64 `json:"t_ms"`
	Ops    int     `json:"ops"`
	Errors int     `json:"errors"`
	// Latencies of the requests sent in the bucket and answered.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

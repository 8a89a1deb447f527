package delayline

import (
	"strings"
	"testing"
	"time"
)

func TestQueueReleaseTimes(t *testing.T) {
	q := newQueue(100, 1<<20)
	push := func(now, delay int64) {
		t.Helper()
		if !q.push(make([]byte, 100), now, delay) {
			t.Fatalf("push at %d dropped", now)
		}
	}
	push(0, 50)   // leaves at 50
	push(10, 50)  // 60
	push(20, 10)  // the delay shrank: not before 60
	push(70, 10)  // 80: the line drained, the new delay holds
	push(71, 100) // grew: 171
	push(72, 0)   // not before 171
	want := []int64{50, 60, 60, 80, 171, 171}
	for i, w := range want {
		f, ok := q.peek()
		if !ok {
			t.Fatalf("frame %d missing", i)
		}
		if f.release != w {
			t.Errorf("frame %d leaves at %d, want %d", i, f.release, w)
		}
		q.pop()
	}
	if _, ok := q.peek(); ok {
		t.Error("queue not empty")
	}
	if q.passed.Load() != uint64(len(want)) || q.passedBytes.Load() != uint64(100*len(want)) {
		t.Errorf("passed %d frames, %d bytes", q.passed.Load(), q.passedBytes.Load())
	}
}

func TestQueueNeverReorders(t *testing.T) {
	q := newQueue(1<<20, 1<<30)
	delays := []int64{40, 1, 30, 0, 100, 5, 5, 60, 0}
	for i := range 10000 {
		b := []byte{byte(i), byte(i >> 8)}
		q.push(b, int64(i), delays[i%len(delays)])
	}
	var last int64
	for i := range 10000 {
		f := q.pop()
		if got := int(f.data[0]) | int(f.data[1])<<8; got != i&0xffff {
			t.Fatalf("frame %d came out as %d", i, got)
		}
		if f.release < last {
			t.Fatalf("frame %d leaves at %d, before the one ahead (%d)", i, f.release, last)
		}
		last = f.release
	}
}

func TestQueueBounds(t *testing.T) {
	q := newQueue(3, 250)
	for range 2 {
		if !q.push(make([]byte, 100), 0, 0) {
			t.Fatal("dropped below the bounds")
		}
	}
	if q.push(make([]byte, 100), 0, 0) {
		t.Error("went past the byte bound")
	}
	if !q.push(make([]byte, 50), 0, 0) {
		t.Error("dropped a frame that fits")
	}
	if q.push(make([]byte, 1), 0, 0) {
		t.Error("went past the frame bound")
	}
	if q.dropped.Load() != 2 || q.droppedBytes.Load() != 101 {
		t.Errorf("dropped %d frames, %d bytes; want 2, 101", q.dropped.Load(), q.droppedBytes.Load())
	}
	if n, b := q.depth(); n != 3 || b != 250 {
		t.Errorf("depth %d frames, %d bytes", n, b)
	}
	q.pop()
	if !q.push(make([]byte, 100), 0, 0) {
		t.Error("dropped after room was made")
	}
}

func TestQueueWakesSender(t *testing.T) {
	q := newQueue(10, 1000)
	q.push([]byte{1}, 0, 0)
	select {
	case <-q.ready:
	default:
		t.Fatal("no token for a frame into an empty queue")
	}
	q.push([]byte{2}, 0, 0)
	select {
	case <-q.ready:
		t.Fatal("a token for a frame behind another")
	default:
	}
}

func TestBuffers(t *testing.T) {
	b := newBuffers()
	for _, n := range []int{1, 256, 257, 1500, 70000, 200000} {
		buf := b.get(n)
		if len(buf) != n {
			t.Fatalf("get(%d) has length %d", n, len(buf))
		}
		b.put(buf)
		if again := b.get(n); cap(again) != cap(buf) {
			t.Errorf("get(%d) after put: capacity %d, want %d", n, cap(again), cap(buf))
		}
	}
}

func TestCommands(t *testing.T) {
	r := &Relay{}
	if got := r.command("rtt 40ms"); got != "ok" {
		t.Fatalf("rtt 40ms: %q", got)
	}
	if r.RTT() != 40*time.Millisecond {
		t.Errorf("RTT %v", r.RTT())
	}
	if got := r.command("rtt"); got != "40ms" {
		t.Errorf("rtt: %q", got)
	}
	for _, bad := range []string{"rtt -1ms", "rtt 11s", "rtt soon", "delay 1ms", ""} {
		if got := r.command(bad); !strings.HasPrefix(got, "error: ") {
			t.Errorf("%q: %q, want an error", bad, got)
		}
	}
	if r.RTT() != 40*time.Millisecond {
		t.Errorf("a refused command changed the RTT to %v", r.RTT())
	}
	if got := r.command("stats"); !strings.Contains(got, `"rtt_ns":40000000`) {
		t.Errorf("stats: %q", got)
	}
}

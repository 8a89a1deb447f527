package delayline

import (
	"sync"
	"sync/atomic"
)

// frame is one packet in flight: its bytes as the packet socket gives
// them (virtio-net header first) and the time it may leave, in
// nanoseconds of the monotonic clock.
type frame struct {
	data    []byte
	release int64
}

// queue is one direction's frames in flight, in arrival order. A frame
// leaves at its arrival plus the delay, but never before the frame ahead
// of it: a delay that shrinks while frames are in flight makes the
// following ones wait for those ahead (as a shortened wire would), so the
// line never reorders. Beyond its bounds it drops what arrives, as a
// router's full queue does.
type queue struct {
	mu          sync.Mutex
	frames      []frame
	head        int // frames[head:] are queued
	bytes       int
	lastRelease int64
	maxFrames   int
	maxBytes    int
	// ready gets a token when a frame is queued into an empty queue, to
	// wake the sender waiting for one.
	ready chan struct{}

	dropped      atomic.Uint64
	droppedBytes atomic.Uint64
	passed       atomic.Uint64
	passedBytes  atomic.Uint64
}

func newQueue(maxFrames, maxBytes int) *queue {
	return &queue{maxFrames: maxFrames, maxBytes: maxBytes, ready: make(chan struct{}, 1)}
}

// push queues data, arrived at now, to leave after delay; false when the
// queue is full and data was dropped.
func (q *queue) push(data []byte, now, delay int64) bool {
	q.mu.Lock()
	n := len(q.frames) - q.head
	if n >= q.maxFrames || q.bytes+len(data) > q.maxBytes {
		q.mu.Unlock()
		q.dropped.Add(1)
		q.droppedBytes.Add(uint64(len(data)))
		return false
	}
	release := max(now+delay, q.lastRelease)
	q.lastRelease = release
	if q.head > 0 && q.head >= len(q.frames)/2 {
		// Reuse the front half rather than let the slice grow forever.
		k := copy(q.frames, q.frames[q.head:])
		clear(q.frames[k:])
		q.frames = q.frames[:k]
		q.head = 0
	}
	q.frames = append(q.frames, frame{data: data, release: release})
	q.bytes += len(data)
	q.mu.Unlock()
	if n == 0 {
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return true
}

// peek is the frame at the head, if any. Only the one sender pops, so the
// head stays what peek saw until it does.
func (q *queue) peek() (frame, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.frames) {
		return frame{}, false
	}
	return q.frames[q.head], true
}

// pop removes the head frame, counting it as passed.
func (q *queue) pop() frame {
	q.mu.Lock()
	f := q.frames[q.head]
	q.frames[q.head] = frame{}
	q.head++
	q.bytes -= len(f.data)
	q.mu.Unlock()
	q.passed.Add(1)
	q.passedBytes.Add(uint64(len(f.data)))
	return f
}

// depth is the frames and bytes queued.
func (q *queue) depth() (frames, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.frames) - q.head, q.bytes
}

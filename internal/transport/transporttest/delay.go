package transporttest

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/transport"
)

// Delayed is Conn over a link with a fixed latency: every write reaches
// the other end oneWay after it was made, in order, with no bandwidth
// limit, so that a test can count the round trips a protocol waits for
// (what one costs at a far link's round trip of 2*oneWay).
func Delayed(tb testing.TB, from, to string, oneWay time.Duration) (dialer, acceptor *transport.Session) {
	tb.Helper()
	a, b := DelayedPipe(oneWay)
	return connOver(tb, a, b, from, to)
}

// DelayedPipe is net.Pipe with oneWay of latency each way. A write
// returns once the line took it (the line buffers without bound, as a
// link's queue would for the small messages tests send).
func DelayedPipe(oneWay time.Duration) (net.Conn, net.Conn) {
	a, aLine := net.Pipe()
	bLine, b := net.Pipe()
	go delay(aLine, bLine, oneWay)
	go delay(bLine, aLine, oneWay)
	return a, b
}

// delay carries what src's far end writes to dst's far end, each chunk
// oneWay after it was read; when either end closes, both do.
func delay(src, dst net.Conn, oneWay time.Duration) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	var (
		mu     sync.Mutex
		queue  []chunk
		ended  bool
		signal = make(chan struct{}, 1)
	)
	wake := func() {
		select {
		case signal <- struct{}{}:
		default:
		}
	}
	go func() {
		defer wake()
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			mu.Lock()
			if n > 0 {
				queue = append(queue, chunk{time.Now().Add(oneWay), buf[:n]})
			}
			if err != nil {
				ended = true
			}
			mu.Unlock()
			wake()
			if err != nil {
				return
			}
		}
	}()
	defer src.Close()
	defer dst.Close()
	for {
		mu.Lock()
		var next *chunk
		if len(queue) > 0 {
			next = &queue[0]
		}
		done := ended && next == nil
		mu.Unlock()
		switch {
		case done:
			return
		case next == nil:
			<-signal
			continue
		}
		time.Sleep(time.Until(next.at))
		if _, err := dst.Write(next.data); err != nil {
			return
		}
		mu.Lock()
		queue = queue[1:]
		mu.Unlock()
	}
}

package transporttest

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// A message and its answer take two one-way delays; what is written
// arrives whole and in order.
func TestDelayedPipe(t *testing.T) {
	const oneWay = 20 * time.Millisecond
	a, b := DelayedPipe(oneWay)
	defer a.Close()
	go func() {
		buf := make([]byte, 5)
		for {
			if _, err := io.ReadFull(b, buf); err != nil {
				b.Close()
				return
			}
			if _, err := b.Write(buf); err != nil {
				return
			}
		}
	}()
	for i := range 3 {
		start := time.Now()
		want := []byte{'p', 'i', 'n', 'g', byte('0' + i)}
		if _, err := a.Write(want); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := io.ReadFull(a, got); err != nil {
			t.Fatal(err)
		}
		rtt := time.Since(start)
		if !bytes.Equal(got, want) {
			t.Errorf("echo %q, want %q", got, want)
		}
		if rtt < 2*oneWay || rtt > 2*oneWay+50*time.Millisecond {
			t.Errorf("round trip %v, want about %v", rtt, 2*oneWay)
		}
	}
	// Many writes in a row stay in order.
	go func() {
		for i := range 100 {
			_, _ = a.Write([]byte{'s', 'e', 'q', byte(i), '.'})
		}
	}()
	all := make([]byte, 500)
	if _, err := io.ReadFull(a, all); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if all[5*i+3] != byte(i) {
			t.Fatalf("echoed stream out of order at message %d: %q", i, all)
		}
	}
}

package delayline

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketRelay is a relay whose one direction runs between two datagram
// socket pairs instead of packet sockets: the receive and send loops as
// they are, without root. The test writes into in and reads from out.
func socketRelay(t *testing.T, rtt time.Duration, maxFrames int) (r *Relay, in, out int) {
	t.Helper()
	pair := func() [2]int {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		tv := unix.NsecToTimeval(int64(pollEvery))
		for _, fd := range fds {
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				t.Fatal(err)
			}
		}
		return fds
	}
	a, b := pair(), pair()
	r = &Relay{epoch: time.Now(), fds: []int{a[0], a[1], b[0], b[1]}}
	r.rtt.Store(int64(rtt))
	r.dirs = []*direction{{name: "a to b", from: a[1], to: b[1], q: newQueue(maxFrames, 1<<20), bufs: newBuffers()}}
	runRelay(t, r)
	return r, a[0], b[0]
}

// sendSeq writes a frame of a virtio-net header's length and a sequence
// number.
func sendSeq(t *testing.T, fd int, seq uint32) {
	t.Helper()
	f := make([]byte, vnetHdrLen+4)
	binary.BigEndian.PutUint32(f[vnetHdrLen:], seq)
	if _, err := unix.Write(fd, f); err != nil {
		t.Fatal(err)
	}
}

// recvSeq reads the next frame's sequence number and when it came.
func recvSeq(t *testing.T, fd int) (uint32, time.Time) {
	t.Helper()
	buf := make([]byte, 64)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return binary.BigEndian.Uint32(buf[vnetHdrLen:n]), time.Now()
	}
	t.Fatal("no frame came through")
	return 0, time.Time{}
}

func TestRelayDelaysInOrder(t *testing.T) {
	r, in, out := socketRelay(t, 60*time.Millisecond, 1000)
	sent := map[uint32]time.Time{}
	// Five frames at 30 ms one way, then the round trip cut to 10 ms: the
	// five after it must wait for those ahead, not overtake them.
	for seq := range uint32(10) {
		if seq == 5 {
			if err := r.SetRTT(10 * time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		sent[seq] = time.Now()
		sendSeq(t, in, seq)
		time.Sleep(2 * time.Millisecond)
	}
	var firstLate time.Time
	for want := range uint32(10) {
		seq, at := recvSeq(t, out)
		if seq != want {
			t.Fatalf("frame %d came out as frame %d", want, seq)
		}
		took := at.Sub(sent[seq])
		switch {
		case seq < 5 && (took < 30*time.Millisecond || took > 40*time.Millisecond):
			t.Errorf("frame %d took %v, want 30 ms", seq, took)
		case seq == 5:
			firstLate = at
		}
		if seq >= 5 && at.Before(firstLate) {
			t.Errorf("frame %d left before frame 5", seq)
		}
	}
	// Once the line has drained, the shorter delay holds.
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	sendSeq(t, in, 99)
	if seq, at := recvSeq(t, out); seq != 99 || at.Sub(start) < 5*time.Millisecond || at.Sub(start) > 15*time.Millisecond {
		t.Errorf("frame %d after the change took %v, want 5 ms", seq, at.Sub(start))
	}
	s := r.Stats()
	if d := s.Directions[0]; d.Passed != 11 || d.Dropped != 0 {
		t.Errorf("passed %d, dropped %d; want 11, 0", d.Passed, d.Dropped)
	}
}

func TestRelayDropsBeyondItsQueue(t *testing.T) {
	r, in, out := socketRelay(t, 200*time.Millisecond, 4)
	for seq := range uint32(10) {
		sendSeq(t, in, seq)
	}
	for want := range uint32(4) {
		if seq, _ := recvSeq(t, out); seq != want {
			t.Fatalf("got frame %d, want %d", seq, want)
		}
	}
	if d := r.Stats().Directions[0]; d.Passed != 4 || d.Dropped != 6 {
		t.Errorf("passed %d, dropped %d; want 4, 6", d.Passed, d.Dropped)
	}
}

// runRelay runs r until the test ends, and fails the test if it ended
// with an error.
func runRelay(t *testing.T, r *Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
}

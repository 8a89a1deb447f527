package transport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// rwNopCloser gives a reader and a writer the ReadWriteCloser a Channel
// wants.
type rwNopCloser struct {
	io.Reader
	io.Writer
}

func (rwNopCloser) Close() error { return nil }

// readChannel is a receiving channel over recorded bytes.
func readChannel(b []byte) *Channel {
	ch := newChannel(rwNopCloser{Reader: bytes.NewReader(b), Writer: io.Discard})
	ch.Kind = "test"
	return ch
}

// pipeChannels connects two channels over net.Pipe, whose writes wait for
// the reader: the harshest interleaving for concurrent writers.
func pipeChannels(t *testing.T) (*Channel, *Channel) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	ca, cb := newChannel(a), newChannel(b)
	ca.Kind, cb.Kind = "pipe", "pipe"
	return ca, cb
}

// sessionChannels opens a channel over a real session (yamux on a unix
// socket).
func sessionChannels(t *testing.T) (*Channel, *Channel) {
	cli, srv := sessionPair(t)
	acc := make(chan *Channel, 1)
	go func() {
		ch, err := srv.Accept()
		if err != nil {
			t.Error(err)
		}
		acc <- ch
	}()
	snd, err := cli.Open("big")
	if err != nil {
		t.Fatal(err)
	}
	rcv := <-acc
	if rcv == nil {
		t.FailNow()
	}
	return snd, rcv
}

// jsonString returns a JSON string message whose encoding is exactly n
// bytes (n >= 2), with content that differs from frame to frame.
func jsonString(n int, seed byte) string {
	b := make([]byte, n-2)
	for i := range b {
		b[i] = 'a' + byte((i/7+int(seed))%26)
	}
	return string(b)
}

// frames decodes every frame in b.
func frames(t *testing.T, b []byte) []Frame {
	t.Helper()
	var out []Frame
	r := bytes.NewReader(b)
	for r.Len() > 0 {
		f, err := ReadFrame(r, nil)
		if err != nil {
			t.Fatalf("frame %d: %v", len(out), err)
		}
		out = append(out, f)
	}
	return out
}

func TestControlMessageSizes(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int // of the JSON encoding
	}{
		{"empty string", 2},
		{"small", 100},
		{"MaxPayload-1", MaxPayload - 1},
		{"MaxPayload", MaxPayload},
		{"MaxPayload+1", MaxPayload + 1},
		{"two frames exactly", 2 * MaxPayload},
		{"two frames and a byte", 2*MaxPayload + 1},
		{"5 MiB", 5 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := jsonString(tc.size, byte(tc.size))
			var wire bytes.Buffer
			snd := newChannel(rwNopCloser{Reader: strings.NewReader(""), Writer: &wire})
			if err := snd.Send(msg); err != nil {
				t.Fatal(err)
			}
			// On the wire: ceil(size/MaxPayload) frames, all full but the
			// last, continuation frames first, one control frame last.
			fs := frames(t, wire.Bytes())
			want := max(1, (tc.size+MaxPayload-1)/MaxPayload)
			if len(fs) != want {
				t.Fatalf("%d frames, want %d", len(fs), want)
			}
			total := 0
			for i, f := range fs {
				wantType, wantLen := FrameControlMore, MaxPayload
				if i == len(fs)-1 {
					wantType, wantLen = FrameControl, tc.size-total
				}
				if f.Type != wantType || len(f.Payload) != wantLen || f.Seq != uint64(i) {
					t.Fatalf("frame %d: %s seq %d of %d bytes, want %s seq %d of %d", i, f.Type, f.Seq, len(f.Payload), wantType, i, wantLen)
				}
				total += len(f.Payload)
			}
			rcv := readChannel(wire.Bytes())
			var got string
			if err := rcv.Recv(&got); err != nil {
				t.Fatal(err)
			}
			if got != msg {
				t.Fatalf("message of %d bytes came back as %d bytes", len(msg), len(got))
			}
			if err := rcv.Recv(&got); !errors.Is(err, io.EOF) {
				t.Fatalf("after the message: %v, want io.EOF", err)
			}
		})
	}
}

// TestControlInterleavedWithData mixes large control messages with the byte
// stream on one channel, before and after the stream's end.
func TestControlInterleavedWithData(t *testing.T) {
	for _, tr := range []struct {
		name string
		pair func(*testing.T) (*Channel, *Channel)
	}{
		{"pipe", pipeChannels},
		{"session", sessionChannels},
	} {
		t.Run(tr.name, func(t *testing.T) {
			snd, rcv := tr.pair(t)
			m1, m2, m3, m4 := jsonString(MaxPayload+1, 1), jsonString(5<<20, 2), jsonString(2, 3), jsonString(3*MaxPayload, 4)
			d1, d2 := bytes.Repeat([]byte("data1"), 700_000), bytes.Repeat([]byte("d2"), 100)
			errc := make(chan error, 1)
			go func() {
				errc <- func() error {
					for _, step := range []func() error{
						func() error { return snd.Send(m1) },
						func() error { _, err := snd.Write(d1); return err },
						func() error { return snd.Send(m2) },
						func() error { return snd.Send(m3) },
						func() error { _, err := snd.Write(d2); return err },
						snd.CloseWrite,
						func() error { return snd.Send(m4) },
					} {
						if err := step(); err != nil {
							return err
						}
					}
					return nil
				}()
			}()
			recv := func(want string) {
				t.Helper()
				var got string
				if err := rcv.Recv(&got); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("message of %d bytes came back as %d bytes", len(want)+2, len(got)+2)
				}
			}
			recv(m1)
			got := make([]byte, len(d1))
			if _, err := io.ReadFull(rcv, got); err != nil || !bytes.Equal(got, d1) {
				t.Fatalf("first data: %v", err)
			}
			recv(m2)
			recv(m3)
			rest, err := io.ReadAll(rcv)
			if err != nil || !bytes.Equal(rest, d2) {
				t.Fatalf("second data: %d bytes, %v", len(rest), err)
			}
			recv(m4)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// script encodes frames as a peer would, sequence numbers in order.
func script(fs ...Frame) []byte {
	var b bytes.Buffer
	for i, f := range fs {
		f.Seq = uint64(i)
		if err := WriteFrame(&b, f); err != nil {
			panic(err)
		}
	}
	return b.Bytes()
}

func more(p []byte) Frame    { return Frame{Type: FrameControlMore, Payload: p} }
func control(p []byte) Frame { return Frame{Type: FrameControl, Payload: p} }

// TestControlMessageBrokenPeer feeds Recv what a broken or hostile peer
// might send in the middle of a continued control message.
func TestControlMessageBrokenPeer(t *testing.T) {
	const limit = 3*MaxPayload + MaxPayload/2
	full := func(c byte) []byte { return bytes.Repeat([]byte{c}, MaxPayload) }
	// atLimit is a message of exactly limit bytes, split as Send splits it.
	atLimit, _ := json.Marshal(jsonString(limit, 9))
	var atLimitFrames []Frame
	for p := atLimit; len(p) > 0; p = p[min(len(p), MaxPayload):] {
		atLimitFrames = append(atLimitFrames, more(p[:min(len(p), MaxPayload)]))
	}
	atLimitFrames[len(atLimitFrames)-1].Type = FrameControl
	oneMore := append([]Frame(nil), atLimitFrames...)
	oneMore[len(oneMore)-1].Payload = append(bytes.Clone(oneMore[len(oneMore)-1].Payload), ' ')
	for _, tc := range []struct {
		name   string
		wire   []byte
		ok     bool
		errIs  error
		errHas string
		remote string
		broken bool // the channel stays unusable after the error
	}{
		{name: "exactly the bound", wire: script(atLimitFrames...), ok: true},
		{
			name:   "beyond the bound",
			wire:   script(more(full('[')), more(full(' ')), more(full(' ')), control(full(' '))),
			errHas: fmt.Sprintf("exceeds %d bytes", limit), broken: true,
		},
		{
			name:   "beyond the bound, last piece small",
			wire:   script(oneMore...),
			errHas: fmt.Sprintf("exceeds %d bytes", limit), broken: true,
		},
		{
			name:  "truncated at a frame boundary",
			wire:  script(more([]byte(`["a",`)), more([]byte(`"b",`))),
			errIs: io.ErrUnexpectedEOF, errHas: "cut short after 9 bytes", broken: true,
		},
		{
			name:  "truncated inside a frame",
			wire:  script(more([]byte(`["a",`)), control([]byte(`"b"]`)))[:2*headerSize+5+2],
			errIs: io.ErrUnexpectedEOF, broken: true,
		},
		{
			name:   "data frame in the middle",
			wire:   script(more([]byte(`["a",`)), Frame{Type: FrameData, Payload: []byte("x")}, control([]byte(`"b"]`))),
			errHas: "data frame in the middle of a control message", broken: true,
		},
		{
			name:   "end frame in the middle",
			wire:   script(more([]byte(`["a",`)), Frame{Type: FrameEnd}),
			errHas: "end frame in the middle of a control message", broken: true,
		},
		{
			name:   "error frame in the middle",
			wire:   script(more([]byte(`["a",`)), Frame{Type: FrameError, Payload: []byte("disk full")}),
			remote: "disk full", broken: true,
		},
		{
			name:   "empty continuation",
			wire:   script(more([]byte(`["a",`)), more(nil), control([]byte(`"b"]`))),
			errHas: "empty control-continues frame", broken: true,
		},
		{
			name:   "empty first continuation",
			wire:   script(more(nil), control([]byte(`"b"`))),
			errHas: "empty control-continues frame", broken: true,
		},
		{
			name:   "bad JSON across frames",
			wire:   script(more([]byte(`["a",`)), control([]byte(`"b"`))),
			errHas: "bad control message",
		},
		{
			name:   "a lone empty control frame",
			wire:   script(control(nil)),
			errHas: "bad control message",
		},
		{
			name: "frames out of order",
			wire: func() []byte {
				b := script(more([]byte(`["a",`)), control([]byte(`"b"]`)))
				b[headerSize+5+15] = 7 // the second frame's seq
				return b
			}(),
			errHas: "frame 7 arrived where 1 was due", broken: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := readChannel(tc.wire)
			rcv.maxControl = limit
			var v any
			err := rcv.Recv(&v)
			switch {
			case tc.ok:
				if err != nil {
					t.Fatal(err)
				}
				return
			case err == nil:
				t.Fatalf("accepted: %.40v", v)
			case tc.remote != "":
				if !IsRemote(err) || err.Error() != tc.remote {
					t.Fatalf("got %v, want the remote error %q", err, tc.remote)
				}
			case tc.errIs != nil && !errors.Is(err, tc.errIs):
				t.Fatalf("got %v, want %v", err, tc.errIs)
			case tc.errHas != "" && !strings.Contains(err.Error(), tc.errHas):
				t.Fatalf("got %v, want %q", err, tc.errHas)
			}
			if tc.broken {
				if err2 := rcv.Recv(&v); err2 == nil || err2.Error() != err.Error() {
					t.Fatalf("after %v the next Recv gave %v", err, err2)
				}
				if _, err2 := rcv.Read(make([]byte, 1)); err2 == nil {
					t.Fatal("Read works on a broken channel")
				}
			}
		})
	}
}

// frameGen produces a peer's frames without holding them: n continuation
// frames of MaxPayload, then a control frame.
type frameGen struct {
	n, i int
	cur  []byte
	off  int
}

func (g *frameGen) Read(p []byte) (int, error) {
	if g.off == len(g.cur) {
		if g.i > g.n {
			return 0, io.EOF
		}
		t := FrameControlMore
		if g.i == g.n {
			t = FrameControl
		}
		var b bytes.Buffer
		_ = WriteFrame(&b, Frame{Type: t, Seq: uint64(g.i), Payload: make([]byte, MaxPayload)})
		g.cur, g.off = b.Bytes(), 0
		g.i++
	}
	n := copy(p, g.cur[g.off:])
	g.off += n
	return n, nil
}

// TestControlMessageDefaultBound sends a peer's message one frame beyond
// MaxControlMessage: Recv stops there, holding at most the bound.
func TestControlMessageDefaultBound(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MaxControlMessage")
	}
	g := &frameGen{n: MaxControlMessage / MaxPayload}
	rcv := newChannel(rwNopCloser{Reader: g, Writer: io.Discard})
	var v any
	err := rcv.Recv(&v)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("exceeds %d bytes", MaxControlMessage)) {
		t.Fatalf("got %v", err)
	}
	if g.i != g.n+1 {
		t.Fatalf("stopped after %d frames, want %d", g.i, g.n+1)
	}
}

// TestConcurrentSends: messages sent from several goroutines at once
// arrive whole, each one's frames together.
func TestConcurrentSends(t *testing.T) {
	type msg struct {
		G, I int
		Fill string
	}
	fill := func(g, i int) string { return jsonString(MaxPayload+MaxPayload/2+g*1000+i, byte(g*7+i)) }
	for _, tr := range []struct {
		name string
		pair func(*testing.T) (*Channel, *Channel)
	}{
		{"pipe", pipeChannels},
		{"session", sessionChannels},
	} {
		t.Run(tr.name, func(t *testing.T) {
			snd, rcv := tr.pair(t)
			const senders, each = 6, 3
			var wg sync.WaitGroup
			errs := make(chan error, senders)
			defer func() {
				// On a failure, unblock the senders before they outlive the test.
				snd.Close()
				rcv.Close()
				wg.Wait()
			}()
			for g := range senders {
				wg.Go(func() {
					for i := range each {
						m := msg{G: g, I: i}
						if i == 1 {
							m.Fill = fill(g, i) // large ones among small ones
						}
						if err := snd.Send(m); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			seen := map[[2]int]bool{}
			for range senders * each {
				var m msg
				if err := rcv.Recv(&m); err != nil {
					t.Fatal(err)
				}
				k := [2]int{m.G, m.I}
				want := ""
				if m.I == 1 {
					want = fill(m.G, m.I)
				}
				if seen[k] || m.G >= senders || m.I >= each || m.Fill != want {
					t.Fatalf("message %v (seen before: %v) garbled", k, seen[k])
				}
				seen[k] = true
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func TestFrameTypes(t *testing.T) {
	for typ := range 8 {
		var b bytes.Buffer
		_ = WriteFrame(&b, Frame{Type: FrameType(typ), Payload: []byte("x")})
		_, err := ReadFrame(&b, nil)
		known := typ >= int(FrameControl) && typ <= int(FrameControlMore)
		if known != (err == nil) {
			t.Errorf("frame type %d (%s): %v", typ, FrameType(typ), err)
		}
	}
	if FrameControlMore.String() != "control-continues" {
		t.Errorf("FrameControlMore is %q", FrameControlMore.String())
	}
}

// A peer of an earlier protocol version is told apart by the version byte
// of its first frame.
func TestPreviousVersionRefused(t *testing.T) {
	b := script(control([]byte(`"hello"`)))
	b[3] = ProtocolVersion - 1
	var v any
	err := readChannel(b).Recv(&v)
	want := fmt.Sprintf("peer speaks protocol version %d, this ferry speaks %d", ProtocolVersion-1, ProtocolVersion)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// writeSizes records what it is given, and the size of each write.
type writeSizes struct {
	bytes.Buffer
	sizes []int
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return w.Buffer.Write(p)
}

// TestChannelBoundsStreamWrites: data and a control message larger than
// maxStreamWrite reach the stream in writes of at most that (so in yamux
// frames its reader need not wait for whole), and read back whole.
func TestChannelBoundsStreamWrites(t *testing.T) {
	var w writeSizes
	snd := newChannel(rwNopCloser{Reader: strings.NewReader(""), Writer: &w})
	data := make([]byte, 3*MaxPayload+12345)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	big := strings.Repeat("x", MaxPayload+5)
	if err := snd.Send(big); err != nil {
		t.Fatal(err)
	}
	if _, err := snd.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := snd.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	for i, n := range w.sizes {
		if n > maxStreamWrite {
			t.Fatalf("write %d is %d bytes, more than %d", i, n, maxStreamWrite)
		}
	}
	if min := (len(data) + len(big)) / maxStreamWrite; len(w.sizes) < min {
		t.Fatalf("%d writes for %d bytes", len(w.sizes), len(data)+len(big))
	}
	rcv := readChannel(w.Bytes())
	var got string
	if err := rcv.Recv(&got); err != nil || got != big {
		t.Fatalf("control message back: %d bytes, %v", len(got), err)
	}
	back, err := io.ReadAll(rcv)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("data back: %d of %d bytes, equal %v, %v", len(back), len(data), bytes.Equal(back, data), err)
	}
}

// A byte stream the peer ended (CloseWrite) and one cut off (the channel
// closed) both read as io.EOF; Ended tells them apart.
func TestChannelEnded(t *testing.T) {
	for _, ended := range []bool{true, false} {
		snd, rcv := sessionChannels(t)
		if _, err := snd.Write([]byte("some data")); err != nil {
			t.Fatal(err)
		}
		if ended {
			if err := snd.CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}
		snd.Close()
		b, err := io.ReadAll(rcv)
		if err != nil || string(b) != "some data" {
			t.Fatalf("ended %v: read %q, %v", ended, b, err)
		}
		if rcv.Ended() != ended {
			t.Errorf("Ended() = %v for a stream the peer ended: %v", rcv.Ended(), ended)
		}
	}
}

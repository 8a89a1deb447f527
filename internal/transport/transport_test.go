package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := Frame{Type: FrameData, Seq: 42, Payload: []byte("pages")}
	if err := WriteFrame(&buf, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadFrame(&buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.Type != in.Type || out.Seq != in.Seq || !bytes.Equal(out.Payload, in.Payload) {
		t.Fatalf("got %+v, want %+v", out, in)
	}
}

func TestFrameRejectsCorruption(t *testing.T) {
	var buf bytes.Buffer
	_ = WriteFrame(&buf, Frame{Type: FrameData, Payload: []byte("hello world")})
	b := buf.Bytes()
	b[len(b)-1] ^= 0x40
	if _, err := ReadFrame(bytes.NewReader(b), nil); !errors.Is(err, ErrChecksum) {
		t.Fatalf("corrupted payload: got %v, want ErrChecksum", err)
	}
	_ = WriteFrame(&buf, Frame{Type: FrameData})
	v := append([]byte(nil), buf.Bytes()[len(b):]...)
	v[3] = ProtocolVersion + 1
	if _, err := ReadFrame(bytes.NewReader(v), nil); err == nil {
		t.Fatal("a frame of another protocol version was accepted")
	}
	if _, err := ReadFrame(bytes.NewReader(b[:10]), nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated header: got %v", err)
	}
}

func TestFrameTooLarge(t *testing.T) {
	if err := WriteFrame(io.Discard, Frame{Type: FrameData, Payload: make([]byte, MaxPayload+1)}); err == nil {
		t.Fatal("oversized payload accepted")
	}
}

// sessionPair connects a client and a server session over a unix socket.
func sessionPair(t *testing.T) (*Session, *Session) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	srvc := make(chan *Session, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			srvc <- nil
			return
		}
		s, _ := acceptPlain(c, Hello{Name: "dst", Role: "agent"})
		srvc <- s
	}()
	cli, err := Dial(context.Background(), sock, cfg(Hello{Name: "src", Role: "agent"}, nil, PathOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	srv := <-srvc
	if srv == nil {
		t.Fatal("server session failed")
	}
	t.Cleanup(func() { cli.Close(); srv.Close() })
	if cli.Peer.Name != "dst" || srv.Peer.Name != "src" {
		t.Fatalf("hello: client saw %+v, server saw %+v", cli.Peer, srv.Peer)
	}
	return cli, srv
}

func TestSessionChannels(t *testing.T) {
	cli, srv := sessionPair(t)
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	go func() {
		ch, err := cli.Open("pages")
		if err != nil {
			return
		}
		ch.Send(map[string]int{"n": len(data)})
		ch.Write(data)
		ch.CloseWrite()
	}()
	ch, err := srv.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if ch.Kind != "pages" {
		t.Fatalf("kind %q", ch.Kind)
	}
	var hdr map[string]int
	if err := ch.Recv(&hdr); err != nil || hdr["n"] != len(data) {
		t.Fatalf("header %v %v", hdr, err)
	}
	got, err := io.ReadAll(ch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("stream corrupted")
	}
	if cli.BytesSent() < int64(len(data)) || srv.BytesReceived() < int64(len(data)) {
		t.Fatalf("byte counters: sent %d received %d", cli.BytesSent(), srv.BytesReceived())
	}
}

func TestChannelRemoteError(t *testing.T) {
	cli, srv := sessionPair(t)
	go func() {
		ch, _ := cli.Open("restore")
		ch.Fail(errors.New("criu restore failed"))
	}()
	ch, err := srv.Accept()
	if err != nil {
		t.Fatal(err)
	}
	var v any
	err = ch.Recv(&v)
	if !IsRemote(err) || err.Error() != "criu restore failed" {
		t.Fatalf("got %v", err)
	}
}

func TestHandshakeRejectsNonFerryPeer(t *testing.T) {
	a, b := net.Pipe()
	go func() { b.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); io.Copy(io.Discard, b) }()
	if _, err := Client(a, cfg(Hello{Name: "x"}, nil, PathOptions{})); err == nil {
		t.Fatal("handshake with an HTTP peer succeeded")
	}
}

func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	_ = WriteFrame(&buf, Frame{Type: FrameControl, Seq: 1, Payload: []byte(`{"kind":"x"}`)})
	f.Add(buf.Bytes())
	f.Add([]byte("FRY\x01\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00"))
	f.Add([]byte("FRY" + string(rune(ProtocolVersion)) + "\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00"))
	var more bytes.Buffer // not buf: f.Add keeps the slice it is given
	_ = WriteFrame(&more, Frame{Type: FrameControlMore, Seq: 2, Payload: []byte(`{"kind":`)})
	f.Add(more.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ReadFrame(bytes.NewReader(b), nil)
		if err != nil {
			return
		}
		// Whatever decodes must encode back to the same bytes.
		var out bytes.Buffer
		if err := WriteFrame(&out, fr); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), b[:out.Len()]) {
			t.Fatal("decode/encode mismatch")
		}
	})
}

func BenchmarkChannelThroughput(b *testing.B) {
	t := &testing.T{}
	cli, srv := sessionPair(t)
	chunk := make([]byte, 1<<20)
	b.SetBytes(int64(len(chunk)))
	done := make(chan struct{})
	go func() {
		ch, _ := srv.Accept()
		io.Copy(io.Discard, ch)
		close(done)
	}()
	ch, _ := cli.Open("bench")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ch.Write(chunk)
	}
	ch.CloseWrite()
	<-done
}

func TestControlAfterEndOfStream(t *testing.T) {
	cli, srv := sessionPair(t)
	go func() {
		ch, _ := cli.Open("rootfs")
		ch.Write([]byte("delta"))
		ch.CloseWrite()
		ch.Send("attrs")
	}()
	ch, err := srv.Accept()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(ch)
	if err != nil || string(b) != "delta" {
		t.Fatalf("stream %q %v", b, err)
	}
	var s string
	if err := ch.Recv(&s); err != nil || s != "attrs" {
		t.Fatalf("control after end: %q %v", s, err)
	}
}

func TestMaxBandwidthPacesWrites(t *testing.T) {
	cli, srv := sessionPair(t)
	cli.SetMaxBandwidth(80 << 20) // 10 MiB/s
	const n = 3 << 20
	done := make(chan int64, 1)
	go func() {
		ch, err := srv.Accept()
		if err != nil {
			done <- 0
			return
		}
		m, _ := io.Copy(io.Discard, ch)
		done <- m
	}()
	ch, err := cli.Open("bulk")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ch.Write(make([]byte, n))
	ch.CloseWrite()
	if got := <-done; got != n {
		t.Fatalf("received %d bytes", got)
	}
	// 3 MiB at 10 MiB/s cannot take much less than 0.3 s (minus one burst);
	// unpaced it takes about a millisecond here.
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("3 MiB capped at 10 MiB/s went through in %v", el)
	}
}

func TestVerifyConfig(t *testing.T) {
	p := newTestPKI(t)
	for _, c := range []struct {
		cfg  *Config
		want string
	}{
		{nil, "no config"},
		{&Config{}, "outage timeout must be positive"},
		{&Config{OutageTimeout: time.Second, Paths: PathOptions{Streams: -1}}, "streams"},
		{cfg(Hello{Name: "h2"}, p.sec(t, "h1"), PathOptions{}), `calls itself "h2" but its certificate is for "h1"`},
	} {
		if err := VerifyConfig(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("VerifyConfig(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
	if err := VerifyConfig(DefaultConfig()); err != nil {
		t.Errorf("the default config: %v", err)
	}
	if err := VerifyConfig(cfg(Hello{}, p.sec(t, "h1"), PathOptions{})); err != nil {
		t.Errorf("a config that takes its name from its certificate: %v", err)
	}
}

// Two endpoints in one process keep their own settings: nothing lives in
// the package.
func TestConfigsAreIndependent(t *testing.T) {
	a, b := net.Pipe()
	long, short := cfg(Hello{Name: "a"}, nil, PathOptions{}), cfg(Hello{Name: "b"}, nil, PathOptions{})
	long.OutageTimeout, short.OutageTimeout = time.Minute, 2*time.Second
	srv, err := NewServer(short)
	if err != nil {
		t.Fatal(err)
	}
	short.OutageTimeout = time.Hour // the Server took a copy
	done := make(chan *Session, 1)
	go func() {
		s, err := srv.Accept(b)
		if err != nil {
			t.Error(err)
		}
		done <- s
	}()
	cli, err := Client(a, long)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s := <-done
	if s == nil {
		t.FailNow()
	}
	defer s.Close()
	if cli.OutageTimeout() != time.Minute || s.OutageTimeout() != 2*time.Second {
		t.Errorf("outage timeouts: dialer %v, server %v", cli.OutageTimeout(), s.OutageTimeout())
	}
	if cli.Peer.Name != "b" || s.Peer.Name != "a" {
		t.Errorf("peers: %q and %q", cli.Peer.Name, s.Peer.Name)
	}
}

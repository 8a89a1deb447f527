package labtool

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader in turn.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freeAddrs reserves n loopback ports and frees them for the tool to take.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l.Addr().String())
		l.Close()
	}
	return out
}

// waitLine waits for buf to hold a line containing want.
func waitLine(t *testing.T, buf *syncBuffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(buf.String(), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", want, buf.String())
		}
	}
}

// Send and Recv carry a file whole, over one connection and striped over
// several spread across two listening addresses.
func TestSendRecv(t *testing.T) {
	data := make([]byte, 3<<20+17)
	_, _ = rand.Read(data)
	for _, streams := range []int{1, 3} {
		t.Run(fmt.Sprintf("streams=%d", streams), func(t *testing.T) {
			addrs := freeAddrs(t, 2)
			var ready syncBuffer
			var got bytes.Buffer
			done := make(chan error, 1)
			go func() { done <- Recv(context.Background(), addrs, false, streams, &ready, &got) }()
			waitLine(t, &ready, "listening")
			var out bytes.Buffer
			if err := Send(context.Background(), addrs, false, streams, bytes.NewReader(data), &out); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("received %d bytes, not the %d sent", got.Len(), len(data))
			}
			var n int64
			var secs float64
			if _, err := fmt.Sscanf(out.String(), "%d %f", &n, &secs); err != nil || n != int64(len(data)) || secs <= 0 {
				t.Errorf("send printed %q", out.String())
			}
		})
	}
}

// recvChildEnv makes the test binary a receiver that exits as soon as Recv
// returns, as `ferry-lab lab-tool recv` does: goroutines Recv left behind die with
// the process.
const recvChildEnv = "FERRY_LABTOOL_RECV_CHILD"

func TestMain(m *testing.M) {
	if addrs := os.Getenv(recvChildEnv); addrs != "" {
		err := Recv(context.Background(), strings.Split(addrs, ","), false, 3, os.Stdout, io.Discard)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A striped receiver's process must not exit before it acknowledged the end
// of the stream: the sender's Close waits for that acknowledgment and fails
// after OutageTimeout without it. With one thread the receiver's main
// goroutine reaches exit before its path writers run, unless Recv waits for
// them.
func TestRecvProcessAcknowledgesTheEnd(t *testing.T) {
	data := make([]byte, 1<<20)
	for i := range 5 {
		addrs := freeAddrs(t, 2)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), recvChildEnv+"="+strings.Join(addrs, ","), "GOMAXPROCS=1")
		var stderr syncBuffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
			t.Fatalf("receiver: %v %s", err, stderr.String())
		}
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = Send(ctx, addrs, false, 3, bytes.NewReader(data), &out)
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v (receiver: %s)", i, err, stderr.String())
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("run %d: receiver: %v %s", i, err, stderr.String())
		}
	}
}

// runClient runs a connection-keeping client until stop is closed and
// returns its result.
func runClient(t *testing.T, run func(stdin io.Reader, stdout io.Writer) error, stop <-chan struct{}) StreamResult {
	t.Helper()
	pr, pw := io.Pipe()
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(pr, &out) }()
	waitLine(t, &out, "connected")
	<-stop
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r StreamResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	return r
}

// echoServer echoes lines; after `silence` lines it stays silent for pause,
// and with lie it answers one line wrong.
func echoServer(t *testing.T, silence int, pause time.Duration, lie bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		sc := bufio.NewScanner(c)
		for i := 1; sc.Scan(); i++ {
			if i == silence {
				time.Sleep(pause)
			}
			line := sc.Text()
			if lie && i == 3 {
				line = "x"
			}
			fmt.Fprintln(c, line)
		}
	}()
	return l.Addr().String()
}

// Stream times a silence as a gap, and takes a wrong answer for an error.
func TestStream(t *testing.T) {
	stop := make(chan struct{})
	time.AfterFunc(400*time.Millisecond, func() { close(stop) })
	addr := echoServer(t, 5, 150*time.Millisecond, false)
	r := runClient(t, func(in io.Reader, out io.Writer) error {
		return Stream(context.Background(), addr, 10*time.Millisecond, in, out)
	}, stop)
	if !r.OK || r.Received < 5 || r.MaxGapMs < 150 || r.MaxGapMs > 1000 {
		t.Errorf("a kept connection with a 150 ms silence: %+v", r)
	}

	stop = make(chan struct{})
	time.AfterFunc(200*time.Millisecond, func() { close(stop) })
	addr = echoServer(t, 0, 0, true)
	r = runClient(t, func(in io.Reader, out io.Writer) error {
		return Stream(context.Background(), addr, 10*time.Millisecond, in, out)
	}, stop)
	if r.OK || !strings.Contains(r.Error, `answer "x" where 3 was due`) || r.Received != 2 {
		t.Errorf("a wrong answer: %+v", r)
	}
}

// Redis counts with a real redis-server: every INCR one more than the
// last; a server that goes away is an error, not a silent reconnect.
func TestRedis(t *testing.T) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (apt-get install redis-server): the Redis client test needs a real server")
	}
	port := strings.TrimPrefix(freeAddrs(t, 1)[0], "127.0.0.1:")
	dir := t.TempDir()
	cmd := exec.Command(server, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	addr := "127.0.0.1:" + port
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not listen")
		}
	}
	stop := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(stop) })
	r := runClient(t, func(in io.Reader, out io.Writer) error {
		return Redis(context.Background(), addr, "ferry:test", 10*time.Millisecond, in, out)
	}, stop)
	if !r.OK || r.Received < 5 || r.Sent != r.Received {
		t.Errorf("counting: %+v", r)
	}

	// The server goes: the client says so instead of dialing again.
	stop = make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		stopped = true
		time.Sleep(100 * time.Millisecond)
		close(stop)
	})
	r = runClient(t, func(in io.Reader, out io.Writer) error {
		return Redis(context.Background(), addr, "ferry:test", 10*time.Millisecond, in, out)
	}, stop)
	if r.OK || !strings.Contains(r.Error, "connection lost") {
		t.Errorf("a server that went away: %+v", r)
	}
}

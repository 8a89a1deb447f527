package pagestream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func encode(t *testing.T, in []byte, have Lookup) ([]byte, DedupStats) {
	t.Helper()
	var out bytes.Buffer
	st, err := Dedup(&out, bytes.NewReader(in), have)
	if err != nil {
		t.Fatalf("Dedup: %v", err)
	}
	return out.Bytes(), st
}

func TestRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		s := newSynthStream(seed)
		in := s.bytes()
		enc, dst := encode(t, in, s.held.lookup)
		if dst.Pages != s.pages || dst.Referenced != s.referenced {
			t.Fatalf("Dedup pages/referenced = %d/%d, want %d/%d", dst.Pages, dst.Referenced, s.pages, s.referenced)
		}
		if dst.BytesIn != int64(len(in)) || dst.BytesOut != int64(len(enc)) {
			t.Fatalf("Dedup bytes in/out = %d/%d, want %d/%d", dst.BytesIn, dst.BytesOut, len(in), len(enc))
		}
		// Each reference saves a page less its record; tags and run
		// lengths cost a few bytes per header.
		if want := int64(len(in)) - int64(s.referenced)*(PageSize-refSize-1) + 10*int64(len(s.steps)); int64(len(enc)) > want {
			t.Fatalf("encoded %d bytes, expected at most %d", len(enc), want)
		}
		var out bytes.Buffer
		est, err := Expand(&out, bytes.NewReader(enc), s.held.source)
		if err != nil {
			t.Fatalf("Expand: %v", err)
		}
		if !bytes.Equal(out.Bytes(), in) {
			t.Fatalf("round trip differs: %d bytes in, %d out", len(in), out.Len())
		}
		if est.Pages != s.pages || est.Referenced != s.referenced || est.BytesIn != int64(len(enc)) || est.BytesOut != int64(len(in)) {
			t.Fatalf("Expand stats %+v", est)
		}
	}
}

func TestNoLookupSendsEverything(t *testing.T) {
	s := newSynthStream(9)
	in := s.bytes()
	enc, st := encode(t, in, nil)
	if st.Referenced != 0 {
		t.Fatalf("referenced %d pages without a lookup", st.Referenced)
	}
	var out bytes.Buffer
	if _, err := Expand(&out, bytes.NewReader(enc), nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Fatal("round trip differs")
	}
}

func TestEmptyStream(t *testing.T) {
	enc, _ := encode(t, nil, nil)
	var out bytes.Buffer
	if _, err := Expand(&out, bytes.NewReader(enc), nil); err != nil || out.Len() != 0 {
		t.Fatalf("Expand of empty stream: %v, %d bytes", err, out.Len())
	}
}

func TestExpandRejectsMismatch(t *testing.T) {
	s := newSynthStream(4)
	enc, _ := encode(t, s.bytes(), s.held.lookup)
	// One referenced page: pid 1, first page of the 40-page add.
	k := PageKey{PID: 1, Addr: 0x800000}
	good := s.held[k]
	other := bytes.Repeat([]byte{7}, PageSize)
	cases := map[string]Source{
		"missing": func(q PageKey) ([]byte, Hash, bool) {
			if q == k {
				return nil, Hash{}, false
			}
			return s.held.source(q)
		},
		"other hash": func(q PageKey) ([]byte, Hash, bool) {
			if q == k {
				return other, HashPage(other), true
			}
			return s.held.source(q)
		},
		"data not matching hash": func(q PageKey) ([]byte, Hash, bool) {
			if q == k {
				return other, HashPage(good), true
			}
			return s.held.source(q)
		},
		"short data": func(q PageKey) ([]byte, Hash, bool) {
			if q == k {
				return good[:100], HashPage(good), true
			}
			return s.held.source(q)
		},
		"no source": nil,
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Expand(io.Discard, bytes.NewReader(enc), src)
			if !errors.Is(err, ErrPageMismatch) {
				t.Fatalf("got %v, want ErrPageMismatch", err)
			}
		})
	}
}

// record builds encoded records by hand.
func rec(parts ...any) []byte {
	var b bytes.Buffer
	for _, p := range parts {
		switch v := p.(type) {
		case byte:
			b.WriteByte(v)
		case []byte:
			b.Write(v)
		case uint32:
			binary.Write(&b, binary.LittleEndian, v)
		case uint64:
			binary.Write(&b, binary.LittleEndian, v)
		default:
			panic(fmt.Sprintf("rec: %T", p))
		}
	}
	return b.Bytes()
}

func TestExpandRejectsMalformed(t *testing.T) {
	page := bytes.Repeat([]byte{3}, PageSize)
	h := HashPage(page)
	held := store{{PID: 5, Addr: 0x1000}: page}
	add := criuHeader(psIOVAddF, pePresent, 2, 0x1000, dstPID(5))
	m := magic[:]
	cases := map[string][]byte{
		"empty":                 {},
		"bad magic":             rec([]byte("FPS\x02"), tagEnd),
		"unknown tag":           rec(m, byte('X')),
		"unknown command":       rec(m, tagHeader, criuHeader(0x99, 0, 0, 0, 0), tagEnd),
		"pages outside payload": rec(m, tagPages, uint32(1), page, tagEnd),
		"ref outside payload":   rec(m, tagRef, uint32(5), uint64(0x1000), h.Hi, h.Lo, tagEnd),
		"zero page run":         rec(m, tagHeader, add, tagPages, uint32(0), tagEnd),
		"run past payload":      rec(m, tagHeader, add, tagPages, uint32(3), page, page, page, tagEnd),
		"ref at wrong address":  rec(m, tagHeader, add, tagRef, uint32(5), uint64(0x2000), h.Hi, h.Lo, tagEnd),
		"ref with wrong pid":    rec(m, tagHeader, add, tagRef, uint32(6), uint64(0x1000), h.Hi, h.Lo, tagEnd),
		"ref in shmem": rec(m, tagHeader, criuHeader(psIOVAddF, pePresent, 1, 0x1000, dstShmem(5)),
			tagRef, uint32(5), uint64(0x1000), h.Hi, h.Lo, tagEnd),
		"header inside payload": rec(m, tagHeader, add, tagPages, uint32(1), page, tagHeader, add),
		"end inside payload":    rec(m, tagHeader, add, tagPages, uint32(1), page, tagEnd),
		"no end":                rec(m, tagHeader, add, tagPages, uint32(2), page, page),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Expand(io.Discard, bytes.NewReader(in), held.source)
			if err == nil {
				t.Fatal("Expand accepted malformed input")
			}
		})
	}
	// The same records, well formed, pass.
	ok := rec(m, tagHeader, add, tagRef, uint32(5), uint64(0x1000), h.Hi, h.Lo, tagPages, uint32(1), page, tagEnd)
	if _, err := Expand(io.Discard, bytes.NewReader(ok), held.source); err != nil {
		t.Fatalf("well-formed input: %v", err)
	}
}

func TestExpandTruncated(t *testing.T) {
	s := newSynthStream(5)
	enc, _ := encode(t, s.bytes(), s.held.lookup)
	cuts := []int{0, 1, 3, 4, 5, 4 + 1 + headerSize, len(enc) - 1}
	for c := 7; c < len(enc); c += 211 {
		cuts = append(cuts, c)
	}
	for _, c := range cuts {
		_, err := Expand(io.Discard, bytes.NewReader(enc[:c]), s.held.source)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("cut at %d of %d: got %v, want unexpected EOF", c, len(enc), err)
		}
	}
}

func TestDedupTruncated(t *testing.T) {
	s := newSynthStream(6)
	in := s.bytes()
	for _, c := range []int{1, headerSize - 1, 2*headerSize + 1, 3*headerSize + 100, len(in) - PageSize - 5, len(in) - 1} {
		var enc bytes.Buffer
		_, err := Dedup(&enc, bytes.NewReader(in[:c]), s.held.lookup)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("cut at %d: got %v, want unexpected EOF", c, err)
		}
		// Whatever got out must not look complete to the destination.
		if _, err := Expand(io.Discard, &enc, s.held.source); err == nil {
			t.Fatalf("cut at %d: Expand accepted a truncated dump", c)
		}
	}
}

func TestDedupRejectsUnknownCommand(t *testing.T) {
	in := criuHeader(0x42, 0, 1, 0, dstPID(1))
	_, err := Dedup(io.Discard, bytes.NewReader(in), nil)
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want ErrMalformed", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("channel down") }

func TestWriteErrors(t *testing.T) {
	s := newSynthStream(7)
	in := s.bytes()
	if _, err := Dedup(failWriter{}, bytes.NewReader(in), s.held.lookup); err == nil {
		t.Fatal("Dedup ignored a write error")
	}
	enc, _ := encode(t, in, s.held.lookup)
	if _, err := Expand(failWriter{}, bytes.NewReader(enc), s.held.source); err == nil {
		t.Fatal("Expand ignored a write error")
	}
}

// socketPair returns both ends of a connected AF_UNIX stream socket.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// fakeServer plays CRIU's page server: it reads headers and payloads,
// answers the commands that want an answer and stops after CLOSE. It
// returns every byte it received.
func fakeServer(c net.Conn) ([]byte, error) {
	var got bytes.Buffer
	for {
		b := make([]byte, headerSize)
		if _, err := io.ReadFull(c, b); err != nil {
			return got.Bytes(), fmt.Errorf("server: header: %w", err)
		}
		got.Write(b)
		h := parseHeader(b)
		if n := h.payloadPages(); n > 0 {
			if _, err := io.CopyN(&got, c, int64(n)*PageSize); err != nil {
				return got.Bytes(), fmt.Errorf("server: pages: %w", err)
			}
		}
		var reply []byte
		switch h.cmd & 0xffff {
		case psIOVOpen2:
			reply = []byte{0}
		case psIOVParent, psIOVClose, psIOVForceClose:
			reply = []byte{0, 0, 0, 0}
		}
		if _, err := c.Write(reply); err != nil {
			return got.Bytes(), err
		}
		if h.cmd == psIOVClose || h.cmd == psIOVForceClose {
			return got.Bytes(), c.Close()
		}
	}
}

// fakeClient plays CRIU's dump side: it sends each step and, where CRIU
// does, waits for the reply before going on.
func fakeClient(c net.Conn, steps []step) error {
	defer c.Close()
	for i, st := range steps {
		if _, err := c.Write(append(append([]byte{}, st.hdr...), st.data...)); err != nil {
			return fmt.Errorf("client step %d: %w", i, err)
		}
		if st.reply > 0 {
			if _, err := io.ReadFull(c, make([]byte, st.reply)); err != nil {
				return fmt.Errorf("client step %d: reply: %w", i, err)
			}
		}
	}
	return nil
}

// TestInteractiveSession runs a client that waits for replies through Dedup
// and Expand to a server that replies: if either side held a header back in
// its buffer, this deadlocks.
func TestInteractiveSession(t *testing.T) {
	s := newSynthStream(8)
	cliA, cliB := socketPair(t) // CRIU client <-> ferry source
	srvA, srvB := socketPair(t) // ferry destination <-> CRIU server
	pr, pw := io.Pipe()         // ferry's channel
	t.Cleanup(func() { pr.Close(); pw.Close() })

	errs := make(chan error, 5)
	var got []byte
	go func() { errs <- fakeClient(cliA, s.steps) }()
	go func() {
		var err error
		got, err = fakeServer(srvB)
		errs <- err
	}()
	go func() {
		_, err := Dedup(pw, cliB, s.held.lookup)
		pw.CloseWithError(err)
		errs <- err
	}()
	go func() {
		_, err := Expand(srvA, pr, s.held.source)
		errs <- err
	}()
	go func() {
		// Replies travel back untouched.
		_, err := io.Copy(cliB, srvA)
		errs <- err
	}()
	timeout := time.After(30 * time.Second)
	for i := 0; i < 5; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			t.Fatal("session deadlocked")
		}
	}
	if !bytes.Equal(got, s.bytes()) {
		t.Fatalf("server got %d bytes, client sent %d", len(got), len(s.bytes()))
	}
}

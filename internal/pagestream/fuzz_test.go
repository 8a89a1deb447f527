package pagestream

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fuzzHeld is the destination store the fuzz target expands against: one
// page, at pid 1, address 0x1000.
var fuzzHeld = store{{PID: 1, Addr: 0x1000}: fuzzPage("held page ")}

func fuzzPage(pattern string) []byte {
	return bytes.Repeat([]byte(pattern), PageSize/len(pattern)+1)[:PageSize]
}

// FuzzExpand feeds arbitrary input to Expand: it must never panic, must
// reject input that is not an encoded stream, and whatever it accepts must
// be a CRIU stream that Dedup and Expand carry unchanged.
func FuzzExpand(f *testing.F) {
	s := newSynthStream(11)
	enc := encodeFuzz(f, s.bytes(), s.held.lookup)
	f.Add(enc[:200])
	f.Add([]byte("not a stream"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		st, err := Expand(&out, bytes.NewReader(in), fuzzHeld.source)
		if err != nil {
			return
		}
		if !bytes.HasPrefix(in, magic[:]) {
			t.Fatalf("accepted input without magic: %q", in)
		}
		if st.BytesOut != int64(out.Len()) || st.BytesIn > int64(len(in)) {
			t.Fatalf("stats %+v for %d bytes in, %d out", st, len(in), out.Len())
		}
		var again, back bytes.Buffer
		if _, err := Dedup(&again, bytes.NewReader(out.Bytes()), fuzzHeld.lookup); err != nil {
			t.Fatalf("Dedup of accepted output: %v", err)
		}
		if _, err := Expand(&back, &again, fuzzHeld.source); err != nil {
			t.Fatalf("Expand of re-encoded output: %v", err)
		}
		if !bytes.Equal(back.Bytes(), out.Bytes()) {
			t.Fatal("re-encoded stream differs")
		}
	})
}

func encodeFuzz(tb testing.TB, in []byte, have Lookup) []byte {
	var out bytes.Buffer
	if _, err := Dedup(&out, bytes.NewReader(in), have); err != nil {
		tb.Fatal(err)
	}
	return out.Bytes()
}

// TestFuzzCorpus keeps the committed seeds meaningful: the complete
// sessions expand, the broken ones fail.
func TestFuzzCorpus(t *testing.T) {
	for name, wantOK := range map[string]bool{
		"valid-session": true, "empty-session": true, "open-only": true,
		"truncated-session": false, "truncated-in-page": false, "garbage": false, "wrong-hash": false,
	} {
		b, err := os.ReadFile(filepath.Join("testdata/fuzz/FuzzExpand", name))
		if err != nil {
			t.Fatal(err)
		}
		_, lit, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lit, "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		st, err := Expand(io.Discard, strings.NewReader(s), fuzzHeld.source)
		if (err == nil) != wantOK {
			t.Errorf("%s: Expand error %v", name, err)
		}
		if name == "valid-session" && st.Referenced != 1 {
			t.Errorf("%s: %d pages referenced, want 1", name, st.Referenced)
		}
	}
}

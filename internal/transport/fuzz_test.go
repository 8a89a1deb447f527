package transport

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// fuzzRecord is one frame of a fuzzed peer's script.
type fuzzRecord struct {
	typ       FrameType
	payload   []byte
	badCRC    bool
	truncated bool // the input ended inside the payload
}

// parseScript reads records of [type][length][payload]: the type's low
// bits pick a frame type (0 and 6 are unknown ones), its top bit spoils the
// checksum. A payload the input cuts short makes a truncated last frame.
func parseScript(b []byte) []fuzzRecord {
	var recs []fuzzRecord
	for len(b) >= 2 {
		r := fuzzRecord{typ: FrameType(b[0] & 0x7f % 7), badCRC: b[0]&0x80 != 0}
		n := int(b[1])
		b = b[2:]
		if n > len(b) {
			r.payload, r.truncated = b, true
			recs = append(recs, r)
			break
		}
		r.payload, b = b[:n], b[n:]
		recs = append(recs, r)
	}
	return recs
}

// encodeScript puts the records on the wire, sequence numbers in order.
func encodeScript(recs []fuzzRecord) []byte {
	var w bytes.Buffer
	for i, r := range recs {
		start := w.Len()
		full := r.payload
		if r.truncated {
			full = append(bytes.Clone(r.payload), 0) // one byte more than the input holds
		}
		_ = WriteFrame(&w, Frame{Type: r.typ, Seq: uint64(i), Payload: full})
		if r.badCRC {
			w.Bytes()[start+20] ^= 1
		}
		if r.truncated {
			w.Truncate(w.Len() - 1)
		}
	}
	return w.Bytes()
}

// outcome is what a run of Recv calls until the first error gives.
type outcome struct {
	msgs   []string // each message as json.RawMessage
	end    string   // "eof", "remote: <msg>" or "error"
	reason string   // why the reference model expects end (for failures)
}

// fuzzLimit is the bound on a reassembled message in the fuzz test, low
// enough that a script of a few records crosses it.
const fuzzLimit = 600

// model is the reference: what Recv must do with the records.
func model(recs []fuzzRecord) outcome {
	var o outcome
	fail := func(why string) outcome { o.end, o.reason = "error", why; return o }
	valid := func(r fuzzRecord) bool {
		return !r.truncated && !r.badCRC && r.typ >= FrameControl && r.typ <= FrameControlMore
	}
	decode := func(msg []byte) bool {
		var raw json.RawMessage
		if json.Unmarshal(msg, &raw) != nil {
			return false
		}
		o.msgs = append(o.msgs, string(raw))
		return true
	}
	for i := 0; ; {
		if i == len(recs) {
			o.end = "eof"
			return o
		}
		r := recs[i]
		i++
		if !valid(r) {
			return fail("bad frame")
		}
		switch r.typ {
		case FrameError:
			o.end = "remote: " + string(r.payload)
			return o
		case FrameData, FrameEnd:
			return fail("stream frame for Recv")
		case FrameControl:
			if !decode(r.payload) {
				return fail("bad JSON")
			}
			continue
		}
		// FrameControlMore: collect up to a FrameControl.
		var msg []byte
		for {
			if len(r.payload) == 0 && r.typ == FrameControlMore {
				return fail("empty continuation")
			}
			if len(msg)+len(r.payload) > fuzzLimit {
				return fail("bound")
			}
			msg = append(msg, r.payload...)
			if r.typ == FrameControl {
				break
			}
			if i == len(recs) {
				return fail("cut short")
			}
			r = recs[i]
			i++
			if !valid(r) {
				return fail("bad frame mid-message")
			}
			switch r.typ {
			case FrameError:
				o.end = "remote: " + string(r.payload)
				return o
			case FrameData, FrameEnd:
				return fail("stream frame mid-message")
			}
		}
		if !decode(msg) {
			return fail("bad JSON")
		}
	}
}

// FuzzChannelRecv runs Recv over scripted peers' frames (any order of
// control, continuation, data, end and error frames, with bad checksums
// and a truncated end) and compares what it returns with a reference
// model of reassembly.
func FuzzChannelRecv(f *testing.F) {
	rec := func(t FrameType, p string) []byte { return append([]byte{byte(t), byte(len(p))}, p...) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	f.Add(cat(rec(FrameControl, `{"kind":"x"}`)))
	f.Add(cat(rec(FrameControlMore, `{"kind"`), rec(FrameControlMore, `:`), rec(FrameControl, `"x"}`), rec(FrameControl, `7`)))
	f.Add(cat(rec(FrameControlMore, `[1,`), rec(FrameData, `x`), rec(FrameControl, `2]`)))
	f.Add(cat(rec(FrameControlMore, `[1,`), rec(FrameError, `disk full`)))
	f.Add(cat(rec(FrameControlMore, `[1,`), rec(FrameControlMore, ``), rec(FrameControl, `2]`)))
	f.Add(cat(rec(FrameControlMore, `[1,`), []byte{byte(FrameControl), 9, '2'}))
	f.Add(cat(rec(FrameControlMore, `"`+string(bytes.Repeat([]byte("a"), 250))), rec(FrameControlMore, string(bytes.Repeat([]byte("b"), 250))), rec(FrameControl, string(bytes.Repeat([]byte("c"), 250))+`"`)))
	f.Add(cat(rec(FrameControlMore|0x80, `[1,`), rec(FrameControl, `2]`)))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs := parseScript(b)
		want := model(recs)
		ch := readChannel(encodeScript(recs))
		ch.maxControl = fuzzLimit
		var got outcome
		for {
			var raw json.RawMessage
			err := ch.Recv(&raw)
			if err == nil {
				got.msgs = append(got.msgs, string(raw))
				continue
			}
			switch {
			case errors.Is(err, io.EOF):
				got.end = "eof"
			case IsRemote(err):
				got.end = "remote: " + err.Error()
			default:
				got.end = "error"
			}
			if len(got.msgs) != len(want.msgs) || got.end != want.end {
				t.Fatalf("Recv gave %d messages then %q (%v); the model %d messages then %q (%s)", len(got.msgs), got.end, err, len(want.msgs), want.end, want.reason)
			}
			for i := range got.msgs {
				if got.msgs[i] != want.msgs[i] {
					t.Fatalf("message %d: %q, want %q", i, got.msgs[i], want.msgs[i])
				}
			}
			return
		}
	})
}

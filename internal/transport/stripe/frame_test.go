package stripe

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func alloc(n int) []byte { return make([]byte, n) }

func encodeFrame(typ frameType, num uint64, payload []byte) []byte {
	b := make([]byte, hdrLen+len(payload))
	copy(b[hdrLen:], payload)
	putHeader(b, typ, num, payload)
	return b
}

func TestFrameRejects(t *testing.T) {
	good := encodeFrame(frameData, 7, []byte("hello"))
	if f, err := readFrame(bytes.NewReader(good), alloc); err != nil || f.typ != frameData || f.num != 7 || string(f.payload) != "hello" {
		t.Fatalf("valid frame: %+v, %v", f, err)
	}
	corrupt := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	cases := map[string][]byte{
		"empty":        nil,
		"short header": good[:10],
		"short data":   good[:len(good)-1],
		"bad type":     corrupt(0, 9),
		"bad version":  corrupt(1, 2),
		"reserved":     corrupt(2, 1),
		"bad crc":      corrupt(hdrLen, 'j'),
		"huge":         corrupt(4, 0xff),
		"empty data":   encodeFrame(frameData, 1, nil),
		"ack payload":  encodeFrame(frameAck, 1, []byte("x")),
	}
	for name, b := range cases {
		if _, err := readFrame(bytes.NewReader(b), alloc); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := readFrame(bytes.NewReader(good[:len(good)-1]), alloc); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated: %v", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(encodeFrame(frameData, 0, []byte("chunk")))
	f.Add(encodeFrame(frameAck, 1<<40, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := readFrame(bytes.NewReader(data), alloc)
		if err != nil {
			return
		}
		if len(fr.payload) > maxPayload {
			t.Fatalf("payload of %d bytes accepted", len(fr.payload))
		}
		// A frame that decodes must be exactly what encoding it produces.
		enc := encodeFrame(fr.typ, fr.num, fr.payload)
		if !bytes.Equal(enc, data[:len(enc)]) {
			t.Fatalf("re-encoding differs:\n%x\n%x", enc, data[:len(enc)])
		}
	})
}

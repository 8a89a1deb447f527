package pages

import (
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"math/bits"
)

// MaxDelta is the size from which a delta is not worth it: EncodeDelta gives
// up and the caller sends the whole page.
const MaxDelta = PageSize * 3 / 4

// A delta is the XOR of the old and the new page, run-length encoded as a
// sequence of pairs
//
//	uvarint(zero bytes to skip) uvarint(n >= 1) n literal XOR bytes
//
// up to the last changed byte; what follows it is unchanged. An empty delta
// means an unchanged page. Varints are at most 2 bytes (values < 16384) and
// minimal.

// litGap is the shortest zero run worth ending a literal for: a new pair
// costs two header bytes, so gaps of up to 2 zero bytes are cheaper inline.
const litGap = 3

// EncodeDelta encodes how updated differs from old (both PageSize bytes), reusing
// dst's storage. ok is false when the delta would take MaxDelta bytes or more
// (or the sizes are wrong): send the page whole then.
func EncodeDelta(old, updated []byte, dst []byte) (out []byte, ok bool) {
	out = dst[:0]
	if len(old) != PageSize || len(updated) != PageSize {
		return out, false
	}
	var x [PageSize]byte
	subtle.XORBytes(x[:], old, updated)
	pos := 0
	for {
		start := pos + zeroPrefix(x[pos:])
		if start == PageSize {
			return out, true
		}
		end := literalEnd(&x, start)
		out = appendVarint2(out, start-pos)
		out = appendVarint2(out, end-start)
		out = append(out, x[start:end]...)
		if len(out) >= MaxDelta {
			return dst[:0], false
		}
		pos = end
	}
}

// zeroPrefix counts the leading zero bytes of b, a word at a time.
func zeroPrefix(b []byte) int {
	n := 0
	for len(b) >= 8 {
		if w := binary.LittleEndian.Uint64(b); w != 0 {
			return n + bits.TrailingZeros64(w)/8
		}
		n += 8
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return n
		}
		n++
	}
	return n
}

// literalEnd returns where the literal that starts at x[start] (non-zero)
// ends: at the first run of litGap zero bytes, or at trailing zeros.
func literalEnd(x *[PageSize]byte, start int) int {
	i := start
	for i < PageSize {
		if x[i] != 0 {
			i++
			continue
		}
		j := i
		for j < PageSize && x[j] == 0 && j-i < litGap {
			j++
		}
		if j-i >= litGap || j == PageSize {
			return i
		}
		i = j
	}
	return i
}

func appendVarint2(b []byte, v int) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return append(b, byte(v)|0x80, byte(v>>7))
}

// readVarint2 decodes a minimal varint of at most two bytes.
func readVarint2(b []byte) (v int, n int, err error) {
	if len(b) == 0 {
		return 0, 0, errDelta
	}
	if b[0] < 0x80 {
		return int(b[0]), 1, nil
	}
	if len(b) < 2 || b[1] == 0 || b[1] >= 0x80 {
		return 0, 0, errDelta
	}
	return int(b[0]&0x7f) | int(b[1])<<7, 2, nil
}

var errDelta = errors.New("pages: malformed delta")

// ApplyDelta rebuilds the new page from old and a delta made by EncodeDelta,
// reusing dst's storage (which must not overlap delta). Malformed deltas
// give an error.
func ApplyDelta(old []byte, delta []byte, dst []byte) ([]byte, error) {
	if len(old) != PageSize {
		return nil, errors.New("pages: ApplyDelta: old page has the wrong size")
	}
	out := append(dst[:0], old...)
	pos := 0
	for len(delta) > 0 {
		skip, n, err := readVarint2(delta)
		if err != nil {
			return nil, err
		}
		delta = delta[n:]
		lit, n, err := readVarint2(delta)
		if err != nil {
			return nil, err
		}
		delta = delta[n:]
		if lit == 0 || skip > PageSize-pos || lit > PageSize-pos-skip || lit > len(delta) {
			return nil, errDelta
		}
		pos += skip
		subtle.XORBytes(out[pos:pos+lit], out[pos:pos+lit], delta[:lit])
		pos += lit
		delta = delta[lit:]
	}
	return out, nil
}

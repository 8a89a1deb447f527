package labtool

import (
	"crypto/md5"
	"encoding/binary"
	"math/rand/v2"

	"github.com/zeebo/xxh3"
)

// valueAlphabet keeps values printable: they go into Redis strings,
// memcached items, MQTT payloads and Postgres text columns alike.
const valueAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// value is the n bytes a key holds: derived from the key alone, so that a
// check needs nothing but the key to know what must be there.
func value(key string, n int) []byte {
	h := xxh3.HashString128(key)
	src := rand.NewPCG(h.Hi, h.Lo)
	out := make([]byte, n)
	for i := 0; i < n; {
		r := src.Uint64()
		for j := 0; j < 8 && i < n; j, i = j+1, i+1 {
			out[i] = valueAlphabet[byte(r>>(8*j))&63]
		}
	}
	return out
}

// rowHash is the number Postgres computes for a row's payload in its
// checksum query (the first 32 bits of md5, unsigned), so that the client
// can sum what it expects without reading the rows back.
func rowHash(payload []byte) int64 {
	sum := md5.Sum(payload)
	return int64(binary.BigEndian.Uint32(sum[:4]))
}

// rowHashSQL is rowHash in SQL, for a text column named payload.
const rowHashSQL = `('x' || lpad(substr(md5(payload), 1, 8), 16, '0'))::bit(64)::bigint`

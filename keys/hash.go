package keys

import (
	"crypto/sha256"
	"encoding/binary"
)

// nsHashPrefix is the version tag that starts every namespaced hash input.
// Changing it (or anything else in nsHashInput) changes every namespaced key:
// the derivation is frozen, and a new one would get a new tag ("pgxlock:v2").
const nsHashPrefix = "pgxlock:v1\x00"

// HashInt64 returns the first 8 bytes of SHA-256(s) read as a big-endian
// signed int64: the value of Node's
// createHash('sha256').update(s).digest().readBigInt64BE(0) and of
// PostgreSQL's ('x' || left(encode(sha256(convert_to(s,'UTF8')),'hex'),16))::bit(64)::bigint.
//
// The bytes of the Go string are hashed as they are, with no Unicode
// normalization: precomposed "é" (U+00E9) and "e" + U+0301 give different
// values. The empty string is valid input (SHA-256 of no bytes).
func HashInt64(s string) int64 {
	sum := sha256.Sum256([]byte(s))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// Hash returns the SpaceInt64 key Int64(HashInt64(s)). Hash("") is a valid
// key. The key does not keep s, and its String shows only the number.
func Hash(s string) Key { return Int64(HashInt64(s)) }

// nsHashInput returns the domain-separated byte string hashed by
// Namespace.Hash:
//
//	"pgxlock:v1" | 0x00 | id as 4 bytes, big-endian two's complement | 0x00 | s
//
// Every part before s has a fixed length, so distinct (id, s) give distinct
// inputs.
func nsHashInput(id int32, s string) []byte {
	b := make([]byte, 0, len(nsHashPrefix)+5+len(s))
	b = append(b, nsHashPrefix...)
	b = binary.BigEndian.AppendUint32(b, uint32(id))
	b = append(b, 0)
	return append(b, s...)
}

func nsHashInt64(id int32, s string) int64 {
	sum := sha256.Sum256(nsHashInput(id, s))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

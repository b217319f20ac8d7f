package keys

import (
	"fmt"
	"strconv"
)

// Space is one of PostgreSQL's two advisory-lock key spaces. Its value is the
// objsubid that pg_locks shows for a lock in that space.
type Space uint8

const (
	// SpaceInt64 is the single-bigint space: pg_advisory_lock(bigint).
	SpaceInt64 Space = 1
	// SpacePair is the two-int4 space: pg_advisory_lock(int4, int4).
	SpacePair Space = 2
)

// String returns "int64", "pair", or "Space(N)" for any other value.
func (s Space) String() string {
	switch s {
	case SpaceInt64:
		return "int64"
	case SpacePair:
		return "pair"
	default:
		return "Space(" + strconv.Itoa(int(s)) + ")"
	}
}

// Key is an advisory-lock key in one of the two key spaces. It is a small
// comparable value: == and map keys work, and two Keys are equal exactly when
// they name the same PostgreSQL lock. Int64(x) and Pair(a, b) are never equal,
// whatever the numbers, because PostgreSQL keeps the spaces apart.
//
// The zero Key is invalid (IsZero reports true): Int64, Pair, Hash and a
// registered Namespace never return it; it comes only from calls that also
// return an error, from Namespace.Key on the zero Namespace, and from
// declaring a Key without a value. Lock functions reject it.
type Key struct {
	space Space
	// v holds the 64 bits PostgreSQL shows as classid<<32 | objid: the bigint
	// itself for SpaceInt64, and uint32(a)<<32 | uint32(b) for SpacePair.
	v int64
}

// Int64 returns the key for pg_advisory_lock(bigint) with argument v.
func Int64(v int64) Key { return Key{space: SpaceInt64, v: v} }

// Pair returns the key for pg_advisory_lock(int4, int4) with arguments a, b.
func Pair(a, b int32) Key {
	return Key{space: SpacePair, v: int64(uint64(uint32(a))<<32 | uint64(uint32(b)))}
}

// Space returns the key's space; 0 for the zero Key.
func (k Key) Space() Space { return k.space }

// IsZero reports whether k is the zero Key, which names no lock.
func (k Key) IsZero() bool { return k.space == 0 }

// Int64 returns the bigint argument of a SpaceInt64 key; ok is false for any
// other key (including the zero Key), and v is then 0.
func (k Key) Int64() (v int64, ok bool) {
	if k.space != SpaceInt64 {
		return 0, false
	}
	return k.v, true
}

// Pair returns the two int4 arguments of a SpacePair key; ok is false for any
// other key (including the zero Key), and a, b are then 0.
func (k Key) Pair() (a, b int32, ok bool) {
	if k.space != SpacePair {
		return 0, 0, false
	}
	a, b = k.pair()
	return a, b, true
}

func (k Key) pair() (a, b int32) { return int32(k.v >> 32), int32(k.v) }

// String formats k for logs and error messages, using numbers only:
//
//	int64:123            a SpaceInt64 key (plain, hashed or namespaced-hashed)
//	pair:7,42            a SpacePair key whose first number is no registered namespace
//	ns:billing(7)/42     a SpacePair key whose first number is a registered namespace
//	<zero>               the zero Key
//
// A key does not retain the string it was hashed from, so String can never
// print it. Pair(7, 42) and a Namespace with id 7 name the same lock and
// print the same.
func (k Key) String() string {
	switch k.space {
	case SpaceInt64:
		return "int64:" + strconv.FormatInt(k.v, 10)
	case SpacePair:
		a, b := k.pair()
		if ns, ok := LookupNamespace(a); ok {
			return ns.String() + "/" + strconv.FormatInt(int64(b), 10)
		}
		return "pair:" + strconv.FormatInt(int64(a), 10) + "," + strconv.FormatInt(int64(b), 10)
	case 0:
		return "<zero>"
	default:
		// Unreachable: space is unexported and set only by this package.
		return fmt.Sprintf("%v:%d", k.space, k.v)
	}
}

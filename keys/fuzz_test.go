package keys_test

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/pgxlock/pgxlock/keys"
)

// FuzzKeys checks the order (reflexive, antisymmetric, transitive, consistent
// with == and with signed numeric order), Normalize (sorted, no duplicates,
// same set, idempotent, input untouched) and the pg_locks encoding (PgLocks
// and FromPgLocks are inverse for arbitrary int64 and int32 pairs; any other
// objsubid is ErrInvalid) on three fuzzed keys.
//
// Bits 0-2 of spaces put key i in SpacePair (else SpaceInt64); bit 3 makes
// the first key the zero Key.
//
//	go test ./keys -run '^$' -fuzz=FuzzKeys -fuzztime=30s
func FuzzKeys(f *testing.F) {
	edges := []int64{0, 1, -1, math.MinInt64, math.MaxInt64, 1 << 32, -(1 << 32), 0x7fffffff, 0x80000000, 0xffffffff}
	for i, x := range edges {
		y, z := edges[(i+3)%len(edges)], edges[(i+7)%len(edges)]
		f.Add(x, y, z, uint8(i), int16(i%4))
		f.Add(x, x, y, uint8(0b0111), int16(2))
		f.Add(x, z, x, uint8(0b1000|i), int16(257))
	}
	f.Fuzz(func(t *testing.T, x, y, z int64, spaces uint8, objsubid int16) {
		mk := func(i uint, v int64) keys.Key {
			if spaces&(1<<i) != 0 {
				return keys.Pair(int32(v>>32), int32(v))
			}
			return keys.Int64(v)
		}
		ks := []keys.Key{mk(0, x), mk(1, y), mk(2, z)}
		if spaces&8 != 0 {
			ks[0] = keys.Key{}
		}

		for _, a := range ks {
			if keys.Compare(a, a) != 0 {
				t.Fatalf("Compare(%v, %v) != 0", a, a)
			}
			for _, b := range ks {
				c := keys.Compare(a, b)
				if c < -1 || c > 1 || c != -keys.Compare(b, a) || (c == 0) != (a == b) {
					t.Fatalf("Compare(%v, %v) = %d, reverse %d", a, b, c, keys.Compare(b, a))
				}
				if ref := refCompare(a, b); c != ref {
					t.Fatalf("Compare(%v, %v) = %d, reference order says %d", a, b, c, ref)
				}
				for _, d := range ks {
					if c <= 0 && keys.Compare(b, d) <= 0 && keys.Compare(a, d) > 0 {
						t.Fatalf("not transitive: %v <= %v <= %v but %v > %v", a, b, d, a, d)
					}
				}
			}
		}

		in := []keys.Key{ks[2], ks[0], ks[1], ks[0], ks[2], ks[2]}
		orig := slices.Clone(in)
		n := keys.Normalize(in)
		if !slices.Equal(in, orig) {
			t.Fatalf("Normalize modified its input")
		}
		for i := 1; i < len(n); i++ {
			if keys.Compare(n[i-1], n[i]) >= 0 {
				t.Fatalf("Normalize = %v: not strictly increasing at %d", n, i)
			}
		}
		for _, k := range in {
			if !slices.Contains(n, k) {
				t.Fatalf("Normalize = %v lost %v", n, k)
			}
		}
		for _, k := range n {
			if !slices.Contains(in, k) {
				t.Fatalf("Normalize = %v invented %v", n, k)
			}
		}
		if again := keys.Normalize(n); !slices.Equal(again, n) {
			t.Fatalf("Normalize not idempotent: %v then %v", n, again)
		}

		for _, k := range ks {
			c, o, s := k.PgLocks()
			back, err := keys.FromPgLocks(c, o, s)
			if k.IsZero() {
				if err == nil || !back.IsZero() {
					t.Fatalf("zero Key PgLocks (%d, %d, %d) decoded to %v, %v", c, o, s, back, err)
				}
			} else if err != nil || back != k {
				t.Fatalf("FromPgLocks(%v.PgLocks()) = %v, %v", k, back, err)
			}
			_ = k.String()
		}

		// pg_locks rows written out from PostgreSQL's documented layout.
		if k, err := keys.FromPgLocks(uint32(uint64(x)>>32), uint32(x), 1); err != nil || k != keys.Int64(x) {
			t.Fatalf("bigint %d: FromPgLocks = %v, %v", x, k, err)
		}
		if s := keys.Int64(x).String(); s != "int64:"+strconv.FormatInt(x, 10) {
			t.Fatalf("Int64(%d).String() = %q", x, s)
		}
		a, b := int32(y>>32), int32(y)
		if k, err := keys.FromPgLocks(uint32(a), uint32(b), 2); err != nil || k != keys.Pair(a, b) {
			t.Fatalf("pair (%d, %d): FromPgLocks = %v, %v", a, b, k, err)
		}

		k, err := keys.FromPgLocks(uint32(z>>32), uint32(z), objsubid)
		switch objsubid {
		case 1, 2:
			if err != nil || k.Space() != keys.Space(objsubid) {
				t.Fatalf("FromPgLocks(_, _, %d) = %v, %v", objsubid, k, err)
			}
		default:
			if !errors.Is(err, keys.ErrInvalid) || !k.IsZero() {
				t.Fatalf("FromPgLocks(_, _, %d) = %v, %v; want ErrInvalid", objsubid, k, err)
			}
		}
	})
}

// refCompare is the order written out from its definition, independently of
// the packed representation: space, then signed values.
func refCompare(a, b keys.Key) int {
	if c := cmp.Compare(a.Space(), b.Space()); c != 0 {
		return c
	}
	if av, ok := a.Int64(); ok {
		bv, _ := b.Int64()
		return cmp.Compare(av, bv)
	}
	a1, a2, _ := a.Pair()
	b1, b2, _ := b.Pair()
	return cmp.Or(cmp.Compare(a1, b1), cmp.Compare(a2, b2))
}

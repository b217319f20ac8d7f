package keys_test

import (
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/pgxlock/pgxlock/keys"
)

func TestInt64Key(t *testing.T) {
	for _, v := range []int64{0, 1, -1, 42, 1 << 32, -(1 << 32), math.MaxInt64, math.MinInt64} {
		k := keys.Int64(v)
		if k.IsZero() || k.Space() != keys.SpaceInt64 {
			t.Errorf("Int64(%d): IsZero=%v Space=%v", v, k.IsZero(), k.Space())
		}
		if got, ok := k.Int64(); !ok || got != v {
			t.Errorf("Int64(%d).Int64() = %d, %v", v, got, ok)
		}
		if a, b, ok := k.Pair(); ok || a != 0 || b != 0 {
			t.Errorf("Int64(%d).Pair() = %d, %d, %v; want 0, 0, false", v, a, b, ok)
		}
	}
}

func TestPairKey(t *testing.T) {
	vals := []int32{0, 1, -1, 7, -42, math.MaxInt32, math.MinInt32}
	for _, a := range vals {
		for _, b := range vals {
			k := keys.Pair(a, b)
			if k.IsZero() || k.Space() != keys.SpacePair {
				t.Errorf("Pair(%d, %d): IsZero=%v Space=%v", a, b, k.IsZero(), k.Space())
			}
			if ga, gb, ok := k.Pair(); !ok || ga != a || gb != b {
				t.Errorf("Pair(%d, %d).Pair() = %d, %d, %v", a, b, ga, gb, ok)
			}
			if v, ok := k.Int64(); ok || v != 0 {
				t.Errorf("Pair(%d, %d).Int64() = %d, %v; want 0, false", a, b, v, ok)
			}
		}
	}
}

func TestZeroKey(t *testing.T) {
	var k keys.Key
	if !k.IsZero() || k.Space() != 0 {
		t.Errorf("zero Key: IsZero=%v Space=%v", k.IsZero(), k.Space())
	}
	if _, ok := k.Int64(); ok {
		t.Error("zero Key: Int64 ok")
	}
	if _, _, ok := k.Pair(); ok {
		t.Error("zero Key: Pair ok")
	}
	if got := k.String(); got != "<zero>" {
		t.Errorf("zero Key String = %q", got)
	}
	if c, o, s := k.PgLocks(); c != 0 || o != 0 || s != 0 {
		t.Errorf("zero Key PgLocks = %d, %d, %d", c, o, s)
	}
	if keys.Int64(0).IsZero() || keys.Pair(0, 0).IsZero() {
		t.Error("Int64(0) or Pair(0, 0) reported as zero Key")
	}
}

// The same 64 bits in the two spaces are two different PostgreSQL locks (the
// lock tag differs in objsubid), and must be two different Keys.
func TestSpacesNeverCollide(t *testing.T) {
	for _, p := range [][2]int32{{0, 0}, {7, 42}, {-1, -1}, {math.MinInt32, 1}} {
		pk := keys.Pair(p[0], p[1])
		ik := keys.Int64(int64(p[0])<<32 | int64(uint32(p[1])))
		if pk == ik || keys.Compare(pk, ik) == 0 {
			t.Errorf("Pair%v == %v", p, ik)
		}
		pc, po, ps := pk.PgLocks()
		ic, io, is := ik.PgLocks()
		if pc != ic || po != io || ps != 2 || is != 1 {
			t.Errorf("PgLocks: pair (%d,%d,%d), int64 (%d,%d,%d)", pc, po, ps, ic, io, is)
		}
	}
}

func TestSpaceString(t *testing.T) {
	for s, want := range map[keys.Space]string{0: "Space(0)", keys.SpaceInt64: "int64", keys.SpacePair: "pair", 9: "Space(9)"} {
		if got := s.String(); got != want {
			t.Errorf("Space(%d).String() = %q, want %q", uint8(s), got, want)
		}
	}
}

func TestKeyString(t *testing.T) {
	ns, err := keys.RegisterNamespace(3001, "strings-test")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		k    keys.Key
		want string
	}{
		{keys.Int64(123), "int64:123"},
		{keys.Int64(-1), "int64:-1"},
		{keys.Int64(math.MinInt64), "int64:-9223372036854775808"},
		{keys.Pair(7, 42), "ns:billing(7)/42"},                  // 7 is a golden namespace
		{keys.Pair(3002, 42), "pair:3002,42"},                   // 3002 is never registered
		{keys.Pair(math.MinInt32+1, -1), "pair:-2147483647,-1"}, // never registered
		{ns.Key(-5), "ns:strings-test(3001)/-5"},
		{keys.Hash(""), "int64:-2039914840885289964"},
	}
	goldenNamespace(t, 7)
	for _, c := range cases {
		if got := c.k.String(); got != c.want {
			t.Errorf("String() = %q, want %q", got, c.want)
		}
	}
}

// A hashed key's String is a number and nothing else, so logging a key can
// never leak the (possibly personal) string it came from.
func TestStringNeverShowsSource(t *testing.T) {
	numeric := regexp.MustCompile(`^int64:-?[0-9]+$`)
	ns := goldenNamespace(t, 1001)
	sources := []string{"user@example.com", "CPF 123.456.789-00", "Maria José da Silva", "tenant:acme", "🔒", "migrations"}
	for _, g := range hashGoldens {
		sources = append(sources, g.s)
	}
	for _, s := range sources {
		shown := []string{keys.Hash(s).String()}
		if nk, err := ns.Hash(s); err == nil {
			shown = append(shown, nk.String())
		}
		for _, out := range shown {
			if !numeric.MatchString(out) {
				t.Errorf("String of a key hashed from %+q = %q, not int64:<number>", s, out)
			}
			// Digits-only sources such as "123" can occur inside a number by chance.
			if strings.Trim(s, "-0123456789") != "" && strings.Contains(out, s) {
				t.Errorf("String %q contains its source %+q", out, s)
			}
		}
	}
}

package keys_test

import (
	"errors"
	"math"
	"testing"

	"github.com/pgxlock/pgxlock/keys"
)

// Rows as pg_locks shows them (checked against a live server in
// TestPgLocksRoundTrip).
func TestFromPgLocks(t *testing.T) {
	cases := []struct {
		classid, objid uint32
		objsubid       int16
		want           keys.Key
	}{
		{0, 0, 1, keys.Int64(0)},
		{0, 1, 1, keys.Int64(1)},
		{1, 0, 1, keys.Int64(1 << 32)},
		{0xffffffff, 0xffffffff, 1, keys.Int64(-1)},
		{0xffffffff, 0, 1, keys.Int64(-(1 << 32))},
		{0x80000000, 0, 1, keys.Int64(math.MinInt64)},
		{0x7fffffff, 0xffffffff, 1, keys.Int64(math.MaxInt64)},
		{0xe3b0c442, 0x98fc1c14, 1, keys.Hash("")},
		{0, 0, 2, keys.Pair(0, 0)},
		{7, 42, 2, keys.Pair(7, 42)},
		{0xffffffff, 0xffffffff, 2, keys.Pair(-1, -1)},
		{0x80000000, 0x7fffffff, 2, keys.Pair(math.MinInt32, math.MaxInt32)},
		{7, 0xffffffd6, 2, keys.Pair(7, -42)},
	}
	for _, c := range cases {
		got, err := keys.FromPgLocks(c.classid, c.objid, c.objsubid)
		if err != nil || got != c.want {
			t.Errorf("FromPgLocks(%d, %d, %d) = %v, %v; want %v", c.classid, c.objid, c.objsubid, got, err, c.want)
		}
		cl, ob, sub := c.want.PgLocks()
		if cl != c.classid || ob != c.objid || sub != c.objsubid {
			t.Errorf("%v.PgLocks() = %d, %d, %d; want %d, %d, %d", c.want, cl, ob, sub, c.classid, c.objid, c.objsubid)
		}
	}
}

func TestFromPgLocksInvalid(t *testing.T) {
	// 257 and -255 truncate to 1 as uint8; they must not be mistaken for it.
	for _, sub := range []int16{0, 3, -1, 257, 258, -255, -254, math.MaxInt16, math.MinInt16} {
		k, err := keys.FromPgLocks(1, 2, sub)
		if !errors.Is(err, keys.ErrInvalid) || !k.IsZero() {
			t.Errorf("FromPgLocks(1, 2, %d) = %v, %v; want zero Key, ErrInvalid", sub, k, err)
		}
	}
}

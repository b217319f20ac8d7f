package keys

import (
	"cmp"
	"slices"
)

// Compare orders keys totally: by Space first (the zero Key, Space 0, sorts
// before every valid key; SpaceInt64 before SpacePair), then by value as
// signed integers: the bigint for SpaceInt64, a then b for SpacePair. It
// returns -1, 0 or +1, and 0 exactly when a == b.
//
// Multi-key locking acquires keys in this order, so the order is part of the
// contract: every process that locks several keys of one database in one
// call, in any language, must use the same one to stay free of deadlocks.
func Compare(a, b Key) int {
	if c := cmp.Compare(a.space, b.space); c != 0 {
		return c
	}
	if a.space == SpacePair {
		a1, a2 := a.pair()
		b1, b2 := b.pair()
		if c := cmp.Compare(a1, b1); c != 0 {
			return c
		}
		return cmp.Compare(a2, b2)
	}
	return cmp.Compare(a.v, b.v)
}

// Sort sorts ks in place by Compare.
func Sort(ks []Key) { slices.SortFunc(ks, Compare) }

// Normalize returns a sorted copy of ks without duplicates; ks is not
// modified. It returns nil when ks is empty. Zero Keys are kept, not dropped:
// at most one remains, at index 0, so a caller rejects them with one check.
func Normalize(ks []Key) []Key {
	if len(ks) == 0 {
		return nil
	}
	out := slices.Clone(ks)
	Sort(out)
	return slices.Compact(out)
}

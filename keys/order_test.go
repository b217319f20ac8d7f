package keys_test

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pgxlock/pgxlock/keys"
)

// ordered lists keys in strictly increasing Compare order.
var ordered = []keys.Key{
	{}, // the zero Key sorts first
	keys.Int64(math.MinInt64),
	keys.Int64(-(1 << 32)),
	keys.Int64(-1),
	keys.Int64(0),
	keys.Int64(1),
	keys.Int64(1 << 32),
	keys.Int64(math.MaxInt64),
	keys.Pair(math.MinInt32, math.MinInt32),
	keys.Pair(math.MinInt32, -1),
	keys.Pair(math.MinInt32, math.MaxInt32),
	keys.Pair(-1, math.MinInt32),
	keys.Pair(-1, 0),
	keys.Pair(0, math.MinInt32),
	keys.Pair(0, -1), // signed: -1 before 0, although its bit pattern is larger
	keys.Pair(0, 0),
	keys.Pair(0, 1),
	keys.Pair(1, -1),
	keys.Pair(math.MaxInt32, math.MinInt32),
	keys.Pair(math.MaxInt32, math.MaxInt32),
}

func TestCompare(t *testing.T) {
	for i, a := range ordered {
		for j, b := range ordered {
			if got, want := keys.Compare(a, b), cmp.Compare(i, j); got != want {
				t.Errorf("Compare(%v, %v) = %d, want %d", a, b, got, want)
			}
		}
	}
}

func TestSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		ks := slices.Clone(ordered)
		r.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
		keys.Sort(ks)
		if !slices.Equal(ks, ordered) {
			t.Fatalf("Sort = %v, want %v", ks, ordered)
		}
	}
}

func TestNormalize(t *testing.T) {
	in := []keys.Key{
		keys.Pair(0, 0), keys.Int64(5), {}, keys.Hash("a"), keys.Int64(5),
		keys.Pair(0, 0), {}, keys.Hash("a"), keys.Int64(-5), keys.Pair(-3, 9),
	}
	orig := slices.Clone(in)
	got := keys.Normalize(in)
	want := []keys.Key{{}, keys.Hash("a"), keys.Int64(-5), keys.Int64(5), keys.Pair(-3, 9), keys.Pair(0, 0)}
	if !slices.Equal(got, want) {
		t.Errorf("Normalize = %v, want %v", got, want)
	}
	if !slices.Equal(in, orig) {
		t.Errorf("Normalize modified its input: %v", in)
	}
	got[1] = keys.Int64(99)
	if !slices.Equal(in, orig) {
		t.Error("Normalize result aliases its input")
	}
	if got := keys.Normalize(nil); got != nil {
		t.Errorf("Normalize(nil) = %v", got)
	}
	if got := keys.Normalize([]keys.Key{}); got != nil {
		t.Errorf("Normalize(empty) = %v", got)
	}
	one := []keys.Key{keys.Int64(1)}
	if got := keys.Normalize(one); !slices.Equal(got, one) {
		t.Errorf("Normalize(%v) = %v", one, got)
	}
}

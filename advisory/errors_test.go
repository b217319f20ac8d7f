package advisory_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// Regression (issue 10 item 6): keys were joined with commas, which pair
// keys contain too: "pair:0,-1,pair:1,-1" read as three or four keys.
func TestLockErrorPrintsKeysUnambiguously(t *testing.T) {
	err := &advisory.LockError{Op: "lock", Keys: []keys.Key{keys.Pair(0, -1), keys.Pair(1, -1)}, Err: advisory.ErrLockTimeout}
	assert.Equal(t, "advisory: lock [pair:0,-1 pair:1,-1]: lock timeout", err.Error())
	err = &advisory.LockError{Op: "try-lock", Keys: []keys.Key{keys.Int64(5)}, Err: advisory.ErrNotAcquired}
	assert.Equal(t, "advisory: try-lock int64:5: lock not acquired", err.Error())
	err = &advisory.LockError{Op: "lock", Err: advisory.ErrInvalid}
	assert.Equal(t, "advisory: lock: invalid input", err.Error())
}

// LockError's doc: of more than 16 keys the first 16 print, then "+N
// more"; Keys keeps them all (review 30h: a 300,000-key call's error was
// 3.7 MB of text).
func TestLockErrorNamesAtMost16Keys(t *testing.T) {
	ks := make([]keys.Key, 300000)
	for i := range ks {
		ks[i] = keys.Int64(int64(i))
	}
	err := &advisory.LockError{Op: "try-lock", Keys: ks, Err: advisory.ErrTooManyLocks}
	want := "advisory: try-lock [int64:0 int64:1 int64:2 int64:3 int64:4 int64:5 int64:6 int64:7 int64:8 int64:9 " +
		"int64:10 int64:11 int64:12 int64:13 int64:14 int64:15 +299984 more]: "
	assert.Equal(t, want, err.Error()[:len(want)])
	assert.Len(t, err.Keys, 300000)
	err.Keys = ks[:16]
	assert.NotContains(t, err.Error(), "more")
}

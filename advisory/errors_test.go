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

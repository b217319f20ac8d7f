package advisory_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The zero-Key error names the argument's position and says the Key was never set: it
// must not read like a complaint about the value 0, which is a valid key.
func TestZeroKeyErrorNamesPositionNotValue(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	err := l.WithXactLockAll(ctx, []keys.Key{key(t), {}}, nil, func(context.Context, pgx.Tx) error { return nil })
	require.ErrorIs(t, err, advisory.ErrInvalid)
	assert.Contains(t, err.Error(), "keys[1] is the zero keys.Key (no key was set")
	assert.NotContains(t, err.Error(), "key 1 is")
	assert.False(t, keys.Int64(0).IsZero(), "the value 0 is a valid key")
}

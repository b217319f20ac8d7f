package lease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// Issue 11 item 6 (seed 003): a holder of a Shared lease that wants
// Exclusive waited on itself until its context ended. TryUpgrade upgrades
// the only reader at once, and refuses at once (never deadlocks) while any
// other holder is live, including two readers that both try to upgrade.
func TestTryUpgradeOnlyReaderAtOnce(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute})
	shared := &lease.AcquireOptions{Mode: lease.Shared}

	a, err := m1.TryAcquire(ctx, "only", shared)
	require.NoError(t, err)
	require.NoError(t, a.TryUpgrade(ctx), "the only reader upgrades")
	assert.Equal(t, lease.Exclusive, a.Mode())
	assert.Equal(t, lease.Exclusive, a.Ref().Mode)
	_, err = m2.TryAcquire(ctx, "only", shared)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "readers are now shut out")
	_, err = m2.TryAcquire(ctx, "only", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "and writers")
	hs, err := m2.List(ctx, &lease.ListOptions{Resource: "only"})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, lease.Exclusive, hs[0].Mode)
	assert.Equal(t, a.Token(), hs[0].Token)
	require.NoError(t, a.Renew(ctx))
	require.ErrorIs(t, a.TryUpgrade(ctx), lease.ErrInvalid, "already exclusive")
	require.NoError(t, a.Release(ctx))
	require.ErrorIs(t, a.Release(ctx), lease.ErrLeaseLost)

	b, err := m1.TryAcquire(ctx, "two", shared)
	require.NoError(t, err)
	c, err := m2.TryAcquire(ctx, "two", shared)
	require.NoError(t, err)
	require.ErrorIs(t, b.TryUpgrade(ctx), lease.ErrNotAcquired, "another reader is live")
	require.ErrorIs(t, c.TryUpgrade(ctx), lease.ErrNotAcquired, "two upgraders: both refused at once")
	assert.Equal(t, lease.Shared, b.Mode())
	require.NoError(t, b.Release(ctx))
	require.NoError(t, c.TryUpgrade(ctx), "the remaining reader upgrades")
	require.NoError(t, c.Release(ctx))

	require.ErrorIs(t, b.TryUpgrade(ctx), lease.ErrLeaseLost, "a released lease cannot upgrade")
	w, err := m1.TryAcquire(ctx, "w", nil)
	require.NoError(t, err)
	require.ErrorIs(t, w.TryUpgrade(ctx), lease.ErrInvalid)
	require.NoError(t, w.Release(ctx))
}

package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// TestForgedModeAfterUnknownUpgradeMatchesRealLease: an exclusive lease's
// Ref edited to Shared, resumed, then a TryUpgrade of it with an unknown
// outcome (ctx ends while the upgrade waits for the resource's row lock).
// Renew and Release then matched the row in either mode, and the upgrade
// SQL accepted any exclusive row as "upgraded": the forged lease renewed and
// released the real holder's lease. An edited mode must match nothing.
func TestForgedModeAfterUnknownUpgradeMatchesRealLease(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	real, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	ref := real.Ref()
	ref.Mode = lease.Shared // the edit
	forged, err := m.Resume(ref)
	require.NoError(t, err)
	require.ErrorIs(t, forged.Renew(ctx), lease.ErrLeaseLost)

	// Hold the resource's counter row, so the upgrade waits, and end its
	// ctx after it was sent: its outcome is unknown.
	tx, err := p1.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+schema+".pgxlock_leases_resources WHERE resource = 'r' FOR UPDATE")
	require.NoError(t, err)
	uctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- forged.TryUpgrade(uctx) }()
	require.Eventually(t, func() bool { // the upgrade waits for the lock on the server
		return queryOne[bool](t, p1, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%pgxlock_leases_resources%')`)
	}, 30*time.Second, 5*time.Millisecond)
	cancel()
	err = <-done
	t.Logf("forged TryUpgrade: %v", err)
	require.Error(t, err)
	require.NoError(t, tx.Rollback(ctx))

	for range 2 { // the second TryUpgrade runs with the first's outcome unknown
		assert.ErrorIs(t, forged.Renew(ctx), lease.ErrLeaseLost, "forged Renew")
		assert.Equal(t, lease.Shared, forged.Mode())
		assert.Error(t, forged.TryUpgrade(ctx), "forged TryUpgrade")
	}
	assert.ErrorIs(t, forged.Release(ctx), lease.ErrLeaseLost, "forged Release")
	require.NoError(t, real.Renew(ctx), "the real holder still holds")
	require.NoError(t, real.Release(ctx))
}

// TestUpgradedLeaseRefMatchesOnlyAfterUpgrade: an upgrade gives the row a
// new lease id. The Ref taken after it (Mode Exclusive) renews and releases
// the upgraded lease; one taken before it, as it was or edited to
// Exclusive, matches nothing.
func TestUpgradedLeaseRefMatchesOnlyAfterUpgrade(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	l, err := m.TryAcquire(ctx, "r", &lease.AcquireOptions{Mode: lease.Shared})
	require.NoError(t, err)
	before := l.Ref()
	require.NoError(t, l.TryUpgrade(ctx))
	after := l.Ref()
	assert.Equal(t, lease.Exclusive, after.Mode)
	assert.NotEqual(t, before.ID, after.ID)

	edited := before
	edited.Mode = lease.Exclusive
	for _, ref := range []lease.Ref{before, edited} {
		f, err := m.Resume(ref)
		require.NoError(t, err)
		assert.ErrorIs(t, f.Renew(ctx), lease.ErrLeaseLost, "%+v", ref)
		assert.ErrorIs(t, f.Release(ctx), lease.ErrLeaseLost, "%+v", ref)
	}
	require.NoError(t, l.Renew(ctx))
	r, err := m.Resume(after)
	require.NoError(t, err)
	require.NoError(t, r.Renew(ctx))
	assert.Equal(t, lease.Exclusive, r.Mode())
	require.NoError(t, r.Release(ctx))
	assert.ErrorIs(t, l.Renew(ctx), lease.ErrLeaseLost)
}

// TestColumnRefIDRespelledNamesSameRow pins the documented behaviour of an
// edited ColumnRef id: the id is compared as the id column's type reads it,
// so another spelling of the same value ("05" for 5 on a bigint column)
// names the same row and, with that row's owner and token, matches; an id
// naming another row matches nothing.
func TestColumnRefIDRespelledNamesSameRow(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	mustExec(t, p1, "CREATE TABLE "+schema+".u (id bigint PRIMARY KEY)")
	mustExec(t, p1, "INSERT INTO "+schema+".u VALUES (5), (6)")
	c, err := lease.NewColumn(p1, lease.ColumnConfig{Schema: schema, Table: "u", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, c.Migrate(ctx))
	l, err := c.TryAcquire(ctx, int64(5))
	require.NoError(t, err)
	for _, id := range []any{"05", " 5", "+5"} {
		ref := l.Ref()
		ref.ID = id
		r, err := c.Resume(ref)
		require.NoError(t, err)
		assert.NoError(t, r.Renew(ctx), "%q names row 5", id)
	}
	ref := l.Ref()
	ref.ID = int64(6)
	r, err := c.Resume(ref)
	require.NoError(t, err)
	assert.ErrorIs(t, r.Renew(ctx), lease.ErrLeaseLost)
	require.NoError(t, l.Release(ctx))
}

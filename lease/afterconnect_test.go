package lease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// ManagerConfig.Schema's doc: empty, the connection's search_path decides;
// one set by a SET in pgxpool's AfterConnect included, which the library's
// resets restore. Review 22: before, the reset after Migrate dropped it:
// the next statement failed with 42P01, and a second Migrate created a
// second set of tables in public, so that one Manager could hand the same
// resource to two holders, one through each table.
func TestManagerFollowsASearchPathSetInAfterConnect(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pgtest.SetOnConnect(cfg, "SET search_path = "+pgx.Identifier{schema}.Sanitize())
	pool := pgtest.NewPool(t, cfg)
	m, err := lease.NewManager(pool, lease.ManagerConfig{TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctx))
	for range 3 {
		l, err := m.TryAcquire(ctx, "r", nil)
		require.NoError(t, err)
		_, err = m.TryAcquire(ctx, "r", nil)
		require.ErrorIs(t, err, lease.ErrNotAcquired, "one holder at a time")
		require.NoError(t, l.Renew(ctx))
		require.NoError(t, l.Release(ctx))
	}
	require.NoError(t, m.Migrate(ctx))
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'pgxlock_leases%' AND schemaname = 'public'`).Scan(&n))
	assert.Zero(t, n, "no lease table in public")
}

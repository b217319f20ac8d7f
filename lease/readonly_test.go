package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// default_transaction_read_only = on (a role or database setting seen on read-mostly
// services) does not stop the lease calls: every one begins READ WRITE. Only Migrate's DDL
// is the caller's to run elsewhere.
func TestDefaultReadOnlySessionsStillLease(t *testing.T) {
	ctx := testCtx(t)
	plain, _, schema := twoPools(t)
	newManager(t, plain, schema, lease.ManagerConfig{TTL: time.Minute})
	usersTable(t, plain, schema, time.Minute, 1)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool := pgtest.NewPool(t, cfg)

	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	l, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	hs, err := m.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	require.NoError(t, l.Release(ctx))
	require.NoError(t, m.TryDo(ctx, "r", nil, func(context.Context, *lease.Lease) error { return nil }))

	c, err := lease.NewColumn(pool, usersConfig(schema, time.Minute))
	require.NoError(t, err)
	columnCycle(ctx, t, c, 1)
}

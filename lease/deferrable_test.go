package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// The package doc's "Isolation and time zones": with serializable, read
// only and deferrable session defaults, pgx's preparation of a statement
// before the frame (its default exec mode, a connection's first use) waits
// for a safe snapshot while a serializable read-write transaction runs,
// which TryLockTimeout does not bound: the call ends with the context's
// error, not ErrNotAcquired.
func TestTryAcquireUnderDeferrableDefaults(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	newManager(t, admin, schema, lease.ManagerConfig{TTL: time.Minute}) // migrated by a plain pool
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			for k, v := range map[string]string{"default_transaction_isolation": "serializable", "default_transaction_read_only": "on", "default_transaction_deferrable": "on"} {
				cfg.ConnConfig.RuntimeParams[k] = v
			}
			pool := pgtest.NewPool(t, cfg)
			// A serializable read-write transaction with a snapshot and a
			// write: a deferrable read-only one waits until it ends (rolled
			// back before the pool's own cleanup, which would wait too).
			blocker, err := admin.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = blocker.Rollback(context.Background()) })
			_, err = blocker.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
			require.NoError(t, err)
			_, err = blocker.Exec(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "pgxlock_leases"}.Sanitize())
			require.NoError(t, err)
			_, err = blocker.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "pgxlock_leases_resources"}.Sanitize()+" (resource) VALUES ('other') ON CONFLICT DO NOTHING")
			require.NoError(t, err)
			m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
			require.NoError(t, err)
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			start := time.Now()
			l, err := m.TryAcquire(tctx, "r-"+mode.String(), nil)
			t.Logf("TryAcquire: %v after %v", err, time.Since(start))
			if err == nil {
				_ = l.Release(ctx)
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, context.DeadlineExceeded), "the context, not TryLockTimeout, ended it: %v", err)
			assert.False(t, errors.Is(err, lease.ErrNotAcquired), "%v", err)
		})
	}
}

package advisory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// A callback that prepares a transaction (two-phase commit) has ended it as
// far as its session is concerned: the call returns its nil, and the
// prepared transaction keeps its transaction locks, the WithXactLock call's
// own key included, until COMMIT PREPARED or ROLLBACK PREPARED (what the
// docs of WithLock and WithXactLock say). The session lock of WithLock is
// released as usual.
func TestCallbackPreparedTransactionKeepsItsLocks(t *testing.T) {
	ctx := testCtx(t)
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pglaunch.Start(sctx, pglaunch.Options{Settings: map[string]string{"max_prepared_transactions": "4"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = c.Stop(ctx)
	})
	cfg, err := pgxpool.ParseConfig(c.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	other, err := pgx.Connect(ctx, c.DSN())
	require.NoError(t, err)
	defer other.Close(context.Background())
	l := newLocker(t, pool, advisory.Config{})
	k, k2 := keys.Int64(pgtest.UniqueInt64(t)), pgtest.UniqueInt64(t)
	free := func(key int64) bool {
		var ok bool
		require.NoError(t, other.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&ok))
		return ok
	}

	err = l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, fmt.Sprintf("BEGIN; SELECT pg_advisory_xact_lock(%d); PREPARE TRANSACTION 'pgxlock_t_1'", k2))
		return err
	})
	require.NoError(t, err)
	v, _ := k.Int64()
	assert.True(t, free(v), "WithLock's session lock is released")
	assert.False(t, free(k2), "the prepared transaction keeps its lock")
	_, err = other.Exec(ctx, "ROLLBACK PREPARED 'pgxlock_t_1'")
	require.NoError(t, err)
	assert.True(t, free(k2))

	err = l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "PREPARE TRANSACTION 'pgxlock_t_2'")
		return err
	})
	require.NoError(t, err)
	assert.False(t, free(v), "the prepared transaction keeps the call's key")
	_, err = other.Exec(ctx, "ROLLBACK PREPARED 'pgxlock_t_2'")
	require.NoError(t, err)
	assert.True(t, free(v))
}

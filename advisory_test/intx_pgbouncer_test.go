package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The in-tx forms through PgBouncer in transaction mode, in both exec modes
// it accepts: the call's statements run inside the caller's transaction, so
// they stay on its server connection; the keys exclude a direct session
// until the caller commits, and a timeout or a busy set leaves the caller's
// transaction usable with its own lock_timeout.
func TestPgBouncerLockInTx(t *testing.T) {
	b := startBouncer(t, 2)
	direct := pgtest.Pool(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			cfg := bouncerConfig(t, b)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{LockTimeout: 10 * time.Second})
			k, k2, busy := int64Key(t), pairKey(t), int64Key(t)
			h, err := newLocker(t, direct, advisory.Config{}).Lock(ctx, busy, nil)
			require.NoError(t, err)
			defer h.Unlock(context.WithoutCancel(ctx))

			require.NoError(t, pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '3s'")
				require.NoError(t, err)
				require.NoError(t, l.LockAllInTx(ctx, tx, []keys.Key{k2, k}, nil))
				assert.False(t, keyFree(t, ctx, direct, k), "held through the bouncer")
				assert.False(t, keyFree(t, ctx, direct, k2))

				err = l.LockInTx(ctx, tx, busy, &advisory.Options{Timeout: 50 * time.Millisecond})
				require.ErrorIs(t, err, advisory.ErrLockTimeout)
				err = l.TryLockAllInTx(ctx, tx, []keys.Key{busy, k}, nil)
				require.ErrorIs(t, err, advisory.ErrNotAcquired)
				var lt string
				require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt))
				assert.Equal(t, "3s", lt, "the transaction's own lock_timeout")
				assert.False(t, keyFree(t, ctx, direct, k), "still held after the failed calls")
				return nil
			}))
			assert.True(t, keyFree(t, ctx, direct, k), "released at COMMIT")
			assert.True(t, keyFree(t, ctx, direct, k2))
		})
	}
}

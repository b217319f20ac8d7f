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

// A lock_timeout the pool's AfterConnect SET is the session's own: a bounded
// transaction-lock call sets its wait's timeout with SET LOCAL and must set
// it back to that value before the callback or the batch's statements, not
// to the reset value (SET LOCAL ... TO DEFAULT gave them 0: a lock wait in
// the callback ran to the context's end; review 25). From the first call
// on a new connection on, in every form, bounded by Config.LockTimeout or
// by a context deadline alone; the next borrower still sees it.
func TestXactCallbackKeepsTheSessionsLockTimeout(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		for _, bound := range []time.Duration{2 * time.Second, 0} {
			t.Run(mode.String()+"/"+bound.String(), func(t *testing.T) {
				cfg := pgtest.Config(t)
				cfg.MaxConns = 1
				cfg.ConnConfig.DefaultQueryExecMode = mode
				pgtest.SetOnConnect(cfg, "SET lock_timeout = '250ms'")
				pool := pgtest.NewPool(t, cfg)
				l := newLocker(t, pool, advisory.Config{LockTimeout: bound})
				ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second) // a deadline: a bound even where LockTimeout is 0
				defer cancel()
				show := func(q interface {
					QueryRow(context.Context, string, ...any) pgx.Row
				}) string {
					var v string
					require.NoError(t, q.QueryRow(ctx, "SHOW lock_timeout").Scan(&v))
					return v
				}
				inTx := func(ctx context.Context, tx pgx.Tx) error {
					assert.Equal(t, "250ms", show(tx))
					return nil
				}
				require.NoError(t, l.WithXactLock(ctx, key(t), nil, inTx))
				require.NoError(t, l.WithXactLockAll(ctx, []keys.Key{key(t), key(t)}, nil, inTx))
				require.NoError(t, l.TryWithXactLock(ctx, key(t), nil, inTx))
				var got string
				b := &pgx.Batch{}
				b.Queue("SHOW lock_timeout").QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
				require.NoError(t, l.WithXactLockBatch(ctx, []keys.Key{key(t)}, nil, b))
				assert.Equal(t, "250ms", got, "the batch's statements")
				assert.Equal(t, "250ms", show(pool), "the next borrower")
			})
		}
	}
}

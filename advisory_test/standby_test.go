package advisory_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// standbyPool is a pool straight to c, owned by the test.
func standbyPool(t *testing.T, c *pglaunch.Cluster) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(c.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// A hot standby grants advisory locks against its own sessions only: with the key held
// on the primary, a lock on the standby is granted all the same (AllowStandby shows it).
// So by default every call that locks refuses a connection to a standby with ErrStandby:
// nothing runs, nothing is locked on the standby, and the pooled connection is destroyed;
// LockInTx leaves the caller's transaction usable. After a promotion, a connection
// opened while its server was a standby (which still says in_hot_standby = on, its
// server reporting the change only after its next statement) is asked again, and locks.
func TestStandbyIsRefused(t *testing.T) {
	ctx := testCtx(t)
	primary, standby := pgtest.Replicated(t, pglaunch.StandbyOptions{})
	onPrimary, onStandby := standbyPool(t, primary), standbyPool(t, standby)
	v := pgtest.UniqueInt64(t)
	k := keys.Int64(v)
	_, err := onPrimary.Exec(ctx, "SELECT pg_advisory_lock($1)", v)
	require.NoError(t, err)

	allowed := newLocker(t, standbyPool(t, standby), advisory.Config{AllowStandby: true})
	require.NoError(t, allowed.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }),
		"the standby grants a key the primary holds")

	pool := standbyPool(t, standby)
	l := newLocker(t, pool, advisory.Config{})
	ran := func(context.Context, *pgx.Conn) error { t.Error("the callback ran on a standby"); return nil }
	ranTx := func(context.Context, pgx.Tx) error { t.Error("the callback ran on a standby"); return nil }
	batch := func() *pgx.Batch { b := &pgx.Batch{}; b.Queue("SELECT 1"); return b }
	calls := map[string]func() error{
		"WithLock":             func() error { return l.WithLock(ctx, k, nil, ran) },
		"TryWithLock":          func() error { return l.TryWithLock(ctx, k, nil, ran) },
		"WithLockAll":          func() error { return l.WithLockAll(ctx, []keys.Key{k}, nil, ran) },
		"WithXactLock":         func() error { return l.WithXactLock(ctx, k, nil, ranTx) },
		"TryWithXactLock":      func() error { return l.TryWithXactLock(ctx, k, nil, ranTx) },
		"WithXactLockBatch":    func() error { return l.WithXactLockBatch(ctx, []keys.Key{k}, nil, batch()) },
		"TryWithXactLockBatch": func() error { return l.TryWithXactLockBatch(ctx, []keys.Key{k}, nil, batch()) },
		"Lock": func() error {
			h, err := l.Lock(ctx, k, nil)
			if err == nil {
				_ = h.Unlock(ctx)
			}
			return err
		},
		"TryLock": func() error {
			h, err := l.TryLock(ctx, k, nil)
			if err == nil {
				_ = h.Unlock(ctx)
			}
			return err
		},
		"Hold": func() error {
			return l.Hold(ctx, k, nil, func(context.Context) error { t.Error("Hold's callback ran on a standby"); return nil })
		},
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, advisory.ErrStandby, name)
		var lockErr *advisory.LockError
		assert.ErrorAs(t, err, &lockErr, name)
		assert.Zero(t, pool.Stat().TotalConns(), "%s: the standby's connection was destroyed", name)
	}
	var held int
	require.NoError(t, onStandby.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&held))
	assert.Zero(t, held, "nothing locked on the standby")

	tx, err := onStandby.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, l.LockInTx(ctx, tx, k, nil), advisory.ErrStandby)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the caller's transaction is usable")
	require.NoError(t, tx.Rollback(ctx))

	// A connection opened while the server was a standby, idle through the promotion.
	promoted := standbyPool(t, standby)
	c, err := promoted.Acquire(ctx)
	require.NoError(t, err)
	pid := c.Conn().PgConn().PID()
	require.Equal(t, "on", c.Conn().PgConn().ParameterStatus("in_hot_standby"))
	c.Release()
	_, err = onPrimary.Exec(ctx, "SELECT pg_advisory_unlock($1)", v)
	require.NoError(t, err)
	require.NoError(t, standby.Promote(ctx))
	pl := newLocker(t, promoted, advisory.Config{})
	require.NoError(t, pl.WithLock(ctx, k, nil, func(_ context.Context, conn *pgx.Conn) error {
		assert.Equal(t, pid, conn.PgConn().PID(), "the connection from before the promotion, asked again")
		return nil
	}))
}

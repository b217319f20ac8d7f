package advisory_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// A callback that sends nothing on its connection cannot have changed the
// session (pooltx.Conn.Reclaim): the helper ends with the unlock, COMMIT
// or ROLLBACK alone, and the connection goes back exactly as the pool gave
// it out, state another borrower left on it included. A callback that sends
// anything is followed by the reset. Each helper, on a pool of one.
func TestQuietCallbackSkipsTheReset(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	session := func(ctx context.Context, c *pgx.Conn, run bool) error {
		if !run {
			return nil
		}
		_, err := c.Exec(ctx, "SELECT 1")
		return err
	}
	xact := func(ctx context.Context, tx pgx.Tx, run bool) error {
		if !run {
			return nil
		}
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}
	helpers := map[string]func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error{
		"WithLock": func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error {
			return l.WithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error { return session(ctx, c, run) })
		},
		"TryWithLock": func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error {
			return l.TryWithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error { return session(ctx, c, run) })
		},
		"WithLockAll": func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error {
			return l.WithLockAll(ctx, []keys.Key{k, keys.Int64(pgtest.UniqueInt64(t))}, nil, func(ctx context.Context, c *pgx.Conn) error { return session(ctx, c, run) })
		},
		"shared WithLock": func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error {
			return l.WithLock(ctx, k, &advisory.Options{Shared: true}, func(ctx context.Context, c *pgx.Conn) error { return session(ctx, c, run) })
		},
		"WithXactLock": func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error {
			return l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error { return xact(ctx, tx, run) })
		},
		"TryWithXactLock": func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error {
			return l.TryWithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error { return xact(ctx, tx, run) })
		},
		"WithXactLockAll": func(ctx context.Context, l *advisory.Locker, k keys.Key, run bool) error {
			return l.WithXactLockAll(ctx, []keys.Key{k, keys.Int64(pgtest.UniqueInt64(t))}, nil, func(ctx context.Context, tx pgx.Tx) error { return xact(ctx, tx, run) })
		},
	}
	for name, helper := range helpers {
		t.Run(name, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			k := key(t)
			// The connection's first lend records its settings as it finds
			// them (the reset restores those): before anyone leaves any.
			require.NoError(t, helper(ctx, l, k, true))
			fresh, pid := pgtest.AppName(ctx, t, pool)

			pgtest.LeaveAppName(ctx, t, pool, "left-by-another")
			require.NoError(t, helper(ctx, l, k, false))
			got, p := pgtest.AppName(ctx, t, pool)
			assert.Equal(t, "left-by-another", got, "a quiet callback: no reset")
			assert.Equal(t, pid, p, "the same connection")
			assert.Zero(t, advisoryLocksOf(ctx, t, admin, p), "the lock was released all the same")

			require.NoError(t, helper(ctx, l, k, true))
			got, p = pgtest.AppName(ctx, t, pool)
			assert.Equal(t, fresh, got, "a callback that ran a statement: reset")
			assert.Equal(t, pid, p, "the same connection")
			assert.Zero(t, advisoryLocksOf(ctx, t, admin, p))
		})
	}
}

// A refused TryWithXactLock rolls back its BEGIN and lock alone: nothing
// was lent.
func TestRefusedXactTryRunsNoReset(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	other := newLocker(t, pgtest.Pool(t), advisory.Config{})
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	h, err := other.Lock(ctx, k, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, h.Unlock(ctx)) }()
	pgtest.LeaveAppName(ctx, t, pool, "left-by-another")
	err = l.TryWithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
	require.True(t, errors.Is(err, advisory.ErrNotAcquired), "%v", err)
	got, _ := pgtest.AppName(ctx, t, pool)
	assert.Equal(t, "left-by-another", got)
}

func advisoryLocksOf(ctx context.Context, t *testing.T, admin *pgxpool.Pool, pid uint32) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", int64(pid)).Scan(&n))
	return n
}

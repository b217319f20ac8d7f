package advisory_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// killIdle terminates every backend of pool's application_name and waits
// until they are gone; the pool's idle connections are then dead without
// knowing it.
func killIdle(ctx context.Context, t *testing.T, pool, admin *pgxpool.Pool) {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 5000))
		FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
	require.Positive(t, n)
}

// afterKill runs a session call, a transaction call and a handle, each
// right after warm has left idle connections in pool and killIdle has
// terminated their backends; every call must succeed.
func afterKill(t *testing.T, pool *pgxpool.Pool, warm func(ctx context.Context)) {
	t.Helper()
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	p := newProbe(t)

	warm(ctx)
	killIdle(ctx, t, pool, admin)
	require.NoError(t, l.WithLock(ctx, k, nil, func(ctx context.Context, _ *pgx.Conn) error {
		assert.False(t, p.free(ctx, k, false))
		return nil
	}), "session call on dead idle connections")

	warm(ctx)
	killIdle(ctx, t, pool, admin)
	require.NoError(t, l.WithXactLock(ctx, k, nil, func(ctx context.Context, _ pgx.Tx) error {
		assert.False(t, p.free(ctx, k, false))
		return nil
	}), "transaction call on dead idle connections")

	warm(ctx)
	killIdle(ctx, t, pool, admin)
	h, err := l.TryLock(ctx, k, nil)
	require.NoError(t, err, "handle on dead idle connections")
	require.NoError(t, h.Unlock(ctx))
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

// Regression: after a restart or a terminate, the first call that drew a
// dead idle connection from the pool failed with 57P01. A dead session holds
// no lock, so the call now retries once on a fresh connection.
func TestDeadIdleConnectionIsRetriedOnce(t *testing.T) {
	pool := pgtest.Pool(t)
	afterKill(t, pool, func(ctx context.Context) {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		c.Release()
		require.EqualValues(t, 1, pool.Stat().IdleConns())
	})
}

// Regression (issue 10 item 6): the retry drew the next idle connection
// from pgxpool, which pings only connections idle for over a second, so
// with several dead idle connections it failed with 57P01 again. The retry
// now uses a connection it has just pinged.
func TestDeadIdleConnectionRetryUsesALiveConnection(t *testing.T) {
	pool := pgtest.Pool(t)
	const idle = 3
	afterKill(t, pool, func(ctx context.Context) {
		pgtest.IdleConns(ctx, t, pool, idle)
		require.EqualValues(t, idle, pool.Stat().IdleConns())
	})
}

// Regression (review 15): a Locker's first session-scope call checks for
// a connection proxy on the connection it drew, and a multiplexed Try
// call (TryLock, TryLockAll, TryHold) with no holder connection to share
// returned that check's failure on a dead idle connection (57P01, no
// sentinel) instead of retrying. Each form here is a new Locker's first
// call.
func TestFirstCallOfALockerRetriesDeadIdleConnection(t *testing.T) {
	noop := func(context.Context) error { return nil }
	forms := map[string]func(ctx context.Context, l *advisory.Locker, k keys.Key) error{
		"WithLock": func(ctx context.Context, l *advisory.Locker, k keys.Key) error {
			return l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		},
		"TryWithLock": func(ctx context.Context, l *advisory.Locker, k keys.Key) error {
			return l.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		},
		"Lock": func(ctx context.Context, l *advisory.Locker, k keys.Key) error {
			h, err := l.Lock(ctx, k, nil)
			if err != nil {
				return err
			}
			return h.Unlock(ctx)
		},
		"TryLock": func(ctx context.Context, l *advisory.Locker, k keys.Key) error {
			h, err := l.TryLock(ctx, k, nil)
			if err != nil {
				return err
			}
			return h.Unlock(ctx)
		},
		"TryLockAll": func(ctx context.Context, l *advisory.Locker, k keys.Key) error {
			h, err := l.TryLockAll(ctx, []keys.Key{k, keys.Int64(pgtest.UniqueInt64(t))}, nil)
			if err != nil {
				return err
			}
			return h.Unlock(ctx)
		},
		"Hold":    func(ctx context.Context, l *advisory.Locker, k keys.Key) error { return l.Hold(ctx, k, nil, noop) },
		"TryHold": func(ctx context.Context, l *advisory.Locker, k keys.Key) error { return l.TryHold(ctx, k, nil, noop) },
	}
	for name, form := range forms {
		for _, idle := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/idle=%d", name, idle), func(t *testing.T) {
				ctx := testCtx(t)
				pool := pgtest.Pool(t)
				pgtest.IdleConns(ctx, t, pool, idle)
				killIdle(ctx, t, pool, pgtest.Pool(t))
				require.NoError(t, form(ctx, newLocker(t, pool, advisory.Config{}), key(t)))
				assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
			})
		}
	}
}

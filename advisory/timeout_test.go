package advisory_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// awaitWaitedFor blocks until a backend has been waiting for k for at least
// d, by the database's clock (pg_locks.waitstart).
func awaitWaitedFor(ctx context.Context, t testing.TB, pool *pgxpool.Pool, k keys.Key, d time.Duration) {
	t.Helper()
	classid, objid, objsubid := k.PgLocks()
	require.Eventually(t, func() bool {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(clock_timestamp() - waitstart >= $4::interval), false) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND classid = $1 AND objid = $2 AND objsubid = $3`,
			classid, objid, objsubid, d.String()).Scan(&ok)
		require.NoError(t, err)
		return ok
	}, 20*time.Second, 5*time.Millisecond)
}

// Regression (issue 10 item 2): PostgreSQL applies lock_timeout to each
// lock wait, so a multi-key call whose first key arrived late waited the
// whole bound again for the next one; the client's deadline then cut the
// socket: "timeout: i/o timeout", OutcomeError, the connection destroyed,
// the backend possibly left waiting. Now the bound of a multi-key wait is
// the whole call's, enforced on the server.
func TestMultiKeyTimeoutIsALockTimeoutOfTheWholeCall(t *testing.T) {
	ctx := testCtx(t)
	const bound = 3 * time.Second
	noop := func(context.Context, *pgx.Conn) error { return nil }
	xnoop := func(context.Context, pgx.Tx) error { return nil }

	cases := []struct {
		name string
		cfg  advisory.Config
		call func(ctx context.Context, l *advisory.Locker, ks []keys.Key) error
	}{
		{"WithLockAll Options.Timeout", advisory.Config{}, func(ctx context.Context, l *advisory.Locker, ks []keys.Key) error {
			return l.WithLockAll(ctx, ks, &advisory.Options{Timeout: bound}, noop)
		}},
		{"WithLockAll Config.LockTimeout", advisory.Config{LockTimeout: bound}, func(ctx context.Context, l *advisory.Locker, ks []keys.Key) error {
			return l.WithLockAll(ctx, ks, nil, noop)
		}},
		{"WithXactLockAll Options.Timeout", advisory.Config{}, func(ctx context.Context, l *advisory.Locker, ks []keys.Key) error {
			return l.WithXactLockAll(ctx, ks, &advisory.Options{Timeout: bound}, xnoop)
		}},
		{"WithXactLockAll Config.LockTimeout", advisory.Config{LockTimeout: bound}, func(ctx context.Context, l *advisory.Locker, ks []keys.Key) error {
			return l.WithXactLockAll(ctx, ks, nil, xnoop)
		}},
		{"WithLockAll context deadline", advisory.Config{}, func(ctx context.Context, l *advisory.Locker, ks []keys.Key) error {
			dctx, cancel := context.WithTimeout(ctx, bound)
			defer cancel()
			return l.WithLockAll(dctx, ks, nil, noop)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool := pgtest.Pool(t)
			l := newLocker(t, pool, tc.cfg)
			p := newProbe(t)
			// An int8 key and a pair: the wait crosses key spaces too.
			ks := keys.Normalize([]keys.Key{key(t), keys.Pair(int32(pgtest.UniqueInt64(t)), -1)})
			h1 := hold(ctx, t, false, ks[0])
			hold(ctx, t, false, ks[1])

			done := make(chan error, 1)
			go func() { done <- tc.call(ctx, l, ks) }()
			// A third of the bound spent on the first key, then the
			// second stays busy: the call must end at the bound, on the
			// server, with a lock timeout.
			awaitWaitedFor(ctx, t, p.pool, ks[0], bound/3)
			h1.release()
			err := <-done

			require.ErrorIs(t, err, advisory.ErrLockTimeout)
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "the server ended the wait: %v", err)
			assert.Equal(t, "55P03", pgErr.Code)
			assert.Equal(t, advisory.OutcomeTimeout, advisory.OutcomeOf(err))
			assert.EqualValues(t, 1, pool.Stat().TotalConns(), "the connection survives")
			var waiting int
			require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
				AND pid IN (SELECT pid FROM pg_stat_activity WHERE application_name = $1)`,
				pool.Config().ConnConfig.RuntimeParams["application_name"]).Scan(&waiting))
			assert.Zero(t, waiting, "nothing left waiting")
			assert.True(t, p.free(ctx, ks[0], false), "the key taken before the timeout was released")
			assert.Equal(t, []string{"0"}, showLockTimeouts(ctx, t, pool), "no lock_timeout left on the connection")
		})
	}
}

// Regression (issue 10 item 6): a context cancelled after the call got its
// connection but before the lock statement went out still sent the
// statement, with a cancel request racing it (PostgreSQL ignores one that
// arrives before the backend begins the statement): the call then lost the
// connection, and could take the half-second backstop to return. Now
// nothing is sent and the connection goes back to the pool.
func TestCancelBeforeTheLockStatementSendsNothing(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	var armed atomic.Pointer[context.CancelFunc]
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if c := armed.Swap(nil); c != nil {
			(*c)() // the caller gives up just as its connection is handed over
		}
		return true, nil
	}
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	// Warm up: one pooled connection, the proxy check done.
	require.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }))
	require.EqualValues(t, 1, pool.Stat().TotalConns())
	created := pool.Stat().NewConnsCount()

	calls := map[string]func(ctx context.Context) error{
		"WithLock": func(ctx context.Context) error {
			return l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { t.Error("fn ran"); return nil })
		},
		"WithLockAll": func(ctx context.Context) error {
			return l.WithLockAll(ctx, []keys.Key{k, key(t)}, nil, func(context.Context, *pgx.Conn) error { t.Error("fn ran"); return nil })
		},
		"WithXactLock": func(ctx context.Context) error {
			return l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { t.Error("fn ran"); return nil })
		},
	}
	for name, call := range calls {
		cctx, cancel := context.WithCancel(ctx)
		armed.Store(&cancel)
		err := call(cctx)
		require.ErrorIs(t, err, context.Canceled, name)
		assert.Equal(t, advisory.OutcomeCancelled, advisory.OutcomeOf(err), name)
		assert.Nil(t, armed.Load(), "%s: the hook ran", name)
		assert.EqualValues(t, 1, pool.Stat().TotalConns(), "%s: the connection is kept", name)
		assert.Equal(t, created, pool.Stat().NewConnsCount(), "%s: no connection was replaced", name)
		assert.True(t, p.free(ctx, k, false), name)
	}
}

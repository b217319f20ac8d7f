package advisory_test

import (
	"context"
	"errors"
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

func TestNewRejectsBadInput(t *testing.T) {
	_, err := advisory.New(nil, advisory.Config{})
	assert.ErrorIs(t, err, advisory.ErrInvalid)
	_, err = advisory.New(pgtest.Pool(t), advisory.Config{LockTimeout: -time.Second})
	assert.ErrorIs(t, err, advisory.ErrInvalid)
}

func TestTryFromAnotherConnectionFailsWhileHeld(t *testing.T) {
	ctx := testCtx(t)
	a := newLocker(t, pgtest.Pool(t), advisory.Config{})
	b := newLocker(t, pgtest.Pool(t), advisory.Config{})
	k := key(t)

	err := a.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		err := b.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error {
			t.Error("second holder ran while the key was held")
			return nil
		})
		assert.ErrorIs(t, err, advisory.ErrNotAcquired)
		var le *advisory.LockError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "try-lock", le.Op)
		assert.Equal(t, []keys.Key{k}, le.Keys)
		return nil
	})
	require.NoError(t, err)

	ran := false
	require.NoError(t, b.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { ran = true; return nil }))
	assert.True(t, ran, "try succeeds once the key is released")
}

func TestSharedCompatibleExclusiveConflicts(t *testing.T) {
	ctx := testCtx(t)
	a := newLocker(t, pgtest.Pool(t), advisory.Config{})
	b := newLocker(t, pgtest.Pool(t), advisory.Config{})
	k := keys.Pair(pgtest.UniqueInt32(t), -7)
	shared := &advisory.Options{Shared: true}

	t.Run("session", func(t *testing.T) {
		require.NoError(t, a.WithLock(ctx, k, shared, func(ctx context.Context, _ *pgx.Conn) error {
			sharedRan := false
			require.NoError(t, b.TryWithLock(ctx, k, shared, func(context.Context, *pgx.Conn) error { sharedRan = true; return nil }))
			assert.True(t, sharedRan, "shared + shared are compatible")
			err := b.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
			assert.ErrorIs(t, err, advisory.ErrNotAcquired, "exclusive conflicts with shared")
			return nil
		}))
		require.NoError(t, a.WithLock(ctx, k, nil, func(ctx context.Context, _ *pgx.Conn) error {
			err := b.TryWithLock(ctx, k, shared, func(context.Context, *pgx.Conn) error { return nil })
			assert.ErrorIs(t, err, advisory.ErrNotAcquired, "shared conflicts with exclusive")
			return nil
		}))
	})
	t.Run("xact", func(t *testing.T) {
		require.NoError(t, a.WithXactLock(ctx, k, shared, func(ctx context.Context, _ pgx.Tx) error {
			sharedRan := false
			require.NoError(t, b.TryWithXactLock(ctx, k, shared, func(context.Context, pgx.Tx) error { sharedRan = true; return nil }))
			assert.True(t, sharedRan)
			err := b.TryWithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
			assert.ErrorIs(t, err, advisory.ErrNotAcquired)
			assert.Equal(t, "try-xact-lock", func() string { var le *advisory.LockError; errors.As(err, &le); return le.Op }())
			return nil
		}))
	})
}

func TestSessionLockIsHeldFromAnotherConnectionsView(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	require.NoError(t, l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		assert.False(t, p.free(ctx, k, false))
		assert.False(t, p.free(ctx, k, true))
		var n int // the callback may use the pinned connection
		return conn.QueryRow(ctx, "SELECT 1").Scan(&n)
	}))
	assert.True(t, p.free(ctx, k, false))
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	assert.EqualValues(t, 1, pool.Stat().TotalConns(), "a clean release keeps the connection")
}

func TestXactLockGoneAfterCommitAndRollback(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)

	require.NoError(t, l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		assert.False(t, p.free(ctx, k, false), "held inside the transaction")
		return nil
	}))
	assert.True(t, p.free(ctx, k, false), "gone after commit")

	sentinel := errors.New("roll me back")
	err := l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		assert.False(t, p.free(ctx, k, false))
		return sentinel
	})
	assert.Same(t, sentinel, err, "the callback's error comes back unchanged")
	assert.True(t, p.free(ctx, k, false), "gone after rollback")
	assert.EqualValues(t, 1, pool.Stat().TotalConns())
}

func TestCallbackErrorIsReturnedUnchangedAndUnlocks(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	p := newProbe(t)
	k := key(t)
	sentinel := errors.New("callback failed")
	err := l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return sentinel })
	assert.Same(t, sentinel, err)
	assert.True(t, p.free(ctx, k, false))
}

func TestTimeoutKeepsConnectionAndSetting(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 2
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{LockTimeout: 100 * time.Millisecond})
	k := key(t)
	h := hold(ctx, t, false, k)
	before := showLockTimeouts(ctx, t, pool)

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"session config timeout", func() error {
			return l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		}},
		{"session per-call timeout", func() error {
			return l.WithLock(ctx, k, &advisory.Options{Timeout: 50 * time.Millisecond}, func(context.Context, *pgx.Conn) error { return nil })
		}},
		{"xact", func() error {
			return l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
		}},
		{"multi-key session", func() error {
			return l.WithLockAll(ctx, []keys.Key{key(t), k}, nil, func(context.Context, *pgx.Conn) error { return nil })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, advisory.ErrLockTimeout)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			assert.Equal(t, "55P03", pgErr.Code)
			assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
		})
	}
	after := showLockTimeouts(ctx, t, pool)
	assert.Len(t, after, len(before))
	for _, v := range after {
		assert.Equal(t, "0", v, "lock_timeout must not leak into pooled connections")
	}
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	h.release()
}

func TestDeadlineBecomesServerTimeoutAndKeepsConnection(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	hold(ctx, t, false, k)

	var pid uint32
	require.NoError(t, pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { pid = c.Conn().PgConn().PID(); return nil }))

	dctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel()
	err := l.WithLock(dctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the deadline's identity survives")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the server's lock_timeout ended the wait, not a closed socket")
	assert.Equal(t, "55P03", pgErr.Code)

	var pid2 uint32
	require.NoError(t, pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { pid2 = c.Conn().PgConn().PID(); return nil }))
	assert.Equal(t, pid, pid2, "the connection survived the timed-out wait")
	assert.Equal(t, []string{"0"}, showLockTimeouts(ctx, t, pool))
}

func TestCancelWhileWaitingReturnsPromptly(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	appName := cfg.ConnConfig.RuntimeParams["application_name"]
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	hold(ctx, t, false, k)
	p := newProbe(t)

	for _, scope := range []string{"session", "xact"} {
		t.Run(scope, func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				if scope == "session" {
					done <- l.WithLock(cctx, k, nil, func(context.Context, *pgx.Conn) error { return errors.New("ran") })
				} else {
					done <- l.WithXactLock(cctx, k, nil, func(context.Context, pgx.Tx) error { return errors.New("ran") })
				}
			}()
			awaitWaiting(ctx, t, p.pool, k, 1)
			cancel()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, context.Canceled)
				assert.NotErrorIs(t, err, advisory.ErrLockTimeout)
			case <-time.After(5 * time.Second):
				t.Fatal("cancelled wait did not return")
			}
			assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
			// Regression: closing the socket alone leaves the backend queued
			// in pg_locks until the lock is granted to it. The cancel request
			// takes it out of the queue at once, and the connection survives.
			var ghosts int
			require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
				WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1`, appName).Scan(&ghosts))
			assert.Zero(t, ghosts, "no backend of the pool is left waiting")
			// The connection is kept when the server answers the cancel
			// request within the half-second backstop; on a loaded machine
			// the request's own connection (TCP, TLS, a fork) can take
			// longer, and then the connection is destroyed, as advisory's
			// doc says. Either way nothing is left waiting (above).
			if n := pool.Stat().TotalConns(); n != 1 {
				t.Logf("the cancelled wait's connection was destroyed (%d connections): the cancel request outlasted the backstop", n)
			}
		})
	}
}

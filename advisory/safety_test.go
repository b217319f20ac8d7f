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
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

func TestPanicInCallbackReleasesAndRepanics(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)

	assert.PanicsWithValue(t, "session bug", func() {
		_ = l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { panic("session bug") })
	})
	require.Eventually(t, func() bool { return p.free(ctx, k, false) }, 5*time.Second, time.Millisecond,
		"the destroyed session's lock must be released")
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())

	assert.PanicsWithValue(t, "xact bug", func() {
		_ = l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { panic("xact bug") })
	})
	require.Eventually(t, func() bool { return p.free(ctx, k, false) }, 5*time.Second, time.Millisecond)
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

// Regression guard for the classic leak: the unlock returned false because
// the callback released the lock itself; the library must say so and not
// trust the connection.
func TestUnlockFalseIsErrNotHeldAndDestroysConnection(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	v, _ := k.Int64()
	err := l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", v)
		return err
	})
	require.ErrorIs(t, err, advisory.ErrNotHeld)
	var le *advisory.LockError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "unlock", le.Op)
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "a connection whose unlock returned false is destroyed")
}

// Locks stack per session: a callback that takes the key again on the
// pinned connection must not leave the second level in the pool.
func TestReentrantLockInCallbackDoesNotLeakIntoPool(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	other := key(t)
	v, _ := k.Int64()
	ov, _ := other.Int64()
	require.NoError(t, l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", v); err != nil {
			return err
		}
		_, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared($1)", ov)
		return err
	}))
	assert.True(t, p.free(ctx, k, false))
	assert.True(t, p.free(ctx, other, false))
	assert.EqualValues(t, 1, pool.Stat().TotalConns(), "cleaned, so kept")
	pgtest.AssertNoAdvisoryLocks(t, pool)
}

func TestMultiKeyTryIsAllOrNothing(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	p := newProbe(t)
	a, b, c := key(t), keys.Pair(pgtest.UniqueInt32(t), 1), key(t)
	h := hold(ctx, t, false, b)

	for _, scope := range []string{"session", "xact"} {
		t.Run(scope, func(t *testing.T) {
			var err error
			if scope == "session" {
				err = l.TryWithLockAll(ctx, []keys.Key{c, b, a}, nil, func(context.Context, *pgx.Conn) error { t.Error("ran"); return nil })
			} else {
				err = l.TryWithXactLockAll(ctx, []keys.Key{c, b, a}, nil, func(context.Context, pgx.Tx) error { t.Error("ran"); return nil })
			}
			require.ErrorIs(t, err, advisory.ErrNotAcquired)
			assert.True(t, p.free(ctx, a, false), "no key stays held when one is busy")
			assert.True(t, p.free(ctx, c, false))
		})
	}
	h.release()
	ran := false
	require.NoError(t, l.TryWithLockAll(ctx, []keys.Key{c, b, a, a}, nil, func(ctx context.Context, _ *pgx.Conn) error {
		ran = true
		assert.False(t, p.free(ctx, a, false))
		assert.False(t, p.free(ctx, b, false))
		assert.False(t, p.free(ctx, c, false))
		return nil
	}))
	assert.True(t, ran)
}

func TestMultiKeyFailurePartWayReleasesTakenKeys(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{LockTimeout: 100 * time.Millisecond})
	p := newProbe(t)
	// Sorted order: int8 keys first, then pairs; the busy key comes last so
	// the others are taken before the wait fails.
	first, second, busy := keys.Int64(-1<<62+pgtest.UniqueInt64(t)%1000), key(t), keys.Pair(pgtest.UniqueInt32(t), 9)
	hold(ctx, t, false, busy)

	err := l.WithLockAll(ctx, []keys.Key{busy, second, first}, nil, func(context.Context, *pgx.Conn) error { t.Error("ran"); return nil })
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	assert.True(t, p.free(ctx, first, false), "keys taken before the failure are released")
	assert.True(t, p.free(ctx, second, false))
	assert.EqualValues(t, 1, pool.Stat().TotalConns(), "released by unlock, connection kept")
	pgtest.AssertNoAdvisoryLocks(t, pool)
}

func TestKeyCapRefusedBeforeAnySQL(t *testing.T) {
	ctx := testCtx(t)
	var counter roundtrip.Counter
	cfg := pgtest.Config(t)
	cfg.ConnConfig.DialFunc = counter.DialFunc
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{MaxKeys: 3})
	ks := []keys.Key{key(t), key(t), key(t), key(t)}
	counter.Reset()
	err := l.WithLockAll(ctx, ks, nil, func(context.Context, *pgx.Conn) error { return nil })
	require.ErrorIs(t, err, advisory.ErrInvalid)
	assert.Contains(t, err.Error(), "cap of 3")
	err = l.WithXactLockAll(ctx, ks, nil, func(context.Context, pgx.Tx) error { return nil })
	require.ErrorIs(t, err, advisory.ErrInvalid)
	assert.Zero(t, counter.Count(), "no SQL, not even a connection")

	// Duplicates count once.
	require.NoError(t, l.WithLockAll(ctx, []keys.Key{ks[0], ks[1], ks[2], ks[0]}, nil, func(context.Context, *pgx.Conn) error { return nil }))
}

func TestBadInputIsErrInvalid(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	assert.ErrorIs(t, l.WithLock(ctx, keys.Key{}, nil, func(context.Context, *pgx.Conn) error { return nil }), advisory.ErrInvalid)
	assert.ErrorIs(t, l.WithLock(ctx, key(t), nil, nil), advisory.ErrInvalid)
	assert.ErrorIs(t, l.WithLockAll(ctx, nil, nil, func(context.Context, *pgx.Conn) error { return nil }), advisory.ErrInvalid)
	assert.ErrorIs(t, l.WithXactLockAll(ctx, []keys.Key{}, nil, func(context.Context, pgx.Tx) error { return nil }), advisory.ErrInvalid)
	assert.ErrorIs(t, l.WithXactLock(ctx, key(t), nil, nil), advisory.ErrInvalid)
}

func TestXactCallbackSeesOriginalLockTimeout(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "7s"
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{LockTimeout: 250 * time.Millisecond})
	require.NoError(t, l.WithXactLockAll(ctx, []keys.Key{key(t), key(t)}, nil, func(ctx context.Context, tx pgx.Tx) error {
		var v string
		require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&v))
		assert.Equal(t, "7s", v, "the wait's lock_timeout is restored before the callback")
		return nil
	}))
	require.NoError(t, l.WithXactLock(ctx, key(t), nil, func(ctx context.Context, tx pgx.Tx) error {
		var v string
		require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&v))
		assert.Equal(t, "7s", v)
		return nil
	}))
	assert.Equal(t, []string{"7s"}, showLockTimeouts(ctx, t, pool))
}

// Round trips once statements are prepared: the session helper costs lock
// + unlock (2, like raw pgx), the xact helper BEGIN+lock, COMMIT (2, raw
// pgx naive costs 3), multi-key the same as one key.
func TestRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	var counter roundtrip.Counter
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = counter.DialFunc
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{LockTimeout: time.Second})
	k := key(t)
	many := []keys.Key{key(t), key(t), key(t), keys.Pair(pgtest.UniqueInt32(t), 2), keys.Pair(pgtest.UniqueInt32(t), 4)} // unique: other packages run at once

	measure := func(name string, want int64, call func() error) {
		t.Helper()
		require.NoError(t, call()) // prepares statements
		counter.Reset()
		require.NoError(t, call())
		assert.Equal(t, want, counter.Count(), name)
	}
	measure("session", 2, func() error {
		return l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	})
	measure("session multi", 2, func() error {
		return l.WithLockAll(ctx, many, nil, func(context.Context, *pgx.Conn) error { return nil })
	})
	measure("xact", 2, func() error {
		return l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
	})
	measure("xact multi", 2, func() error {
		return l.WithXactLockAll(ctx, many, nil, func(context.Context, pgx.Tx) error { return nil })
	})
	measure("try xact", 2, func() error {
		return l.TryWithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
	})
}

// Regression test for "WithLock reported a lost lock as a failed cleanup": when the
// holding session ends while fn runs (here pg_terminate_backend; in a failover, the
// primary going away), the unlock finds the connection closed. The key was free for
// others from that moment, so the call must say ErrLockLost, not only "pooltx: unlock:
// conn closed".
func TestWithLockSessionEndedDuringCallbackIsErrLockLost(t *testing.T) {
	ctx := testCtx(t)
	pool, admin := pgtest.Pool(t), pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	err := l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		pid := conn.PgConn().PID()
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("terminate %d: %v %v", pid, ok, err)
		}
		// The backend is gone once pg_stat_activity no longer lists it.
		require.Eventually(t, func() bool {
			var n int
			return admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n) == nil && n == 0
		}, 20*time.Second, 5*time.Millisecond)
		return nil // fn does not use conn: the unlock is what finds the session gone
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)
	var le *advisory.LockError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "unlock", le.Op)
	var ce *pooltx.CleanupError
	assert.ErrorAs(t, err, &ce, "what the unlock met stays in the chain")
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "the closed connection is not pooled")
}

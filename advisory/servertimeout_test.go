package advisory_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/pgxlock/pgxlock/pooltx"
)

// Issue 20, part 3: every timeout is a sentinel, and the server's own
// timeouts (lock_timeout, statement_timeout, idle_session_timeout,
// idle_in_transaction_session_timeout) set on the role behave as the
// package documentation ("Server timeouts") says.

// rolePool creates a login role unique to the test, with settings applied
// by ALTER ROLE ... SET (only that role: the shared server is not
// changed), and returns a pool connected as it. The role is dropped at
// cleanup, after the pool is closed and its backends have gone.
func rolePool(t *testing.T, settings map[string]string) *pgxpool.Pool {
	t.Helper()
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	role := fmt.Sprintf("pgxlock_t20_%d", pgtest.UniqueInt64(t)&0xffffffff)
	qrole := pgx.Identifier{role}.Sanitize()
	_, err := admin.Exec(ctx, "CREATE ROLE "+qrole+" LOGIN NOSUPERUSER")
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.Exec(cctx, "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = $1", role)
		assert.NoError(t, err)
		_, err = admin.Exec(cctx, "DROP ROLE "+qrole)
		assert.NoError(t, err)
	})
	for name, value := range settings {
		// name is a constant of the test; value travels as a literal.
		_, err := admin.Exec(ctx, fmt.Sprintf("ALTER ROLE %s SET %s = '%s'", qrole, name, value))
		require.NoError(t, err)
	}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.User = role
	return pgtest.NewPool(t, cfg)
}

// requireStatementTimeout checks err is a lock timeout caused by
// statement_timeout: ErrLockTimeout, the 57014 kept, outcome "timeout".
func requireStatementTimeout(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "57014", pgErr.Code)
	assert.Contains(t, pgErr.Message, "statement timeout")
	assert.Equal(t, advisory.OutcomeTimeout, advisory.OutcomeOf(err))
	var le *advisory.LockError
	require.ErrorAs(t, err, &le)
}

// statement_timeout set on the role ends every blocking form's wait with
// ErrLockTimeout, the *pgconn.PgError (57014) kept, also when the call's own
// bound is longer.
func TestStatementTimeoutEndsAWaitAsLockTimeout(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"statement_timeout": "300ms"})
	k1, k2 := key(t), key(t)
	hold(ctx, t, false, k1, k2)
	noop := func(context.Context, *pgx.Conn) error { t.Error("fn ran"); return nil }
	noopTx := func(context.Context, pgx.Tx) error { t.Error("fn ran"); return nil }
	for _, bound := range []time.Duration{0, time.Hour} {
		l := newLocker(t, pool, advisory.Config{LockTimeout: bound})
		t.Run(fmt.Sprintf("bound=%v", bound), func(t *testing.T) {
			t.Run("WithLock", func(t *testing.T) { requireStatementTimeout(t, l.WithLock(ctx, k1, nil, noop)) })
			t.Run("WithLockAll", func(t *testing.T) {
				requireStatementTimeout(t, l.WithLockAll(ctx, []keys.Key{k1, k2}, nil, noop))
			})
			t.Run("Lock", func(t *testing.T) {
				h, err := l.Lock(ctx, k1, nil)
				require.Nil(t, h)
				requireStatementTimeout(t, err)
			})
			t.Run("WithXactLock", func(t *testing.T) { requireStatementTimeout(t, l.WithXactLock(ctx, k1, nil, noopTx)) })
			t.Run("WithXactLockAll", func(t *testing.T) {
				requireStatementTimeout(t, l.WithXactLockAll(ctx, []keys.Key{k1, k2}, nil, noopTx))
			})
			t.Run("WithXactLockBatch", func(t *testing.T) {
				b := &pgx.Batch{}
				b.Queue("SELECT 1")
				requireStatementTimeout(t, l.WithXactLockBatch(ctx, []keys.Key{k1}, nil, b))
			})
		})
	}
	// The connections survive: a free key is taken on them at once.
	l := newLocker(t, pool, advisory.Config{})
	require.NoError(t, l.WithLock(ctx, key(t), nil, func(context.Context, *pgx.Conn) error { return nil }))

	// The same from the connection string.
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "300ms"
	l = newLocker(t, pgtest.NewPool(t, cfg), advisory.Config{})
	requireStatementTimeout(t, l.WithLock(ctx, k1, nil, noop))
	requireStatementTimeout(t, l.WithXactLock(ctx, k1, nil, noopTx))
}

// A cancel request is not a timeout: cancelling the context of a wait reads
// as the context's error (57014 "due to user request" kept), under a role
// with statement_timeout too; so does another session's pg_cancel_backend,
// which is neither a timeout nor a cancellation of the caller's.
func TestCancelRequestIsNotALockTimeout(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"statement_timeout": "1h"})
	admin := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	hold(ctx, t, false, k)

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		errc <- l.WithLock(cctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	}()
	awaitWaiting(ctx, t, admin, k, 1)
	cancel()
	err := <-errc
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, advisory.ErrLockTimeout)
	assert.Equal(t, advisory.OutcomeCancelled, advisory.OutcomeOf(err))

	go func() {
		errc <- l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
	}()
	awaitWaiting(ctx, t, admin, k, 1)
	_, err = admin.Exec(ctx, `SELECT pg_cancel_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted AND objid = $1`, func() uint32 { _, o, _ := k.PgLocks(); return o }())
	require.NoError(t, err)
	err = <-errc
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "57014", pgErr.Code)
	assert.Contains(t, pgErr.Message, "user request")
	require.NotErrorIs(t, err, advisory.ErrLockTimeout)
	require.NotErrorIs(t, err, context.Canceled)
	assert.Equal(t, advisory.OutcomeError, advisory.OutcomeOf(err))
}

// A bound longer than PostgreSQL's maximum lock_timeout (2147483647 ms,
// about 24.8 days) is cut to it: every blocking form works on a free key,
// and waits for a held one.
func TestBoundBeyondMaxLockTimeout(t *testing.T) {
	const far = 600 * time.Hour // 2,160,000,000 ms
	type setup struct {
		name string
		cfg  advisory.Config
		opts *advisory.Options
		ctx  func(context.Context) (context.Context, context.CancelFunc)
	}
	plain := func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} }
	for _, su := range []setup{
		{"Options.Timeout", advisory.Config{}, &advisory.Options{Timeout: far}, plain},
		{"Options.Timeout=max", advisory.Config{}, &advisory.Options{Timeout: time.Duration(1<<63 - 1)}, plain},
		{"Config.LockTimeout", advisory.Config{LockTimeout: far}, nil, plain},
		{"deadline", advisory.Config{}, nil, func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, far)
		}},
	} {
		t.Run(su.name, func(t *testing.T) {
			base := testCtx(t)
			// Not base: its 5-minute deadline would shorten every bound.
			free, stop := context.WithCancel(context.Background())
			defer stop()
			ctx, cancel := su.ctx(free)
			defer cancel()
			l := newLocker(t, pgtest.Pool(t), su.cfg)
			p := newProbe(t)
			ks := []keys.Key{key(t), keys.Pair(int32(pgtest.UniqueInt64(t)), 7), key(t)}
			fn := func(context.Context, *pgx.Conn) error { return nil }
			fnTx := func(context.Context, pgx.Tx) error { return nil }
			for _, shared := range []bool{false, true} {
				opts := &advisory.Options{Shared: shared}
				if su.opts != nil {
					opts.Timeout = su.opts.Timeout
				}
				require.NoError(t, l.WithLock(ctx, ks[0], opts, fn))
				require.NoError(t, l.WithLock(ctx, ks[1], opts, fn))
				require.NoError(t, l.WithLockAll(ctx, ks, opts, fn))
				require.NoError(t, l.WithXactLock(ctx, ks[0], opts, fnTx))
				require.NoError(t, l.WithXactLock(ctx, ks[1], opts, fnTx))
				require.NoError(t, l.WithXactLockAll(ctx, ks, opts, fnTx))
				b := &pgx.Batch{}
				b.Queue("SELECT 1")
				require.NoError(t, l.WithXactLockBatch(ctx, ks, opts, b))
				b = &pgx.Batch{}
				b.Queue("SELECT 1")
				require.NoError(t, l.WithXactLockBatch(ctx, ks[:1], opts, b))
				h, err := l.Lock(ctx, ks[0], opts)
				require.NoError(t, err)
				require.NoError(t, h.Unlock(ctx))
				h, err = l.LockAll(ctx, ks, opts)
				require.NoError(t, err)
				require.NoError(t, h.Unlock(ctx))
				require.NoError(t, l.Hold(ctx, ks[1], opts, func(context.Context) error { return nil }))
			}

			// A held key is waited for, not refused at once.
			hl := hold(base, t, false, ks[0])
			errc := make(chan error, 1)
			go func() { errc <- l.WithLock(ctx, ks[0], su.opts, fn) }()
			awaitWaiting(base, t, pgtest.Pool(t), ks[0], 1)
			hl.release()
			require.NoError(t, <-errc)
			require.True(t, p.free(base, ks[0], false))
		})
	}
}

// A WithLock callback that returns inside a transaction it began gets
// ErrCallbackInTx: open or aborted, the transaction is rolled back (nothing
// committed) and the lock released. One that commits its own BEGIN is fine.
func TestCallbackLeavingATransaction(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	p := newProbe(t)
	l := newLocker(t, pool, advisory.Config{})
	table := fmt.Sprintf("pgxlock_t20_tx_%d", pgtest.UniqueInt64(t)&0xffffffff)
	qt := pgx.Identifier{table}.Sanitize()
	t.Cleanup(func() { _, _ = pgtest.Pool(t).Exec(context.Background(), "DROP TABLE IF EXISTS "+qt) })
	exists := func() bool {
		var ok bool
		require.NoError(t, p.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok))
		return ok
	}
	for _, tc := range []struct {
		name   string
		fn     func(ctx context.Context, conn *pgx.Conn) error
		inTx   bool
		commit bool
	}{
		{"aborted", func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "BEGIN; CREATE TABLE "+qt+" (x int)")
			require.NoError(t, err)
			_, err = conn.Exec(ctx, "SELECT 1/0")
			require.Error(t, err)
			return nil
		}, true, false},
		{"open", func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "BEGIN; CREATE TABLE "+qt+" (x int)")
			require.NoError(t, err)
			return nil
		}, true, false},
		{"open, with fn's error", func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "BEGIN")
			require.NoError(t, err)
			return errors.New("fn failed")
		}, true, false},
		{"committed", func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "BEGIN; CREATE TABLE "+qt+" (x int); COMMIT")
			require.NoError(t, err)
			return nil
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := key(t)
			err := l.WithLock(ctx, k, nil, tc.fn)
			if tc.inTx {
				require.ErrorIs(t, err, advisory.ErrCallbackInTx)
				var le *advisory.LockError
				require.ErrorAs(t, err, &le)
			} else {
				require.NoError(t, err)
			}
			if tc.name == "open, with fn's error" {
				require.ErrorContains(t, err, "fn failed")
			}
			assert.Equal(t, tc.commit, exists(), "committed only by fn's own COMMIT")
			require.True(t, p.free(ctx, k, false), "the lock is released")
		})
	}
}

// awaitGone blocks until backend pid has left pg_stat_activity (the server
// ended the session): an awaited database state, not a sleep.
func awaitGone(ctx context.Context, t *testing.T, pid uint32) {
	t.Helper()
	pgtest.AwaitBackendGone(ctx, t, pgtest.Pool(t), pid)
}

// lock_timeout set on the role: a call without a bound waits as long as it
// allows (55P03, ErrLockTimeout); a call with a bound overrides it for its
// wait; a transaction callback runs with the role's value.
func TestRoleLockTimeout(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"lock_timeout": "1ms"})
	admin := pgtest.Pool(t)
	k := key(t)
	hl := hold(ctx, t, false, k)
	l := newLocker(t, pool, advisory.Config{})
	// No bound and no deadline (a deadline is a bound: it would override
	// the role's lock_timeout).
	unbounded, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := l.WithLock(unbounded, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "55P03", pgErr.Code)

	errc := make(chan error, 1)
	var inFn string
	go func() {
		errc <- l.WithXactLock(ctx, k, &advisory.Options{Timeout: time.Hour}, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&inFn)
		})
	}()
	awaitWaiting(ctx, t, admin, k, 1) // still waiting long past the role's 1ms
	hl.release()
	require.NoError(t, <-errc)
	assert.Equal(t, "1ms", inFn, "the callback runs with the role's lock_timeout")

	// A context deadline is a bound too.
	hl = hold(ctx, t, false, k)
	dctx, dcancel := context.WithTimeout(unbounded, time.Hour)
	defer dcancel()
	go func() { errc <- l.WithLock(dctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }) }()
	awaitWaiting(ctx, t, admin, k, 1)
	hl.release()
	require.NoError(t, <-errc)
}

// idle_session_timeout set on the role ends a held Lock's idle session
// when it is shorter than Config.HeartbeatInterval: the lock is lost
// (ErrLockLost, one TraceLost). The next call works on a fresh connection.
func TestIdleSessionTimeoutLosesAHeldLock(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"idle_session_timeout": "300ms"})
	rec := &recorder{}
	l := newLocker(t, pool, advisory.Config{Tracer: rec}) // heartbeat every 5 s
	k := key(t)
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	select {
	case <-h.Done():
	case <-time.After(time.Minute):
		t.Fatal("the idle-session timeout was not seen")
	}
	require.ErrorIs(t, h.Err(), advisory.ErrLockLost)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, h.Err(), &pgErr)
	assert.Equal(t, "57P05", pgErr.Code)
	require.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
	requireOneLoss(t, rec)

	require.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }))
}

// A heartbeat shorter than idle_session_timeout keeps the session busy
// enough: the lock outlives the timeout.
func TestHeartbeatKeepsAHeldLockPastIdleSessionTimeout(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"idle_session_timeout": "3s"})
	admin := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: 100 * time.Millisecond})
	k := key(t)
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	pid := holderPID(ctx, t, admin, k)
	// Wait, on the server's clock, until the session is older than twice
	// the timeout.
	require.Eventually(t, func() bool {
		var old bool
		err := admin.QueryRow(ctx, "SELECT coalesce(bool_or(now() - backend_start > '6s'), true) FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&old)
		require.NoError(t, err)
		return old
	}, time.Minute, 50*time.Millisecond)
	require.NoError(t, h.Err())
	assert.False(t, newProbe(t).free(ctx, k, false))
	require.NoError(t, h.Unlock(ctx))
}

// A WithLock callback that idles past idle_session_timeout loses its
// session and with it the lock: WithLock returns ErrLockLost, traced once.
func TestIdleSessionTimeoutDuringWithLock(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"idle_session_timeout": "300ms"})
	rec := &recorder{}
	l := newLocker(t, pool, advisory.Config{Tracer: rec})
	err := l.WithLock(ctx, key(t), nil, func(ctx context.Context, conn *pgx.Conn) error {
		awaitGone(ctx, t, conn.PgConn().PID())
		return nil
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)
	requireOneLoss(t, rec)
}

// idle_in_transaction_session_timeout set on the role: a WithXactLock
// callback that idles past it loses the session; the transaction is rolled
// back and the lock released with it; the call fails with COMMIT's error
// (pooltx.ErrNotCommitted, the 25P03 kept: COMMIT never ran). A WithLock callback
// that idles inside its own BEGIN loses the lock (ErrLockLost, traced once)
// and gets ErrCallbackInTx.
func TestIdleInTransactionTimeout(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"idle_in_transaction_session_timeout": "300ms"})
	rec := &recorder{}
	l := newLocker(t, pool, advisory.Config{Tracer: rec})
	p := newProbe(t)
	k := key(t)
	err := l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		awaitGone(ctx, t, tx.Conn().PgConn().PID())
		return nil
	})
	require.ErrorIs(t, err, pooltx.ErrNotCommitted)
	require.NotErrorIs(t, err, pooltx.ErrCommitUnknown)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "25P03", pgErr.Code)
	require.True(t, p.free(ctx, k, false))

	rec.reset()
	err = l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "BEGIN")
		require.NoError(t, err)
		awaitGone(ctx, t, conn.PgConn().PID())
		return nil
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)
	require.ErrorIs(t, err, advisory.ErrCallbackInTx)
	require.ErrorAs(t, err, &pgErr, "the FATAL the ROLLBACK read is kept")
	assert.Equal(t, "25P03", pgErr.Code)
	requireOneLoss(t, rec)
}

// WithLock's doc and the package doc's "Errors": a lock wait that another
// session's pg_cancel_backend ended is a *LockError with the server's
// 57014 in the chain and no sentinel; nothing is held and the callback did
// not run (review 22 found the doc promising a sentinel for every failure).
func TestAForeignCancelOfAWaitMatchesNoSentinel(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	ran := func(context.Context, *pgx.Conn) error { panic("the callback must not run") }
	ranTx := func(context.Context, pgx.Tx) error { panic("the callback must not run") }
	forms := map[string]func(k keys.Key) error{
		"WithLock":     func(k keys.Key) error { return l.WithLock(ctx, k, nil, ran) },
		"WithLockAll":  func(k keys.Key) error { return l.WithLockAll(ctx, []keys.Key{k, key(t)}, nil, ran) },
		"WithXactLock": func(k keys.Key) error { return l.WithXactLock(ctx, k, nil, ranTx) },
		"WithXactLockBatch": func(k keys.Key) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			return l.WithXactLockBatch(ctx, []keys.Key{k}, nil, b)
		},
		"Lock": func(k keys.Key) error {
			h, err := l.Lock(ctx, k, nil)
			if err == nil {
				_ = h.Unlock(ctx)
			}
			return err
		},
	}
	for name, form := range forms {
		t.Run(name, func(t *testing.T) {
			k := key(t)
			h := hold(ctx, t, false, k)
			errc := make(chan error, 1)
			go func() { errc <- form(k) }()
			awaitWaiting(ctx, t, admin, k, 1)
			_, o, _ := k.PgLocks()
			_, err := admin.Exec(ctx, `SELECT pg_cancel_backend(pid) FROM pg_locks
				WHERE locktype = 'advisory' AND NOT granted AND objid = $1`, o)
			require.NoError(t, err)
			err = <-errc
			var le *advisory.LockError
			require.ErrorAs(t, err, &le)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			assert.Equal(t, "57014", pgErr.Code)
			for _, s := range []error{advisory.ErrNotAcquired, advisory.ErrLockTimeout, advisory.ErrNoConnection,
				advisory.ErrDeadlock, advisory.ErrTooManyLocks, advisory.ErrNotHeld, advisory.ErrLockLost,
				advisory.ErrCallbackInTx, advisory.ErrTxAborted, advisory.ErrInvalid, context.Canceled} {
				assert.NotErrorIs(t, err, s)
			}
			h.release()
			assert.True(t, newProbe(t).free(ctx, k, false), "nothing is held")
		})
	}
}

// The package doc's idle_in_transaction_session_timeout entry: a WithLock
// callback that idles inside its own BEGIN and then runs a statement whose
// error it ignores has found the connection closed: ErrLockLost alone.
func TestIdleInTransactionTimeoutThenAnIgnoredStatement(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"idle_in_transaction_session_timeout": "300ms"})
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	err := l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "BEGIN")
		require.NoError(t, err)
		awaitGone(ctx, t, conn.PgConn().PID())
		_, err = conn.Exec(ctx, "SELECT 1")
		require.Error(t, err) // and ignored
		return nil
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)
	assert.NotErrorIs(t, err, advisory.ErrCallbackInTx)
	assert.True(t, newProbe(t).free(ctx, k, false))
}

// The package doc's idle_in_transaction_session_timeout entry: a
// WithXactLock callback that idles past it and then runs a statement whose
// error it ignores has found the connection closed: ErrCommitUnknown.
func TestIdleInTransactionTimeoutThenAnIgnoredStatementInAnXactCallback(t *testing.T) {
	ctx := testCtx(t)
	pool := rolePool(t, map[string]string{"idle_in_transaction_session_timeout": "300ms"})
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	err := l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		awaitGone(ctx, t, tx.Conn().PgConn().PID())
		_, err := tx.Exec(ctx, "SELECT 1")
		require.Error(t, err) // and ignored
		return nil
	})
	require.ErrorIs(t, err, pooltx.ErrCommitUnknown)
	assert.True(t, newProbe(t).free(ctx, k, false))
}

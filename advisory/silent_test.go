package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// A server, or a network, that goes silent for one request: the call's own
// bound (Options.Timeout, Config.LockTimeout), not only ctx's deadline,
// ends every wait of the call, and the error says the bound was reached.
// (Review round 8.)

// swallowingPool returns a pool whose connections go through a proxy, in plain
// TCP so that the proxy can swallow a request by its text; mode, when given,
// is the pool's exec mode.
func swallowingPool(t *testing.T, mode ...pgx.QueryExecMode) (*pgxpool.Pool, *tcpproxy.Proxy) {
	t.Helper()
	cfg := pgtest.Config(t)
	proxy := proxied(t, cfg)
	cfg.ConnConfig.TLSConfig = nil
	for _, m := range mode {
		cfg.ConnConfig.DefaultQueryExecMode = m
	}
	return pgtest.NewPool(t, cfg), proxy
}

// hangUp closes every connection through proxy, so that whatever waits on
// a swallowed request fails at once.
func hangUp(proxy *tcpproxy.Proxy) {
	proxy.Swallow(nil)
	proxy.Cut()
	proxy.CloseCut()
}

// TestHandleWaitForAHolderTurnKeepsItsBound: a handle call that waits for
// the turn of a shared holder connection gives up at its bound (or when
// ctx is cancelled), while the holder's watcher still holds the turn
// through a heartbeat the network does not answer. It waited again, with
// no bound, to undo its record, so it returned only when the heartbeat
// gave up.
func TestHandleWaitForAHolderTurnKeepsItsBound(t *testing.T) {
	const bound = 100 * time.Millisecond
	for _, c := range []struct {
		name   string
		try    bool
		cancel bool
	}{
		{"TryLock, Config.LockTimeout", true, false},
		{"TryLock, ctx cancelled", true, true},
		{"Lock, Options.Timeout", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			pool, proxy := swallowingPool(t)
			l := newLocker(t, pool, advisory.Config{LockTimeout: bound,
				HeartbeatInterval: 20 * time.Millisecond, HeartbeatTimeout: 20 * time.Second})
			h1, err := l.TryLock(ctx, key(t), nil)
			require.NoError(t, err)
			defer func() { _ = h1.Unlock(ctx) }()
			defer hangUp(proxy)
			proxy.Swallow([]byte("-- ping")) // pgx's Ping: the watcher's next heartbeat
			require.Eventually(t, func() bool { return proxy.Swallowed() > 0 }, 10*time.Second, time.Millisecond,
				"the holder's watcher pings and waits, holding the turn")

			cctx := ctx
			if c.cancel {
				var cancel context.CancelFunc
				cctx, cancel = context.WithCancel(ctx)
				defer cancel()
				time.AfterFunc(bound/2, cancel)
			}
			var h2 *advisory.Lock
			if c.try {
				h2, err = l.TryLock(cctx, key(t), nil)
			} else {
				h2, err = l.Lock(cctx, key(t), &advisory.Options{Timeout: bound})
			}
			if h2 != nil {
				_ = h2.Unlock(ctx)
			}
			require.Error(t, err)
			assert.NoError(t, h1.Err(), "the call returned while the heartbeat still held the turn")
			assert.ErrorIs(t, err, advisory.ErrNoConnection)
			if c.cancel {
				assert.ErrorIs(t, err, context.Canceled)
			} else {
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			}
		})
	}
}

// TestProxyCheckKeepsTheBound: the first session calls of a Locker check
// for a connection proxy (DetectProxy, one query) within their bounds: a
// server that does not answer the query ends each at its bound with
// ErrNoConnection, and a later call checks again. A call whose check hangs
// holds no other call: the others check on their own connections. The
// check ran under ctx alone, and later calls queued behind it (review
// rounds 8 and 9).
func TestProxyCheckKeepsTheBound(t *testing.T) {
	guard, cancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer cancel()
	pool, proxy := swallowingPool(t)
	defer hangUp(proxy)
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1})
	proxy.Swallow([]byte("pg_backend_pid"))

	// A first call with no bound but the guard: its check hangs.
	first := make(chan error, 1)
	go func() { first <- l.WithLock(guard, key(t), nil, noopSession) }()
	require.Eventually(t, func() bool { return proxy.Swallowed() > 0 }, 10*time.Second, time.Millisecond,
		"the first call's check is on its way")

	err := l.WithLock(guard, key(t), &advisory.Options{Timeout: 100 * time.Millisecond}, noopSession)
	assert.ErrorIs(t, err, advisory.ErrNoConnection, "its own check, unanswered")
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	proxy.Swallow(nil)
	require.NoError(t, l.WithLock(guard, key(t), nil, noopSession), "a later call checks again, on its own connection")
	select {
	case err := <-first:
		t.Fatalf("the first call's check cannot have been answered: %v", err)
	default:
	}
	assert.NoError(t, guard.Err(), "no call waited for the hanging check")
}

// TestProxyCheckAtCtxDeadlineIsNoConnection: a proxy check that ctx's own
// deadline ends is ErrNoConnection too, for every form: no lock was waited
// for (a Try call never waits for one), so not ErrLockTimeout. (Review
// round 9.)
func TestProxyCheckAtCtxDeadlineIsNoConnection(t *testing.T) {
	for _, c := range []struct {
		name string
		op   func(ctx context.Context, l *advisory.Locker) error
	}{
		{"WithLock", func(ctx context.Context, l *advisory.Locker) error {
			return l.WithLock(ctx, key(t), nil, noopSession)
		}},
		{"WithLock, Options.Timeout later than ctx's deadline", func(ctx context.Context, l *advisory.Locker) error {
			return l.WithLock(ctx, key(t), &advisory.Options{Timeout: time.Minute}, noopSession)
		}},
		{"TryWithLock", func(ctx context.Context, l *advisory.Locker) error {
			return l.TryWithLock(ctx, key(t), nil, noopSession)
		}},
		{"TryLock", func(ctx context.Context, l *advisory.Locker) error { return tryHandleCycle(ctx, l, key(t)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool, proxy := swallowingPool(t)
			defer hangUp(proxy)
			l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1})
			proxy.Swallow([]byte("pg_backend_pid"))
			ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
			defer cancel()
			err := c.op(ctx, l)
			assert.Positive(t, proxy.Swallowed(), "the check went unanswered")
			assert.ErrorIs(t, err, advisory.ErrNoConnection)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.NotErrorIs(t, err, advisory.ErrLockTimeout)
		})
	}
}

// TestSilentServerAtTheBoundIsALockTimeout: a lock statement the server
// does not answer ends at the call's bound (plus the grace the server's
// own lock_timeout is given) with ErrLockTimeout and
// context.DeadlineExceeded, whether the bound is ctx's deadline or the
// call's timeout. With the call's timeout the error was the socket's i/o
// timeout alone, matching no sentinel.
func TestSilentServerAtTheBoundIsALockTimeout(t *testing.T) {
	const bound = 100 * time.Millisecond
	timeout := &advisory.Options{Timeout: bound}
	for _, c := range []struct {
		name string
		op   func(ctx context.Context, l *advisory.Locker, pool *pgxpool.Pool) error
	}{
		{"WithLock", func(ctx context.Context, l *advisory.Locker, _ *pgxpool.Pool) error {
			return l.WithLock(ctx, key(t), timeout, noopSession)
		}},
		{"WithLock, ctx's deadline", func(ctx context.Context, l *advisory.Locker, _ *pgxpool.Pool) error {
			dctx, cancel := context.WithTimeout(ctx, bound)
			defer cancel()
			return l.WithLock(dctx, key(t), &advisory.Options{Timeout: -1}, noopSession)
		}},
		{"WithLockAll", func(ctx context.Context, l *advisory.Locker, _ *pgxpool.Pool) error {
			return l.WithLockAll(ctx, []keys.Key{key(t), key(t)}, timeout, noopSession)
		}},
		{"Lock, Config.LockTimeout", func(ctx context.Context, l *advisory.Locker, _ *pgxpool.Pool) error {
			return handleCycle(ctx, l, key(t))
		}},
		{"WithXactLock", func(ctx context.Context, l *advisory.Locker, _ *pgxpool.Pool) error {
			return l.WithXactLock(ctx, key(t), timeout, noopXact)
		}},
		{"WithXactLockAll", func(ctx context.Context, l *advisory.Locker, _ *pgxpool.Pool) error {
			return l.WithXactLockAll(ctx, []keys.Key{key(t), key(t)}, timeout, noopXact)
		}},
		{"LockInTx", func(ctx context.Context, l *advisory.Locker, pool *pgxpool.Pool) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			return l.LockInTx(ctx, tx, key(t), timeout)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(testCtx(t), 15*time.Second) // a guard
			defer cancel()
			pool, proxy := swallowingPool(t)
			defer hangUp(proxy)
			// AllowProxy: no proxy check (the proxy here is a plain TCP one), so
			// that the lock statement is the first of the pool: prepared, so sent
			// by its text, which the proxy swallows.
			l := newLocker(t, pool, advisory.Config{LockTimeout: bound, HeartbeatInterval: -1, AllowProxy: true})
			proxy.Swallow([]byte("pg_catalog.pg_advisory_"))
			err := c.op(ctx, l, pool)
			assert.Positive(t, proxy.Swallowed(), "the lock statement went unanswered")
			assert.ErrorIs(t, err, advisory.ErrLockTimeout)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.NotErrorIs(t, err, context.Canceled)
			assert.NoError(t, ctx.Err(), "ended by the call's bound, not the guard")
		})
	}
}

// TestSilentTryStatementIsNoConnection: a Try call's statement, which
// waits for no lock, is bounded too: a server or network that does not
// answer it ends the call at Config.LockTimeout (else DefaultTryConnWait),
// or at ctx's deadline if sooner, with ErrNoConnection and
// context.DeadlineExceeded, never ErrLockTimeout; on a shared holder
// connection holding other locks, at the holder's statement bound
// (Config.CleanupTimeout here); on one opened for the call, at the Try
// bound (it paid the holder's bound too).
// The statement ran under ctx alone: with ctx's deadline the call was an
// ErrLockTimeout, without one it never ended; on a holder connection its
// error matched no sentinel. (Review round 9.)
func TestSilentTryStatementIsNoConnection(t *testing.T) {
	const bound = 200 * time.Millisecond
	for _, c := range []struct {
		name   string
		cfg    advisory.Config
		ctxDL  bool // the bound is ctx's deadline
		holder bool // a first TryLock makes a holder connection the call then uses
		op     func(ctx context.Context, l *advisory.Locker) error
	}{
		{name: "TryWithLock, Config.LockTimeout", cfg: advisory.Config{LockTimeout: bound},
			op: func(ctx context.Context, l *advisory.Locker) error {
				return l.TryWithLock(ctx, key(t), nil, noopSession)
			}},
		{name: "TryWithLock, ctx's deadline", ctxDL: true,
			op: func(ctx context.Context, l *advisory.Locker) error {
				return l.TryWithLock(ctx, key(t), nil, noopSession)
			}},
		{name: "TryWithXactLock, Config.LockTimeout", cfg: advisory.Config{LockTimeout: bound},
			op: func(ctx context.Context, l *advisory.Locker) error {
				return l.TryWithXactLock(ctx, key(t), nil, noopXact)
			}},
		{name: "TryWithXactLock, ctx's deadline", ctxDL: true,
			op: func(ctx context.Context, l *advisory.Locker) error {
				return l.TryWithXactLock(ctx, key(t), nil, noopXact)
			}},
		{name: "TryLock on a connection of its own", cfg: advisory.Config{LockTimeout: bound, CleanupTimeout: time.Minute},
			op: func(ctx context.Context, l *advisory.Locker) error { return tryHandleCycle(ctx, l, key(t)) }},
		{name: "TryLock on a holder connection", cfg: advisory.Config{CleanupTimeout: bound}, holder: true,
			op: func(ctx context.Context, l *advisory.Locker) error { return tryHandleCycle(ctx, l, key(t)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			guard, cancel := context.WithTimeout(testCtx(t), 15*time.Second)
			defer cancel()
			// The Exec mode sends each statement's text every time, for the
			// proxy to find.
			pool, proxy := swallowingPool(t, pgx.QueryExecModeExec)
			defer hangUp(proxy)
			lc := c.cfg
			lc.HeartbeatInterval, lc.AllowProxy = -1, true
			l := newLocker(t, pool, lc)
			if c.holder {
				h, err := l.TryLock(guard, key(t), nil)
				require.NoError(t, err)
				defer func() { _ = h.Unlock(guard) }()
			}
			proxy.Swallow([]byte("pg_try_advisory"))
			ctx := guard
			if c.ctxDL {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(guard, bound)
				defer cancel()
			}
			err := c.op(ctx, l)
			assert.Positive(t, proxy.Swallowed(), "the try statement went unanswered")
			assert.ErrorIs(t, err, advisory.ErrNoConnection)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.NotErrorIs(t, err, advisory.ErrLockTimeout, "a Try call waits for no lock")
			assert.NoError(t, guard.Err(), "ended by the call's bound, not the guard")
		})
	}
}

// TestBatchPreparationUnansweredKeepsCtxError: a batch whose statements pgx
// must prepare first, on a connection that went silent, ends at ctx's
// deadline (and the half second of grace) with nothing committed and ctx's
// error in the chain: the preparation's failure read as a batch pgx had
// refused, a bare i/o timeout. (Review round 10.)
func TestBatchPreparationUnansweredKeepsCtxError(t *testing.T) {
	pool, proxy := swallowingPool(t)
	defer hangUp(proxy)
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1, AllowProxy: true})
	guard, cancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer cancel()
	ks := []keys.Key{key(t)}
	require.NoError(t, l.WithXactLockBatch(guard, ks, nil, selectOne())) // the connection, warm
	proxy.Cut()
	ctx, cancel2 := context.WithTimeout(guard, 200*time.Millisecond) // a deadline: a lock_timeout statement to prepare
	defer cancel2()
	b := &pgx.Batch{}
	b.Queue("SELECT 2") // not prepared yet either
	err := l.WithXactLockBatch(ctx, ks, nil, b)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, errors.Is(err, pooltx.ErrNotCommitted) || errors.Is(err, pooltx.ErrCommitUnknown), "%v", err)
	assert.NoError(t, guard.Err())
}

// TestLostHolderCallGoesOnElsewhere: a call whose holder connection does
// not answer within the holder's statement bound loses that connection,
// with its locks, and goes on on another connection, where it is granted.
// (Review round 10 read the package doc as promising ErrNoConnection here.)
func TestLostHolderCallGoesOnElsewhere(t *testing.T) {
	ctx := testCtx(t)
	pool, proxy := swallowingPool(t)
	defer hangUp(proxy)
	l := newLocker(t, pool, advisory.Config{CleanupTimeout: 300 * time.Millisecond, HeartbeatInterval: -1, LockTimeout: 5 * time.Second})
	h1, err := l.TryLock(ctx, key(t), nil)
	require.NoError(t, err)
	proxy.Cut() // the holder connection goes silent; new connections are fine
	h2, err := l.TryLock(ctx, key(t), nil)
	require.NoError(t, err, "granted on another connection")
	defer func() { _ = h2.Unlock(ctx) }()
	select {
	case <-h1.Done():
	case <-ctx.Done():
		t.Fatal("the silent holder's lock was not lost")
	}
	assert.ErrorIs(t, h1.Err(), advisory.ErrLockLost)
	_ = h1.Unlock(ctx)
}

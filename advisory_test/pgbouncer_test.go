package advisory_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgbouncer"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// startBouncer runs a PgBouncer in transaction pooling mode in front of the test
// database, with poolSize server connections (0: PgBouncer's 20). The test fails, never
// skips, when it cannot start. It is stopped after the pools using it are closed.
func startBouncer(t *testing.T, poolSize int) *pgbouncer.Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{
		Upstream: pgtest.DSN(t), PoolMode: pgbouncer.PoolTransaction, PoolSize: poolSize,
	})
	if errors.Is(err, pgbouncer.ErrNoBinary) {
		pgtest.MissingTool(t, "PgBouncer", err) // skips, or fails under PGXLOCK_TEST_STRICT=1
	}
	if err != nil {
		t.Fatalf("this test needs PgBouncer in front of the test database, and it did not start: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("PgBouncer log:\n%s", b.Log())
		}
		if err := b.Stop(); err != nil {
			t.Errorf("stop PgBouncer: %v", err)
		}
	})
	return b
}

// bouncerConfig is a pool configuration through b with an exec mode PgBouncer 1.18
// accepts in transaction mode: QueryExecModeExec sends Parse/Bind/Execute of an unnamed
// statement with one Sync, so every statement (and a whole batch) stays on one server
// connection. pgx's default, the statement cache, fails with 42P05 once a named
// statement meets a server connection that already has it.
func bouncerConfig(t *testing.T, b *pgbouncer.Bouncer) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.DSN())
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	cfg.MaxConns = 8
	return cfg
}

func bouncerPool(t *testing.T, b *pgbouncer.Bouncer) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t, bouncerConfig(t, b))
}

// keyFree reports, from q (another session), whether k can be taken exclusively now.
func keyFree(t *testing.T, ctx context.Context, q *pgxpool.Pool, k keys.Key) bool {
	t.Helper()
	free := true
	err := newLocker(t, q, advisory.Config{}).TryWithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
	if errors.Is(err, advisory.ErrNotAcquired) {
		free = false
	} else {
		require.NoError(t, err)
	}
	return free
}

// DetectProxy sees PgBouncer (it announces a backend PID of its own) and sees no proxy
// on a direct connection.
func TestPgBouncerDetectProxy(t *testing.T) {
	ctx := testCtx(t)
	b := startBouncer(t, 0)
	t.Logf("%s, transaction pooling, %s", b.Version(), b.DSN())
	for _, tc := range []struct {
		name string
		pool *pgxpool.Pool
		want bool
	}{{"direct", pgtest.Pool(t), false}, {"through PgBouncer", bouncerPool(t, b), true}} {
		require.NoError(t, tc.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
			proxied, err := advisory.DetectProxy(ctx, c.Conn())
			require.NoError(t, err)
			assert.Equal(t, tc.want, proxied, tc.name)
			return nil
		}), tc.name)
	}
}

// Every session-scope call through a detected proxy fails with ErrProxy before taking
// anything, and its callback does not run.
func TestPgBouncerRefusesSessionLocks(t *testing.T) {
	ctx := testCtx(t)
	b := startBouncer(t, 0)
	pool, direct := bouncerPool(t, b), pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	k, k2 := int64Key(t), pairKey(t)

	ran := false
	connFn := func(context.Context, *pgx.Conn) error { ran = true; return nil }
	holdFn := func(context.Context) error { ran = true; return nil }
	calls := map[string]func() error{
		"WithLock":       func() error { return l.WithLock(ctx, k, nil, connFn) },
		"TryWithLock":    func() error { return l.TryWithLock(ctx, k, nil, connFn) },
		"WithLockAll":    func() error { return l.WithLockAll(ctx, []keys.Key{k, k2}, nil, connFn) },
		"TryWithLockAll": func() error { return l.TryWithLockAll(ctx, []keys.Key{k, k2}, nil, connFn) },
		"Hold":           func() error { return l.Hold(ctx, k, nil, holdFn) },
		"TryHold":        func() error { return l.TryHold(ctx, k, &advisory.Options{Shared: true}, holdFn) },
		"Lock": func() error {
			h, err := l.Lock(ctx, k, nil)
			assert.Nil(t, h)
			return err
		},
		"TryLockAll": func() error {
			h, err := l.TryLockAll(ctx, []keys.Key{k, k2}, nil)
			assert.Nil(t, h)
			return err
		},
	}
	for name, call := range calls {
		err := call()
		assert.ErrorIs(t, err, advisory.ErrProxy, name)
		var le *advisory.LockError
		assert.ErrorAs(t, err, &le, name)
		assert.False(t, ran, "%s ran its callback", name)
	}
	t.Logf("refusal: %v", l.WithLock(ctx, k, nil, connFn))
	assert.True(t, keyFree(t, ctx, direct, k) && keyFree(t, ctx, direct, k2), "a refused call left a lock")
	assert.Zero(t, pool.Stat().AcquiredConns())
}

// Transaction-scope locks work through PgBouncer in transaction mode and exclude other
// sessions, in both directions: against a direct pool and against each other.
func TestPgBouncerXactLocks(t *testing.T) {
	ctx := testCtx(t)
	b := startBouncer(t, 0)
	pool, direct := bouncerPool(t, b), pgtest.Pool(t)
	lb, ld := newLocker(t, pool, advisory.Config{}), newLocker(t, direct, advisory.Config{})
	k, k2 := int64Key(t), pairKey(t)

	// Held through the bouncer: the server shows the transaction's backend holding it,
	// and another pool cannot take it.
	require.NoError(t, lb.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		var pid int32
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		assert.Equal(t, map[keys.Key]int32{k: pid}, holderPIDs(t, ctx, direct, k))
		err := ld.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		assert.ErrorIs(t, err, advisory.ErrNotAcquired, "a direct session took a key held through the bouncer")
		return nil
	}))
	assert.True(t, keyFree(t, ctx, direct, k), "released at COMMIT")

	// Held by a direct session: the bouncer's callers are excluded, wait with a
	// timeout, and wait for several keys until it goes.
	h, err := ld.Lock(ctx, k2, nil)
	require.NoError(t, err)
	err = lb.TryWithXactLock(ctx, k2, nil, func(context.Context, pgx.Tx) error { return nil })
	assert.ErrorIs(t, err, advisory.ErrNotAcquired)
	err = lb.WithXactLock(ctx, k2, &advisory.Options{Timeout: 50 * time.Millisecond}, func(context.Context, pgx.Tx) error { return nil })
	assert.ErrorIs(t, err, advisory.ErrLockTimeout)
	got := make(chan error, 1)
	var unlocking atomic.Bool // set before the direct session starts to unlock
	go func() {
		got <- lb.WithXactLockAll(ctx, []keys.Key{k2, k}, nil, func(ctx context.Context, tx pgx.Tx) error {
			if !unlocking.Load() {
				return errors.New("entered while the direct session held the key")
			}
			return nil
		})
	}()
	awaitLocks(t, ctx, direct, "the bouncer's transaction to wait", func(ls []advisory.LockInfo) bool { return waiters(ls) == 1 }, k2)
	unlocking.Store(true)
	require.NoError(t, h.Unlock(ctx))
	require.NoError(t, await(t, got, "WithXactLockAll through the bouncer"))

	// Read-modify-write of a counter under the lock, from both sides at once: lost
	// updates or two callbacks inside at once would show.
	schema := pgtest.Schema(t, direct)
	counter := pgx.Identifier{schema, "counter"}.Sanitize()
	_, err = direct.Exec(ctx, "CREATE TABLE "+counter+" (n int NOT NULL); INSERT INTO "+counter+" VALUES (0)")
	require.NoError(t, err)
	const perWorker = 15
	var inside, overlaps atomic.Int32
	increment := func(ctx context.Context, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) error {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer inside.Add(-1)
		var n int
		if err := q.QueryRow(ctx, "SELECT n FROM "+counter).Scan(&n); err != nil {
			return err
		}
		return q.QueryRow(ctx, "UPDATE "+counter+" SET n = $1 RETURNING n", n+1).Scan(&n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*perWorker)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				if w%2 == 0 { // through the bouncer, transaction scope
					errs <- lb.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error { return increment(ctx, tx) })
				} else { // direct, session scope: the same lock
					errs <- ld.WithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error { return increment(ctx, c) })
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, direct.QueryRow(ctx, "SELECT n FROM "+counter).Scan(&n))
	assert.Equal(t, 8*perWorker, n, "lost updates")
	assert.Zero(t, overlaps.Load(), "two callbacks inside at once")
	assert.Zero(t, pool.Stat().AcquiredConns())
}

// Why session locks are refused: through transaction pooling, a session lock stays on
// whichever server connection ran the statement, and that connection serves every
// client in turn. A second client "acquires" the held key (the lock is re-entrant in the
// server session they share) and can release it; the first cannot even unlock. Shown
// with raw SQL and with the library opted in (AllowProxy). One server connection makes
// the interleaving deterministic; with more, it is merely likely.
func TestPgBouncerSessionLocksLoseExclusion(t *testing.T) {
	ctx := testCtx(t)
	b := startBouncer(t, 1)
	direct := pgtest.Pool(t)
	k := int64Key(t)
	v, _ := k.Int64()

	connect := func() *pgx.Conn {
		cfg := bouncerConfig(t, b).ConnConfig
		c, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	c1, c2 := connect(), connect()
	t.Cleanup(func() {
		// The lock may still sit on the bouncer's server connection: drop it there.
		_, _ = c1.Exec(context.Background(), "SELECT pg_advisory_unlock_all()")
	})
	var ok bool
	_, err := c1.Exec(ctx, "SELECT pg_advisory_lock($1)", v)
	require.NoError(t, err)
	require.NoError(t, c2.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", v).Scan(&ok))
	assert.True(t, ok, "raw SQL: the second client did not get the key the first holds")
	holder := holderPIDs(t, ctx, direct, k)[k]
	t.Logf("raw SQL: client 1 (announced pid %d) locked, client 2 (announced pid %d) try-locked: %v; the server shows one holder, the bouncer's backend %d",
		c1.PgConn().PID(), c2.PgConn().PID(), ok, holder)
	_, err = c2.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	require.NoError(t, err)
	assert.True(t, keyFree(t, ctx, direct, k), "client 2 released client 1's lock")
	require.NoError(t, c1.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", v).Scan(&ok))
	assert.False(t, ok, "client 1 still held its lock")

	// The library, opted in with AllowProxy: B enters while A is inside (the
	// bouncer ran B's statements on A's backend, where the lock stacks). What
	// A's unlock then finds depends on what B's release ran there: B's
	// callback sent nothing, so B's unlock alone, and A's lock is still
	// stacked under it (nil); after a reset, pg_advisory_unlock_all() would
	// have taken it (ErrNotHeld). Either way the exclusion was lost.
	lA := newLocker(t, bouncerPool(t, b), advisory.Config{AllowProxy: true})
	lB := newLocker(t, bouncerPool(t, b), advisory.Config{AllowProxy: true})
	bInside := false
	var bErr error
	aErr := lA.WithLock(ctx, k, nil, func(ctx context.Context, _ *pgx.Conn) error {
		bErr = lB.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error {
			bInside = true
			return nil
		})
		return nil
	})
	assert.NoError(t, bErr)
	assert.True(t, bInside, "B did not enter while A held the key")
	assert.True(t, aErr == nil || errors.Is(aErr, advisory.ErrNotHeld), "A's unlock: %v", aErr)
	t.Logf("AllowProxy: A inside, B.TryWithLock: %v (entered: %v); A's WithLock: %v", bErr, bInside, aErr)
	assert.True(t, keyFree(t, ctx, direct, k))
}

package advisory_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// 64 goroutines of one Locker wait for a key held elsewhere: between them
// they pin one connection, the rest of the pool stays free for the
// application, and they get the key in the order they queued.
func TestLocalQueuePinsOneConnectionAndKeepsFIFO(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 10
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	h := hold(ctx, t, false, k)

	const n = 64
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		order []int
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			assert.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				return nil
			}))
		}(i)
		if i == 0 {
			awaitWaiting(ctx, t, p.pool, k, 1) // the first waiter is on the server
		}
	}
	// Only the head waits on the server; give the rest time to queue by
	// observing the state that matters: one waiter on the server, one
	// pinned connection, while all n calls are in flight.
	require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 1 }, 5*time.Second, time.Millisecond)
	var waiting int
	require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND NOT granted AND pid IN
		(SELECT pid FROM pg_stat_activity WHERE application_name = $1)`, cfg.ConnConfig.RuntimeParams["application_name"]).Scan(&waiting))
	assert.Equal(t, 1, waiting, "one waiter on the server for 64 goroutines")

	// The application's own queries still have the other 9 connections.
	conns := make([]interface{ Release() }, 0, 9)
	for i := 0; i < 9; i++ {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err, "the pool must not be starved by waiters")
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}

	h.release()
	wg.Wait()
	require.Len(t, order, n)
	assert.Equal(t, 0, order[0], "the first to queue is first served")
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

func TestLocalQueueTimeoutAndCancel(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{LockTimeout: 150 * time.Millisecond})
	p := newProbe(t)
	k := key(t)
	hold(ctx, t, false, k)

	errs := make(chan error, 3)
	go func() {
		errs <- l.WithLock(ctx, k, &advisory.Options{Timeout: 3 * time.Second}, func(context.Context, *pgx.Conn) error { return nil })
	}()
	awaitWaiting(ctx, t, p.pool, k, 1)
	// Queued behind the head: its own timeout still applies. The event that shows it: it
	// gives up while the head is still waiting (no wall-clock bound to miss under load).
	err := l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	select {
	case headErr := <-errs:
		t.Fatalf("the head (3s bound) returned before the queued call (150ms bound) gave up: %v", headErr)
	default:
	}
	// And so does cancellation.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		errs <- l.WithLock(cctx, k, &advisory.Options{Timeout: -1}, func(context.Context, *pgx.Conn) error { return nil })
	}()
	cancel()
	assert.ErrorIs(t, <-errs, context.Canceled)
	assert.ErrorIs(t, <-errs, advisory.ErrLockTimeout, "the head times out on the server after 3s")
}

func TestMaxConnsCapsPinnedConnections(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 8
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{MaxConns: 2})
	ks := []keys.Key{key(t), key(t), key(t)}

	a, err := l.Lock(ctx, ks[0], nil)
	require.NoError(t, err)
	b, err := l.Lock(ctx, ks[1], nil)
	require.NoError(t, err)

	// A third lock on another key waits for a slot, not for the key.
	got := make(chan *advisory.Lock, 1)
	go func() {
		c, err := l.Lock(ctx, ks[2], nil)
		assert.NoError(t, err)
		got <- c
	}()
	select {
	case <-got:
		t.Fatal("third lock pinned a connection over the cap")
	case <-time.After(100 * time.Millisecond):
	}
	assert.EqualValues(t, 2, pool.Stat().AcquiredConns())

	// Try calls count against the cap too, and their wait is bounded.
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = l.TryLock(tctx, key(t), nil)
	require.Error(t, err)

	require.NoError(t, a.Unlock(ctx))
	c := <-got
	require.NoError(t, b.Unlock(ctx))
	require.NoError(t, c.Unlock(ctx))
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

// The invariant of the local queue (gate.go): a call waits in process only
// where PostgreSQL would make it wait too. Each case below is one where the
// server grants at once; the call has a generous timeout, so a local wait
// shows up as ErrLockTimeout rather than as a hang. Regression (issue 10
// item 1): a multi-key call took the queue of every key before its lock
// statement ran, and kept them while the server made it wait for the first.
func TestLocalQueueWaitsOnlyWherePostgresWould(t *testing.T) {
	ctx := testCtx(t)
	bound := &advisory.Options{Timeout: 5 * time.Second}
	noop := func(context.Context, *pgx.Conn) error { return nil }
	sorted := func() (keys.Key, keys.Key) {
		ks := keys.Normalize([]keys.Key{key(t), key(t)})
		return ks[0], ks[1]
	}

	t.Run("a later key of a multi-key call that waits for its first", func(t *testing.T) {
		pool := pgtest.Pool(t)
		l := newLocker(t, pool, advisory.Config{})
		p := newProbe(t)
		k1, k2 := sorted()
		a, err := l.Lock(ctx, k1, nil)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- l.WithLockAll(ctx, []keys.Key{k1, k2}, nil, noop) }()
		awaitWaiting(ctx, t, p.pool, k1, 1)

		// k2 is free on the server: plain SQL would get it at once.
		require.NoError(t, l.WithLock(ctx, k2, bound, noop), "the holder of k1 asks for k2, free on the server")
		require.NoError(t, a.Unlock(ctx))
		require.NoError(t, <-done)
	})

	t.Run("the first key of a shared multi-key call that waits for a later one", func(t *testing.T) {
		pool := pgtest.Pool(t)
		l := newLocker(t, pool, advisory.Config{})
		p := newProbe(t)
		k1, k2 := sorted()
		x := hold(ctx, t, false, k2)
		shared := &advisory.Options{Shared: true}
		done := make(chan error, 1)
		go func() { done <- l.WithLockAll(ctx, []keys.Key{k1, k2}, shared, noop) }()
		awaitWaiting(ctx, t, p.pool, k2, 1) // it holds k1 shared, waits for k2

		require.NoError(t, l.WithLock(ctx, k1, &advisory.Options{Shared: true, Timeout: bound.Timeout}, noop),
			"a shared lock of k1, held only in shared mode")
		x.release()
		require.NoError(t, <-done)
	})

	// What the queue is for holds for multi-key calls too: exclusive calls
	// waiting for the same first key pin one connection between them.
	t.Run("exclusive multi-key waiters still pin one connection", func(t *testing.T) {
		cfg := pgtest.Config(t)
		cfg.MaxConns = 10
		pool := pgtest.NewPool(t, cfg)
		l := newLocker(t, pool, advisory.Config{})
		p := newProbe(t)
		k1, k2 := sorted()
		x := hold(ctx, t, false, k1)
		const n = 16
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { assert.NoError(t, l.WithLockAll(ctx, []keys.Key{k1, k2}, nil, noop)) })
		}
		awaitWaiting(ctx, t, p.pool, k1, 1)
		require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 1 }, 5*time.Second, time.Millisecond)
		var waiting int
		require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND NOT granted AND pid IN
			(SELECT pid FROM pg_stat_activity WHERE application_name = $1)`, cfg.ConnConfig.RuntimeParams["application_name"]).Scan(&waiting))
		assert.Equal(t, 1, waiting, "one waiter on the server for all the calls")
		x.release()
		wg.Wait()
		assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	})
}

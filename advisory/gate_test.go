package advisory_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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
// they pin two connections (two waiters on the server), the rest of the
// pool stays free for the application, and they get the key in the order
// they queued.
func TestLocalQueuePinsTwoConnectionsAndKeepsFIFO(t *testing.T) {
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
	// Only the first two wait on the server; give the rest time to queue by
	// observing the state that matters: two waiters on the server, two
	// pinned connections, the others in the local queue.
	require.Eventually(t, func() bool { return advisory.LocalWaiters(l, k) == n-2 }, 10*time.Second, time.Millisecond)
	awaitWaiting(ctx, t, p.pool, k, 2)
	assert.EqualValues(t, 2, pool.Stat().AcquiredConns())
	var waiting int
	require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND NOT granted AND pid IN
		(SELECT pid FROM pg_stat_activity WHERE application_name = $1)`, cfg.ConnConfig.RuntimeParams["application_name"]).Scan(&waiting))
	assert.Equal(t, 2, waiting, "two waiters on the server for 64 goroutines")

	// The application's own queries still have the other 8 connections.
	conns := make([]interface{ Release() }, 0, 8)
	for i := 0; i < 8; i++ {
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

	// Two heads wait on the server; the calls after them queue in process.
	errs := make(chan error, 4)
	for range 2 {
		go func() {
			errs <- l.WithLock(ctx, k, &advisory.Options{Timeout: 3 * time.Second}, func(context.Context, *pgx.Conn) error { return nil })
		}()
	}
	awaitWaiting(ctx, t, p.pool, k, 2)
	// Queued behind the heads: its own timeout still applies. The event that shows it: it
	// gives up while the heads are still waiting (no wall-clock bound to miss under load).
	err := l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	select {
	case headErr := <-errs:
		t.Fatalf("a head (3s bound) returned before the queued call (150ms bound) gave up: %v", headErr)
	default:
	}
	// And so does cancellation, of a call seen waiting in the local queue.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		errs <- l.WithLock(cctx, k, &advisory.Options{Timeout: -1}, func(context.Context, *pgx.Conn) error { return nil })
	}()
	require.Eventually(t, func() bool { return advisory.LocalWaiters(l, k) == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-errs, context.Canceled)
	assert.Zero(t, advisory.LocalWaiters(l, k), "the cancelled call left the queue")
	assert.ErrorIs(t, <-errs, advisory.ErrLockTimeout, "a head times out on the server after 3s")
	assert.ErrorIs(t, <-errs, advisory.ErrLockTimeout, "a head times out on the server after 3s")
}

func TestMaxConnsCapsPinnedConnections(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 8
	pool := pgtest.NewPool(t, cfg)
	// Dedicated held locks, one connection each (multiplexed ones would share
	// one: TestMaxConnsCountsHolderConnections).
	l := newLocker(t, pool, advisory.Config{MaxConns: 2, DisableMultiplexing: true})
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
	// waiting for the same first key pin two connections between them.
	t.Run("exclusive multi-key waiters still pin two connections", func(t *testing.T) {
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
		awaitWaiting(ctx, t, p.pool, k1, 2)
		require.Eventually(t, func() bool { return advisory.LocalWaiters(l, k1) == n-2 }, 10*time.Second, time.Millisecond)
		assert.EqualValues(t, 2, pool.Stat().AcquiredConns())
		var waiting int
		require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND NOT granted AND pid IN
			(SELECT pid FROM pg_stat_activity WHERE application_name = $1)`, cfg.ConnConfig.RuntimeParams["application_name"]).Scan(&waiting))
		assert.Equal(t, 2, waiting, "two waiters on the server for all the calls")
		x.release()
		wg.Wait()
		assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	})
}

// The second half of the local queue's invariant (gate.go): the Locker's
// next waiter already has its place in PostgreSQL's queue when the one
// ahead of it is granted. Issue 19 part 3: with one waiter per key on the
// server, a Locker's next waiter was sent only after the one ahead had been
// granted, so every request that reached the server meanwhile was served
// first; a process whose requests got there later turn after turn was
// starved. Here the other process is two plain sessions that ask again as
// they unlock (one string: unlock; lock), and the schedule is driven by
// events: each holder
// waits in its critical section until every other contender has reached
// its place (queued on the server, or in the Locker's local queue), so
// PostgreSQL's FIFO alone decides the order. Two goroutines of the Locker
// against two sessions: each side must get about half of the turns (with
// one waiter on the server the Locker got one turn in three).
func TestLocalQueueKeepsTheLockersPlaceInPostgresQueue(t *testing.T) {
	ctx := testCtx(t)
	k := key(t)
	kv, _ := k.Int64()
	classid, objid, objsubid := k.PgLocks()
	lcfg, ocfg := pgtest.Config(t), pgtest.Config(t)
	lcfg.MaxConns, ocfg.MaxConns = 4, 4
	lpool, opool := pgtest.NewPool(t, lcfg), pgtest.NewPool(t, ocfg)
	lapp, oapp := lcfg.ConnConfig.RuntimeParams["application_name"], ocfg.ConnConfig.RuntimeParams["application_name"]
	l := newLocker(t, lpool, advisory.Config{})
	p := newProbe(t)
	h := hold(ctx, t, false, k)

	const (
		perSide = 2  // goroutines of the Locker; sessions of the other process
		turns   = 48 // acquisitions counted
	)
	type turn struct {
		locker  bool
		release chan struct{}
	}
	turnCh := make(chan turn)
	var stop atomic.Bool
	// waiting counts, per side, the contenders that are at their place:
	// queued on the server for k, or (the Locker's) in its local queue.
	waiting := func() (byLocker, byOther int) {
		require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE a.application_name = $4),
			count(*) FILTER (WHERE a.application_name = $5)
			FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND NOT l.granted AND l.classid = $1 AND l.objid = $2 AND l.objsubid = $3`,
			classid, objid, objsubid, lapp, oapp).Scan(&byLocker, &byOther))
		return byLocker + advisory.LocalWaiters(l, k), byOther
	}
	settle := func(wantLocker, wantOther int) {
		t.Helper()
		require.Eventually(t, func() bool {
			a, b := waiting()
			return a == wantLocker && b == wantOther
		}, time.Minute, time.Millisecond, "contenders never all reached their place (want %d of the Locker's, %d others)", wantLocker, wantOther)
	}

	var wg sync.WaitGroup
	for range perSide {
		wg.Go(func() {
			for !stop.Load() {
				assert.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error {
					rel := make(chan struct{})
					turnCh <- turn{locker: true, release: rel}
					<-rel
					return nil
				}))
			}
		})
	}
	settle(perSide, 0) // the Locker's goroutines asked first
	for i := range perSide {
		wg.Go(func() {
			c, err := opool.Acquire(ctx)
			if !assert.NoError(t, err) {
				return
			}
			defer c.Release()
			// It asks again at once: unlock and lock in one simple-protocol
			// string, so its next request is queued by its backend right
			// after the unlock, before any other client can act on the grant.
			lock := fmt.Sprintf("SELECT pg_advisory_lock(%d)", kv)
			again := fmt.Sprintf("SELECT pg_advisory_unlock(%d); %s", kv, lock)
			sql := lock
			for {
				if _, err := c.Conn().PgConn().Exec(ctx, sql).ReadAll(); !assert.NoError(t, err) {
					return
				}
				rel := make(chan struct{})
				turnCh <- turn{release: rel}
				<-rel
				if stop.Load() {
					_, err := c.Exec(ctx, "SELECT pg_advisory_unlock($1)", kv)
					assert.NoError(t, err)
					return
				}
				sql = again
			}
		})
		settle(perSide, i+1)
	}
	h.release()

	var lockerTurns int
	order := make([]byte, 0, turns)
	for range turns {
		tr := <-turnCh
		wantL, wantO := perSide, perSide-1
		order = append(order, 'o')
		if tr.locker {
			lockerTurns++
			wantL, wantO = perSide-1, perSide
			order[len(order)-1] = 'L'
		}
		settle(wantL, wantO)
		close(tr.release)
	}
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for draining := true; draining; {
		select {
		case tr := <-turnCh:
			close(tr.release)
		case <-done:
			draining = false
		}
	}

	t.Logf("order of service (L: the Locker, o: the other process): %s; the Locker %d of %d", order, lockerTurns, turns)
	assert.GreaterOrEqual(t, lockerTurns, turns*2/5, "the Locker, with half of the waiters, was starved")
	assert.GreaterOrEqual(t, turns-lockerTurns, turns*2/5, "the other process, with half of the waiters, was starved")
}

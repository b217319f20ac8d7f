package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Issue 22: held locks share holder connections.

// waitBound bounds the wait for an event in these tests: a guard, not a budget.
const waitBound = 30 * time.Second

// muxPool returns a test pool of n connections and its application_name.
func muxPool(t testing.TB, n int32) (*pgxpool.Pool, string) {
	t.Helper()
	cfg := pgtest.Config(t)
	cfg.MaxConns = n
	pool := pgtest.NewPool(t, cfg)
	return pool, cfg.ConnConfig.RuntimeParams["application_name"]
}

// backends counts the server backends of the pool named app (pg_stat_activity).
func backends(ctx context.Context, t testing.TB, admin *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n))
	return n
}

// holderBackends counts the distinct backends of the pool named app that hold advisory locks.
func holderBackends(ctx context.Context, t testing.TB, admin *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND a.application_name = $1`, app).Scan(&n))
	return n
}

func distinctKeys(t testing.TB, n int) []keys.Key {
	base := pgtest.UniqueInt64(t) &^ 0xffff
	ks := make([]keys.Key, n)
	for i := range ks {
		ks[i] = keys.Int64(base + int64(i))
	}
	return ks
}

// The target: 1,000 TryLock handles of one Locker on a pool of 10 use at most
// two backends, and the eleventh does not fail with ErrNoConnection (it did before:
// TestDedicatedTryLocksPinOneConnectionEach). Unlocking them all gives the connection
// back and leaves nothing held.
func TestThousandTryLocksShareAtMostTwoBackends(t *testing.T) {
	ctx := testCtx(t)
	pool, app := muxPool(t, 10)
	admin := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	ks := distinctKeys(t, 1000)
	hs := make([]*advisory.Lock, 0, len(ks))
	t.Cleanup(func() {
		for _, h := range hs {
			_ = h.Unlock(context.Background())
		}
	})
	for i, k := range ks {
		h, err := l.TryLock(ctx, k, nil)
		require.NoError(t, err, "TryLock %d", i)
		hs = append(hs, h)
	}
	n, held := backends(ctx, t, admin, app), holderBackends(ctx, t, admin, app)
	t.Logf("1000 held TryLocks: %d backends of the pool, %d holding locks", n, held)
	assert.LessOrEqual(t, n, 2)
	assert.LessOrEqual(t, held, 2)
	assert.LessOrEqual(t, pool.Stat().AcquiredConns(), int32(2))
	for _, h := range hs {
		require.NoError(t, h.Err())
		require.NoError(t, h.Unlock(ctx))
	}
	hs = nil
	assert.Zero(t, pool.Stat().AcquiredConns(), "a holder connection that holds nothing goes back to the pool")
	assert.Zero(t, holderBackends(ctx, t, admin, app))
	pgtest.AssertNoAdvisoryLocks(t, pool)
}

// The dedicated form (Config.DisableMultiplexing) pins one connection per held lock: on a
// pool of 10, the eleventh TryLock finds no connection.
func TestDedicatedTryLocksPinOneConnectionEach(t *testing.T) {
	ctx := testCtx(t)
	pool, _ := muxPool(t, 10)
	l := newLocker(t, pool, advisory.Config{DisableMultiplexing: true, LockTimeout: 200 * time.Millisecond})
	ks := distinctKeys(t, 11)
	for i, k := range ks[:10] {
		h, err := l.TryLock(ctx, k, nil)
		require.NoError(t, err, "TryLock %d", i)
		t.Cleanup(func() { _ = h.Unlock(context.Background()) })
	}
	_, err := l.TryLock(ctx, ks[10], nil)
	require.ErrorIs(t, err, advisory.ErrNoConnection)
	assert.EqualValues(t, 10, pool.Stat().AcquiredConns())
}

// Pool of ONE connection: a held TryLock and a second TryLock on another key both
// succeed, and so does a Lock whose key is free (it is tried on the holder first).
func TestPoolOfOneHoldsSeveralLocks(t *testing.T) {
	ctx := testCtx(t)
	pool, _ := muxPool(t, 1)
	l := newLocker(t, pool, advisory.Config{LockTimeout: 2 * time.Second})
	ks := distinctKeys(t, 4)
	h1, err := l.TryLock(ctx, ks[0], nil)
	require.NoError(t, err)
	h2, err := l.TryLock(ctx, ks[1], nil)
	require.NoError(t, err)
	h3, err := l.Lock(ctx, ks[2], nil)
	require.NoError(t, err)
	h4, err := l.TryLockAll(ctx, []keys.Key{ks[3]}, &advisory.Options{Shared: true})
	require.NoError(t, err)
	p := newProbe(t)
	for _, k := range ks[:3] {
		assert.False(t, p.free(ctx, k, true), "%v is held", k)
	}
	assert.False(t, p.free(ctx, ks[3], false))
	assert.True(t, p.free(ctx, ks[3], true), "shared")
	for _, h := range []*advisory.Lock{h1, h2, h3, h4} {
		require.NoError(t, h.Unlock(ctx))
	}
	assert.Zero(t, pool.Stat().AcquiredConns())
	for _, k := range ks {
		assert.True(t, p.free(ctx, k, false))
	}
}

// Sharing a connection never lets two holders of one Locker get one key in conflicting
// modes through PostgreSQL's stacking: each case takes a key, then asks for it again
// from another goroutine of the same Locker.
func TestSharedHolderNeverStacksConflictingModes(t *testing.T) {
	ctx := testCtx(t)
	pool, app := muxPool(t, 4)
	admin := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	excl, shared := (*advisory.Options)(nil), &advisory.Options{Shared: true}
	cases := []struct {
		name         string
		first, again *advisory.Options
		granted      bool // the second is granted at once
	}{
		{"exclusive-then-exclusive", excl, excl, false},
		{"shared-then-exclusive", shared, excl, false},
		{"exclusive-then-shared", excl, shared, false},
		{"shared-then-shared", shared, shared, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := key(t)
			other := key(t) // held too, so that the holder connection is shared
			ho, err := l.TryLock(ctx, other, nil)
			require.NoError(t, err)
			defer func() { require.NoError(t, ho.Unlock(ctx)) }()
			h1, err := l.TryLock(ctx, k, tc.first)
			require.NoError(t, err)
			got := make(chan error, 1)
			var h2 *advisory.Lock
			go func() {
				var err error
				h2, err = l.TryLock(ctx, k, tc.again)
				got <- err
			}()
			err = <-got
			if tc.granted {
				require.NoError(t, err)
				// Not stacked on the first's connection: a connection of its own.
				assert.Equal(t, 2, holderBackends(ctx, t, admin, app))
				require.NoError(t, h2.Unlock(ctx))
			} else {
				require.ErrorIs(t, err, advisory.ErrNotAcquired)
			}
			// A blocking request waits (on a connection of its own) until the first
			// is unlocked, and only then is granted.
			start := make(chan struct{})
			waited := make(chan error, 1)
			go func() {
				close(start)
				h, err := l.Lock(ctx, k, tc.again)
				if err == nil {
					err = h.Unlock(ctx)
				}
				waited <- err
			}()
			<-start
			if !tc.granted {
				awaitWaiting(ctx, t, pgtest.Pool(t), k, 1)
				select {
				case err := <-waited:
					t.Fatalf("granted while the first holds it: %v", err)
				default:
				}
			}
			require.NoError(t, h1.Unlock(ctx))
			require.NoError(t, <-waited)
			assert.True(t, newProbe(t).free(ctx, k, false))
		})
	}
}

// Multi-key sets that overlap: a set that meets a held key is refused whole and leaves
// none of its keys held; one that does not is granted on the shared holder.
func TestSharedHolderOverlappingKeySets(t *testing.T) {
	ctx := testCtx(t)
	pool, app := muxPool(t, 4)
	admin := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	ks := distinctKeys(t, 5)
	a, b, c, d, e := ks[0], ks[1], ks[2], ks[3], ks[4]
	hab, err := l.TryLockAll(ctx, []keys.Key{a, b}, nil)
	require.NoError(t, err)
	_, err = l.TryLockAll(ctx, []keys.Key{c, b}, nil)
	require.ErrorIs(t, err, advisory.ErrNotAcquired)
	_, err = l.TryLockAll(ctx, []keys.Key{c, a}, &advisory.Options{Shared: true})
	require.ErrorIs(t, err, advisory.ErrNotAcquired)
	p := newProbe(t)
	assert.True(t, p.free(ctx, c, false), "the refused set left c held")
	hcd, err := l.TryLockAll(ctx, []keys.Key{d, c}, nil)
	require.NoError(t, err)
	he, err := l.LockAll(ctx, []keys.Key{e}, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, holderBackends(ctx, t, admin, app), "one holder connection")
	require.NoError(t, hab.Unlock(ctx))
	assert.True(t, p.free(ctx, a, false))
	assert.True(t, p.free(ctx, b, false))
	assert.False(t, p.free(ctx, c, false), "c is still held after another lock's unlock")
	require.NoError(t, hcd.Unlock(ctx))
	require.NoError(t, he.Unlock(ctx))
	assert.Zero(t, pool.Stat().AcquiredConns())
}

// Randomized: goroutines of one Locker take random sets of three keys in random modes,
// try and blocking, hold them a moment and unlock. A checker records every holding from
// just after its grant to just before its unlock and fails on any overlap PostgreSQL
// would not allow (two holders of a key, one of them exclusive).
func TestSharedHolderRandomizedNeverOverlaps(t *testing.T) {
	ctx := testCtx(t)
	pool, _ := muxPool(t, 6)
	l := newLocker(t, pool, advisory.Config{LockTimeout: 2 * time.Second})
	ks := distinctKeys(t, 3)
	var (
		mu       sync.Mutex
		excl     = map[keys.Key]int{}
		shrd     = map[keys.Key]int{}
		granted  int
		overlaps []string
	)
	enter := func(set []keys.Key, shared bool) {
		mu.Lock()
		defer mu.Unlock()
		granted++
		for _, k := range set {
			if excl[k] > 0 || (!shared && shrd[k] > 0) {
				overlaps = append(overlaps, fmt.Sprintf("%v shared=%v with %d exclusive, %d shared", k, shared, excl[k], shrd[k]))
			}
			if shared {
				shrd[k]++
			} else {
				excl[k]++
			}
		}
	}
	leave := func(set []keys.Key, shared bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range set {
			if shared {
				shrd[k]--
			} else {
				excl[k]--
			}
		}
	}
	const workers, iters = 6, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 22))
			for range iters {
				var set []keys.Key
				for _, k := range ks {
					if r.IntN(2) == 0 {
						set = append(set, k)
					}
				}
				if len(set) == 0 {
					set = ks[r.IntN(len(ks)):][:1]
				}
				shared := r.IntN(2) == 0
				opts := &advisory.Options{Shared: shared}
				var h *advisory.Lock
				var err error
				if r.IntN(2) == 0 {
					h, err = l.TryLockAll(ctx, set, opts)
				} else {
					h, err = l.LockAll(ctx, set, opts)
				}
				if errors.Is(err, advisory.ErrNotAcquired) || errors.Is(err, advisory.ErrLockTimeout) {
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				enter(set, shared)
				for range r.IntN(3) {
					time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond) // hold a moment (not a synchronisation)
				}
				leave(set, shared)
				assert.NoError(t, h.Unlock(ctx))
			}
		})
	}
	wg.Wait()
	t.Logf("%d holdings granted", granted)
	assert.Empty(t, overlaps)
	assert.Positive(t, granted)
	assert.Zero(t, pool.Stat().AcquiredConns())
	p := newProbe(t)
	for _, k := range ks {
		assert.True(t, p.free(ctx, k, false))
	}
}

// A terminated holder connection loses every lock on it: each handle's Done closes and
// its Err matches ErrLockLost, each Hold's context is cancelled with that cause, and
// each loss is traced once (no release).
func TestTerminatedHolderLosesEveryLockOnIt(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	rec := &recorder{}
	pool, app := muxPool(t, 4)
	l := newLocker(t, pool, advisory.Config{Tracer: rec, HeartbeatInterval: -1})
	ks := distinctKeys(t, 5)
	var hs []*advisory.Lock
	for _, k := range ks[:3] {
		h, err := l.TryLock(ctx, k, nil)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	hm, err := l.LockAll(ctx, ks[3:4], &advisory.Options{Shared: true})
	require.NoError(t, err)
	hs = append(hs, hm)
	entered := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- l.TryHold(ctx, ks[4], nil, func(ctx context.Context) error {
			close(entered)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	<-entered
	require.Equal(t, 1, holderBackends(ctx, t, admin, app), "all five share one holder connection")
	killBackend(ctx, t, admin, holderPID(ctx, t, admin, ks[0]))
	t0 := time.Now() // the backend has exited
	for i, h := range hs {
		select {
		case <-h.Done():
		case <-time.After(waitBound):
			t.Fatalf("lock %d: Done not closed after the terminate", i)
		}
		if i == len(hs)-1 {
			t.Logf("backend exited -> every handle's Done closed within %v (heartbeats off; logged, not asserted)", time.Since(t0))
		}
		assert.ErrorIs(t, h.Err(), advisory.ErrLockLost, "lock %d", i)
		assert.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost, "lock %d", i)
	}
	assert.ErrorIs(t, <-held, advisory.ErrLockLost)
	losts, rels := rec.lossCount()
	assert.Equal(t, 5, losts, "one TraceLost per lock: %v", rec.snapshot())
	assert.Zero(t, rels)
	// The holders hear first; the destroy follows (see TestFrozenNetworkLosesEveryLockOnTheHolder).
	assert.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, waitBound, time.Millisecond)
	// The Locker goes on: a new holder connection.
	h, err := l.TryLock(ctx, ks[0], nil)
	require.NoError(t, err)
	require.NoError(t, h.Unlock(ctx))
}

// A frozen network (the proxy drops every byte, sockets stay open) under a shared holder
// connection is found by its one heartbeat within about HeartbeatInterval +
// HeartbeatTimeout (logged, not asserted), and every lock on it is lost.
func TestFrozenNetworkLosesEveryLockOnTheHolder(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	proxy := proxied(t, cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // not pgtest.NewPool: its end check would see the cut's orphans
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const interval, timeout = 200 * time.Millisecond, 200 * time.Millisecond
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: interval, HeartbeatTimeout: timeout})
	ks := distinctKeys(t, 3)
	var hs []*advisory.Lock
	for _, k := range ks {
		h, err := l.TryLock(ctx, k, nil)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	// Heartbeats flow while the network works, and the locks survive them.
	sent := proxy.ClientBytes()
	require.Eventually(t, func() bool { return proxy.ClientBytes() >= sent+2*13 }, waitBound, 5*time.Millisecond)
	for _, h := range hs {
		require.NoError(t, h.Err())
	}
	t0 := time.Now()
	require.Equal(t, 1, proxy.Cut(), "one holder connection")
	for i, h := range hs {
		select {
		case <-h.Done():
		case <-time.After(waitBound):
			t.Fatalf("lock %d: Done not closed after the cut", i)
		}
		assert.ErrorIs(t, h.Err(), advisory.ErrLockLost)
	}
	t.Logf("cut -> every lock lost after %v (interval %v + timeout %v)", time.Since(t0).Round(time.Millisecond), interval, timeout)
	for _, h := range hs {
		assert.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
	}
	proxy.CloseCut()
	// The holders hear of the loss before the holder connection is
	// destroyed (a destroy over a frozen network may take its whole
	// bound), so the pool sees it back only once the destroy is done;
	// nothing signals that but the pool's count.
	assert.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, waitBound, time.Millisecond,
		"the lost holder connection was destroyed")
}

// One watcher per holder connection, not per lock: 50 held locks on one holder
// connection run one watcher goroutine.
func TestOneWatcherPerHolderConnection(t *testing.T) {
	ctx := testCtx(t)
	pool, _ := muxPool(t, 4)
	l := newLocker(t, pool, advisory.Config{})
	ks := distinctKeys(t, 50)
	var hs []*advisory.Lock
	for _, k := range ks {
		h, err := l.TryLock(ctx, k, nil)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	watchers := func() int {
		var b strings.Builder
		require.NoError(t, pprof.Lookup("goroutine").WriteTo(&b, 2))
		return strings.Count(b.String(), "advisory.(*holderConn).watch(")
	}
	require.Eventually(t, func() bool { return watchers() == 1 }, waitBound, time.Millisecond, "one watcher")
	for _, h := range hs {
		require.NoError(t, h.Unlock(ctx))
	}
	require.Eventually(t, func() bool { return watchers() == 0 }, waitBound, time.Millisecond, "the watcher ends with the holder connection")
}

// A caller whose context ends at any moment of its acquisition never kills or poisons
// the shared holder connection: the other locks on it stay held on the same backend, and
// whatever the abandoned calls were granted is unlocked.
func TestCancelledCallersDoNotHurtTheSharedHolder(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	pool, _ := muxPool(t, 4)
	l := newLocker(t, pool, advisory.Config{})
	ks := distinctKeys(t, 201)
	h0, err := l.TryLock(ctx, ks[0], nil)
	require.NoError(t, err)
	pid := holderPID(ctx, t, admin, ks[0])
	var wg sync.WaitGroup
	var mu sync.Mutex
	var kept []*advisory.Lock
	for i, k := range ks[1:] {
		cctx, cancel := context.WithCancel(ctx)
		wg.Go(func() {
			h, err := l.TryLock(cctx, k, nil)
			if err == nil {
				mu.Lock()
				kept = append(kept, h)
				mu.Unlock()
			} else {
				assert.ErrorIs(t, err, context.Canceled)
			}
		})
		if i%2 == 0 {
			cancel()
		} else {
			defer cancel()
		}
	}
	wg.Wait()
	require.NoError(t, h0.Err())
	assert.Equal(t, pid, holderPID(ctx, t, admin, ks[0]), "the holder connection is the same backend")
	for _, h := range kept {
		require.NoError(t, h.Unlock(ctx))
	}
	require.NoError(t, h0.Unlock(ctx))
	p := newProbe(t)
	for _, k := range ks {
		require.True(t, p.free(ctx, k, false), "%v left held", k)
	}
	assert.Zero(t, pool.Stat().AcquiredConns())
}

// Config.MaxConns counts holder connections: with a cap of one, held locks on distinct
// keys share the one connection, and a Lock whose key is busy (held by another session)
// must wait on a connection of its own, which the cap refuses while the holder connection
// holds anything: ErrNoConnection, not ErrLockTimeout (it never reached the server).
func TestMaxConnsCountsHolderConnections(t *testing.T) {
	ctx := testCtx(t)
	pool, _ := muxPool(t, 8)
	l := newLocker(t, pool, advisory.Config{MaxConns: 1})
	ks := distinctKeys(t, 4)
	var hs []*advisory.Lock
	for _, k := range ks[:3] {
		h, err := l.Lock(ctx, k, nil)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	assert.EqualValues(t, 1, pool.Stat().AcquiredConns())
	other := hold(ctx, t, false, ks[3])
	_, err := l.Lock(ctx, ks[3], &advisory.Options{Timeout: 300 * time.Millisecond})
	require.ErrorIs(t, err, advisory.ErrNoConnection)
	other.release()
	for _, h := range hs {
		require.NoError(t, h.Unlock(ctx))
	}
	assert.Zero(t, pool.Stat().AcquiredConns())
	h, err := l.Lock(ctx, ks[3], nil)
	require.NoError(t, err)
	require.NoError(t, h.Unlock(ctx))
}

// A wait that had to queue on the server takes a connection of its own; once granted,
// that connection becomes a holder connection, and later acquisitions share it.
func TestGrantedWaiterBecomesASharedHolder(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	pool, app := muxPool(t, 4)
	l := newLocker(t, pool, advisory.Config{})
	ks := distinctKeys(t, 2)
	other := hold(ctx, t, false, ks[0])
	got := make(chan *advisory.Lock, 1)
	go func() {
		h, err := l.Lock(ctx, ks[0], nil)
		assert.NoError(t, err)
		got <- h
	}()
	awaitWaiting(ctx, t, admin, ks[0], 1)
	other.release()
	h0 := <-got
	require.NotNil(t, h0)
	h1, err := l.TryLock(ctx, ks[1], nil)
	require.NoError(t, err)
	assert.Equal(t, holderPID(ctx, t, admin, ks[0]), holderPID(ctx, t, admin, ks[1]), "the try ran on the granted waiter's connection")
	assert.Equal(t, 1, holderBackends(ctx, t, admin, app))
	assert.EqualValues(t, 1, pool.Stat().AcquiredConns())
	require.NoError(t, h0.Unlock(ctx))
	require.NoError(t, h1.Unlock(ctx))
	assert.Zero(t, pool.Stat().AcquiredConns())
}

// Calls that arrive together on a Locker with no holder connection yet
// share the one the first of them opens (they wait for its turn) instead
// of each opening one: 50 TryLocks started at once pin one connection, not
// 50 (contrib/gocron's fleet test saw up to 50 on the first tick before),
// and not two or three (the calls that found no holder before the first
// had recorded its new one opened their own, until pick and open became
// one step: 2 and 3 backends under load).
func TestConcurrentFirstTryLocksJoinTheHolderBeingOpened(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	for round := range 3 {
		pool, app := muxPool(t, 50)
		l := newLocker(t, pool, advisory.Config{})
		ks := distinctKeys(t, 50)
		hs := make([]*advisory.Lock, len(ks))
		errs := make([]error, len(ks))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, k := range ks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				hs[i], errs[i] = l.TryLock(ctx, k, nil)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d: TryLock %d", round, i)
		}
		held := holderBackends(ctx, t, admin, app)
		t.Logf("round %d: 50 concurrent first TryLocks on %d holder backends (%d acquired)", round, held, pool.Stat().AcquiredConns())
		assert.Equal(t, 1, held, "round %d", round)
		assert.EqualValues(t, 1, pool.Stat().AcquiredConns(), "round %d", round)
		for _, h := range hs {
			require.NoError(t, h.Unlock(ctx))
		}
		assert.Zero(t, pool.Stat().AcquiredConns())
		pgtest.AssertNoAdvisoryLocks(t, pool)
	}
}

// A LostTracer that calls Unlock on the lost lock gets ErrLockLost, for
// every lock of a shared holder connection, without waiting for the loss
// that is calling it (it used to wait for the turn the loss held: a
// deadlock); the dedicated form too.

// unlockOnLoss is a LostTracer that unlocks the lost lock from TraceLost,
// as an application's "on lost: clean up" hook may.
type unlockOnLoss struct {
	mu    sync.Mutex
	locks map[keys.Key]*advisory.Lock
	errs  chan error
}

func (u *unlockOnLoss) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	return ctx
}
func (u *unlockOnLoss) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {}
func (u *unlockOnLoss) TraceLost(ctx context.Context, d advisory.TraceLostData) {
	u.mu.Lock()
	h := u.locks[d.Keys[0]]
	u.mu.Unlock()
	u.errs <- h.Unlock(ctx)
}

// A LostTracer that calls Unlock on the lost lock of a shared holder
// connection gets ErrLockLost, for every lock on it, without waiting for
// the loss that is calling it (it used to wait for the turn the loss held:
// a deadlock).
func TestLostTracerMayUnlockASharedLock(t *testing.T) {
	for _, dedicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("dedicated=%v", dedicated), func(t *testing.T) { testLostTracerMayUnlock(t, dedicated) })
	}
}

func testLostTracerMayUnlock(t *testing.T, dedicated bool) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	u := &unlockOnLoss{locks: map[keys.Key]*advisory.Lock{}, errs: make(chan error, 3)}
	pool, app := muxPool(t, 4)
	l := newLocker(t, pool, advisory.Config{Tracer: u, HeartbeatInterval: -1, DisableMultiplexing: dedicated})
	ks := distinctKeys(t, 3)
	var hs []*advisory.Lock
	for _, k := range ks {
		h, err := l.TryLock(ctx, k, nil)
		require.NoError(t, err)
		u.mu.Lock()
		u.locks[k] = h
		u.mu.Unlock()
		hs = append(hs, h)
	}
	if dedicated {
		for _, k := range ks {
			killBackend(ctx, t, admin, holderPID(ctx, t, admin, k))
		}
	} else {
		require.Equal(t, 1, holderBackends(ctx, t, admin, app))
		killBackend(ctx, t, admin, holderPID(ctx, t, admin, ks[0]))
	}
	for i := range hs {
		select {
		case err := <-u.errs:
			assert.ErrorIs(t, err, advisory.ErrLockLost, "unlock %d from TraceLost", i)
		case <-time.After(waitBound):
			t.Fatalf("TraceLost's Unlock %d did not return", i)
		}
	}
	for i, h := range hs {
		select {
		case <-h.Done():
		case <-time.After(waitBound):
			t.Fatalf("lock %d: Done not closed", i)
		}
		assert.ErrorIs(t, h.Err(), advisory.ErrLockLost, "lock %d", i)
		assert.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost, "lock %d", i)
	}
	// The holders hear first; the destroy follows (see TestFrozenNetworkLosesEveryLockOnTheHolder).
	assert.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, waitBound, time.Millisecond)
}

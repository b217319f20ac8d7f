package advisory_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Issue 20, part 2: a loss is a loss whoever sees it first (the watcher,
// Lock.Unlock, Hold, or the unlock of WithLock/WithLockAll). Each test
// checks the three reports: the error matches ErrLockLost, Err does too,
// and the tracer gets exactly one TraceLost and no TraceRelease.

// killBackend terminates backend pid from admin (another session) and
// returns once the backend has exited (pg_terminate_backend's timeout form
// waits for it): an awaited event, not a sleep.
func killBackend(ctx context.Context, t testing.TB, admin *pgxpool.Pool, pid uint32) {
	t.Helper()
	var ok bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1, 60000)", int32(pid)).Scan(&ok))
	require.True(t, ok, "backend %d did not exit", pid)
}

// holderPID returns the backend that holds k (granted).
func holderPID(ctx context.Context, t testing.TB, admin *pgxpool.Pool, k keys.Key) uint32 {
	t.Helper()
	infos, err := advisory.ListLocks(ctx, admin, k)
	require.NoError(t, err)
	for _, in := range infos {
		if in.Granted {
			return uint32(in.PID)
		}
	}
	t.Fatalf("no holder of %v", k)
	return 0
}

// lossCount returns the number of TraceLost and TraceRelease events.
func (r *recorder) lossCount() (losts, rels int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.losts), len(r.rels)
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events, r.ends, r.rels, r.losts = nil, nil, nil, nil
}

// requireOneLoss checks that exactly one loss, and no release, was traced.
func requireOneLoss(t testing.TB, rec *recorder) {
	t.Helper()
	losts, rels := rec.lossCount()
	require.Equal(t, 1, losts, "exactly one TraceLost: %v", rec.snapshot())
	require.Equal(t, 0, rels, "a lost lock is not also released: %v", rec.snapshot())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.ErrorIs(t, rec.losts[0].Err, advisory.ErrLockLost)
}

// killAtGrant is a recorder that, when an acquisition succeeds, runs kill
// before the call returns (TraceAcquireEnd runs on the caller's goroutine,
// before the handle exists and its watcher is scheduled).
type killAtGrant struct {
	*recorder
	kill func()
}

func (k *killAtGrant) TraceAcquireEnd(ctx context.Context, d advisory.TraceAcquireEndData) {
	k.recorder.TraceAcquireEnd(ctx, d)
	if d.Outcome == advisory.OutcomeAcquired && k.kill != nil {
		k.kill()
	}
}

// Terminated right after the grant and unlocked at once: Unlock usually
// finds the dead connection before the watcher (which starts 1 ms after
// the grant) does.
func TestLossFoundByUnlockIsReportedOnce(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	k := key(t)
	rec := &killAtGrant{recorder: &recorder{}}
	rec.kill = func() { killBackend(ctx, t, admin, holderPID(ctx, t, admin, k)) }
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: rec, HeartbeatInterval: -1})
	byUnlock := 0
	const rounds = 20
	for round := 0; round < rounds; round++ {
		rec.reset()
		h, err := l.Lock(ctx, k, nil)
		require.NoError(t, err)
		err = h.Unlock(ctx)
		require.ErrorIs(t, err, advisory.ErrLockLost, "round %d", round)
		var le *advisory.LockError
		if errors.As(err, &le) && le.Op == "unlock" {
			byUnlock++
		}
		<-h.Done()
		require.ErrorIs(t, h.Err(), advisory.ErrLockLost, "round %d: Err agrees with Unlock", round)
		require.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost, "round %d: idempotent", round)
		requireOneLoss(t, rec.recorder)
	}
	t.Logf("the unlock found the loss first in %d of %d rounds", byUnlock, rounds)
}

// Unlock racing a terminate: each round ends either as a clean unlock (one
// release, no loss) or as a loss reported exactly once, never both, never
// a loss that Err or the tracer miss.
func TestUnlockConcurrentWithLossReportsOnce(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	rec := &recorder{}
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: rec})
	k := key(t)
	lost := 0
	const rounds = 40
	for round := 0; round < rounds; round++ {
		rec.reset()
		h, err := l.Lock(ctx, k, nil)
		require.NoError(t, err)
		pid := holderPID(ctx, t, admin, k)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ok bool
			// The backend may already be back in the pool after a clean
			// unlock (killing it is harmless: a pooled dead connection is
			// replaced); it may also be gone already.
			_ = admin.QueryRow(ctx, "SELECT pg_terminate_backend($1, 60000)", int32(pid)).Scan(&ok)
		}()
		uerr := h.Unlock(ctx)
		wg.Wait()
		<-h.Done()
		losts, rels := rec.lossCount()
		if uerr == nil {
			require.ErrorIs(t, h.Err(), advisory.ErrUnlocked)
			require.Equal(t, [2]int{0, 1}, [2]int{losts, rels}, "round %d: a clean unlock is one release: %v", round, rec.snapshot())
			continue
		}
		lost++
		require.ErrorIs(t, uerr, advisory.ErrLockLost, "round %d", round)
		require.ErrorIs(t, h.Err(), advisory.ErrLockLost, "round %d", round)
		requireOneLoss(t, rec)
	}
	t.Logf("%d of %d rounds lost the lock", lost, rounds)
}

// WithLock and WithLockAll whose callback's backend dies: the unlock finds
// the loss and reports it.
func TestWithLockLossIsTraced(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(map[int]string{1: "WithLock", 3: "WithLockAll"}[n], func(t *testing.T) {
			ctx := testCtx(t)
			admin := pgtest.Pool(t)
			rec := &recorder{}
			l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: rec})
			ks := make([]keys.Key, n)
			for i := range ks {
				ks[i] = key(t)
			}
			for round := 0; round < 5; round++ {
				rec.reset()
				fn := func(ctx context.Context, conn *pgx.Conn) error {
					killBackend(ctx, t, admin, conn.PgConn().PID())
					return nil
				}
				var err error
				if n == 1 {
					err = l.WithLock(ctx, ks[0], nil, fn)
				} else {
					err = l.WithLockAll(ctx, ks, nil, fn)
				}
				require.ErrorIs(t, err, advisory.ErrLockLost, "round %d", round)
				requireOneLoss(t, rec)
			}
		})
	}
}

// Hold whose backend dies at the grant, fn returning at once without
// waiting for its context: whoever sees the loss (usually the unlock, else
// the watcher), it is reported once.
func TestHoldLossIsTracedOnce(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	k := key(t)
	rec := &killAtGrant{recorder: &recorder{}}
	rec.kill = func() { killBackend(ctx, t, admin, holderPID(ctx, t, admin, k)) }
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: rec})
	for round := 0; round < 10; round++ {
		rec.reset()
		err := l.Hold(ctx, k, nil, func(context.Context) error { return nil })
		require.ErrorIs(t, err, advisory.ErrLockLost, "round %d", round)
		requireOneLoss(t, rec.recorder)
	}
}

// MultiTracer fans the one loss out once to each tracer.
func TestLossOnceThroughMultiTracer(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	a, b := &recorder{}, &recorder{}
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: advisory.MultiTracer{a, b}})
	err := l.WithLock(ctx, key(t), nil, func(ctx context.Context, conn *pgx.Conn) error {
		killBackend(ctx, t, admin, conn.PgConn().PID())
		return nil
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)
	requireOneLoss(t, a)
	requireOneLoss(t, b)
	assert.Equal(t, a.snapshot(), b.snapshot())
}

// Two concurrent Unlocks of a lock lost at the grant both say so: the
// second waits for the first's result instead of returning early.
func TestConcurrentUnlocksBothReportTheLoss(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	k := key(t)
	rec := &killAtGrant{recorder: &recorder{}}
	rec.kill = func() { killBackend(ctx, t, admin, holderPID(ctx, t, admin, k)) }
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: rec})
	for round := 0; round < 10; round++ {
		rec.reset()
		h, err := l.Lock(ctx, k, nil)
		require.NoError(t, err)
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- h.Unlock(ctx) }()
		}
		require.ErrorIs(t, <-errs, advisory.ErrLockLost, "round %d", round)
		require.ErrorIs(t, <-errs, advisory.ErrLockLost, "round %d", round)
		requireOneLoss(t, rec.recorder)
	}
}

// blockingLostTracer counts TraceLost per key; the first trace records its
// keys, tells blocked and waits until release is closed.
type blockingLostTracer struct {
	blocked, release chan struct{}
	mu               sync.Mutex
	first            []keys.Key
	lost             map[keys.Key]int
}

func (b *blockingLostTracer) TraceLost(_ context.Context, d advisory.TraceLostData) {
	b.mu.Lock()
	for _, k := range d.Keys {
		b.lost[k]++
	}
	first := b.first == nil
	if first {
		b.first = d.Keys
	}
	b.mu.Unlock()
	if first {
		close(b.blocked)
		<-b.release
	}
}

func (*blockingLostTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	return ctx
}
func (*blockingLostTracer) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {}

func (b *blockingLostTracer) count(k keys.Key) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lost[k]
}

// Two locks on one holder connection are lost together; the loss is traced
// lock by lock. An Unlock of the second that runs while the first's trace
// is still on returns ErrLockLost at once (the loss is being marked) and
// ends the lock; the second's loss must still be traced, once, before its
// Done closes, and Unlock and Err return the loss with its cause. Before the
// first fix it never was traced: the marking found the lock ended and
// skipped it, and a metrics tracer's held gauge stayed up for good
// (TestLostCountedOnceWhoeverSeesIt in metrics failed so under load); before
// the second (the third review), Done closed, and Unlock returned a bare
// unlock error, before the trace.
func TestUnlockDuringTheLossStillTracesIt(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	k1, k2 := key(t), key(t)
	tr := &blockingLostTracer{blocked: make(chan struct{}), release: make(chan struct{}), lost: map[keys.Key]int{}}
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: tr})
	h1, err := l.Lock(ctx, k1, nil)
	require.NoError(t, err)
	h2, err := l.Lock(ctx, k2, nil)
	require.NoError(t, err)
	require.Equal(t, holderPID(ctx, t, admin, k1), holderPID(ctx, t, admin, k2), "one holder connection")
	killBackend(ctx, t, admin, holderPID(ctx, t, admin, k1))
	<-tr.blocked
	first, second, firstKey, secondKey := h1, h2, k1, k2
	if tr.first[0] == k2 {
		first, second, firstKey, secondKey = h2, h1, k2, k1
	}
	require.Equal(t, 0, tr.count(secondKey))
	uerr := second.Unlock(ctx)
	require.ErrorIs(t, uerr, advisory.ErrLockLost, "the loss is being marked")
	assert.Equal(t, uerr, second.Err(), "Err returns what Unlock did")
	var le *advisory.LockError
	if assert.ErrorAs(t, uerr, &le) {
		assert.Equal(t, "lock", le.Op, "the loss the watcher saw (its cause), not a bare unlock error")
	}
	select {
	case <-second.Done():
		t.Fatal("Done closed before the loss was traced")
	default:
	}
	close(tr.release)
	<-first.Done()
	require.ErrorIs(t, first.Unlock(ctx), advisory.ErrLockLost)
	<-second.Done()
	assert.Equal(t, 1, tr.count(secondKey), "traced before Done closed")
	assert.Equal(t, 1, tr.count(firstKey))
}

package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// holdResult is what a Hold callback saw.
type holdResult struct {
	lostAt time.Time // when the callback's context ended
	cause  error     // context.Cause of the callback's context
	err    error     // what Hold returned
}

// startHold runs l.Hold(k) in a goroutine whose callback signals entered and then waits
// for its context to end (bounded). The result arrives on the returned channel.
func startHold(ctx context.Context, l *advisory.Locker, ks []keys.Key) (entered <-chan struct{}, result <-chan holdResult) {
	in := make(chan struct{})
	out := make(chan holdResult, 1)
	go func() {
		var r holdResult
		r.err = l.HoldAll(ctx, ks, nil, func(fctx context.Context) error {
			close(in)
			select {
			case <-fctx.Done():
				r.lostAt = time.Now()
				r.cause = context.Cause(fctx)
				return nil
			case <-time.After(waitBound):
				return errors.New("callback context was never cancelled")
			}
		})
		out <- r
	}()
	return in, out
}

// waitFor runs l.WithLockAll(ks) in a goroutine and reports when its callback ran.
func waitFor(ctx context.Context, l *advisory.Locker, ks []keys.Key) <-chan waitResult {
	out := make(chan waitResult, 1)
	go func() {
		var r waitResult
		r.err = l.WithLockAll(ctx, ks, nil, func(context.Context, *pgx.Conn) error {
			r.acquiredAt = time.Now()
			return nil
		})
		out <- r
	}()
	return out
}

type waitResult struct {
	acquiredAt time.Time
	err        error
}

// A Hold callback whose holder backend is terminated is cancelled with cause
// ErrLockLost, Hold returns an error matching ErrLockLost, and a waiter on another pool
// acquires the key.
func TestTerminateHolderHold(t *testing.T) {
	ctx := testCtx(t)
	holderPool, waiterPool, admin := pgtest.Pool(t), pgtest.Pool(t), pgtest.Pool(t)
	holderL := newLocker(t, holderPool, advisory.Config{}) // default heartbeat: 5 s, not what detects this
	waiterL := newLocker(t, waiterPool, advisory.Config{})
	k := int64Key(t)

	entered, result := startHold(ctx, holderL, []keys.Key{k})
	await(t, entered, "the Hold callback to start")
	pid := holderPIDs(t, ctx, admin, k)[k]

	waited := waitFor(ctx, waiterL, []keys.Key{k})
	awaitLocks(t, ctx, admin, "the waiter to queue", func(ls []advisory.LockInfo) bool { return waiters(ls) == 1 }, k)

	t0 := time.Now()
	terminate(t, ctx, admin, pid)
	r := await(t, result, "Hold to return")
	w := await(t, waited, "the waiter to acquire")

	require.False(t, r.lostAt.IsZero(), "callback context not cancelled; Hold returned %v", r.err)
	assert.ErrorIs(t, r.cause, advisory.ErrLockLost, "context.Cause of the callback context")
	assert.ErrorIs(t, r.err, advisory.ErrLockLost, "Hold's error")
	var pgErr *pgconn.PgError
	if errors.As(r.cause, &pgErr) {
		assert.Equal(t, "57P01", pgErr.Code, "admin_shutdown from pg_terminate_backend")
	}
	require.NoError(t, w.err)
	t.Logf("terminate -> Hold callback ctx cancelled: %v; terminate -> waiter acquired: %v; cause: %v",
		r.lostAt.Sub(t0), w.acquiredAt.Sub(t0), r.cause)
	// The holders hear of a loss before its connection's destroy ends (by
	// design); nothing signals the destroy but the pool's count.
	assert.Eventually(t, func() bool { return holderPool.Stat().AcquiredConns() == 0 }, waitBound, time.Millisecond)
}

// The handle form: Done closes, Err and Unlock match ErrLockLost (Unlock idempotently),
// for a multi-key lock; a waiter for both keys on another pool acquires.
func TestTerminateHolderLockHandle(t *testing.T) {
	ctx := testCtx(t)
	holderPool, waiterPool, admin := pgtest.Pool(t), pgtest.Pool(t), pgtest.Pool(t)
	holderL := newLocker(t, holderPool, advisory.Config{})
	waiterL := newLocker(t, waiterPool, advisory.Config{})
	ks := []keys.Key{int64Key(t), pairKey(t)}

	h, err := holderL.LockAll(ctx, ks, nil)
	require.NoError(t, err)
	pids := holderPIDs(t, ctx, admin, ks...)
	require.Equal(t, pids[ks[0]], pids[ks[1]], "both keys on one session")
	require.NoError(t, h.Err(), "held")

	waited := waitFor(ctx, waiterL, ks)
	awaitLocks(t, ctx, admin, "the waiter to queue", func(ls []advisory.LockInfo) bool { return waiters(ls) == 1 }, ks...)

	t0 := time.Now()
	terminate(t, ctx, admin, pids[ks[0]])
	await(t, h.Done(), "Done to close")
	lost := time.Since(t0)
	w := await(t, waited, "the waiter to acquire")

	assert.ErrorIs(t, h.Err(), advisory.ErrLockLost)
	var le *advisory.LockError
	if assert.ErrorAs(t, h.Err(), &le) {
		assert.ElementsMatch(t, ks, le.Keys)
	}
	require.NoError(t, w.err)
	t.Logf("terminate -> Done closed: %v; terminate -> waiter acquired: %v; Err: %v", lost, w.acquiredAt.Sub(t0), h.Err())

	uerr := h.Unlock(ctx)
	assert.ErrorIs(t, uerr, advisory.ErrLockLost, "Unlock after a loss")
	assert.Equal(t, uerr, h.Unlock(ctx), "Unlock is idempotent")
	assert.Eventually(t, func() bool { st := holderPool.Stat(); return st.AcquiredConns() == 0 && st.TotalConns() == 0 },
		waitBound, time.Millisecond, "the dead connection is destroyed, not back in the pool")
}

package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

func TestLockHandleHoldsUntilUnlock(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)

	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	assert.Equal(t, []keys.Key{k}, h.Keys())
	assert.NoError(t, h.Err())
	assert.False(t, p.free(ctx, k, false))
	assert.EqualValues(t, 1, pool.Stat().AcquiredConns(), "the handle pins its connection")
	select {
	case <-h.Done():
		t.Fatal("Done closed while held")
	default:
	}

	_, err = l.TryLock(ctx, k, nil)
	require.ErrorIs(t, err, advisory.ErrNotAcquired, "a second handle is another session")

	require.NoError(t, h.Unlock(ctx))
	require.NoError(t, h.Unlock(ctx), "Unlock is idempotent")
	<-h.Done()
	assert.ErrorIs(t, h.Err(), advisory.ErrUnlocked)
	assert.True(t, p.free(ctx, k, false))
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	assert.EqualValues(t, 2, pool.Stat().TotalConns(), "clean unlocks keep both connections")
}

func TestLockAllSharedHandles(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	ks := []keys.Key{key(t), keys.Pair(pgtest.UniqueInt32(t), 3)}
	shared := &advisory.Options{Shared: true}
	a, err := l.LockAll(ctx, ks, shared)
	require.NoError(t, err)
	b, err := l.TryLockAll(ctx, ks, shared)
	require.NoError(t, err, "shared holders coexist")
	_, err = l.TryLockAll(ctx, ks, nil)
	require.ErrorIs(t, err, advisory.ErrNotAcquired)
	require.NoError(t, a.Unlock(ctx))
	require.NoError(t, b.Unlock(ctx))
	c, err := l.TryLockAll(ctx, ks, nil)
	require.NoError(t, err)
	require.NoError(t, c.Unlock(ctx))
}

func terminate(ctx context.Context, t *testing.T, k keys.Key) {
	t.Helper()
	admin := pgtest.Pool(t)
	infos, err := advisory.ListLocks(ctx, admin, k)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	var ok bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", infos[0].PID).Scan(&ok))
	require.True(t, ok)
}

func TestLockHandleSeesTerminatedBackend(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	// Heartbeats off: the loss must be seen without any polling traffic.
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1})
	k := key(t)
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	terminate(ctx, t, k)
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("loss not detected")
	}
	require.ErrorIs(t, h.Err(), advisory.ErrLockLost)
	err = h.Unlock(ctx)
	require.ErrorIs(t, err, advisory.ErrLockLost, "Unlock of a lost lock says so")
	assert.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
	// The holders hear of a loss before its connection's destroy ends (by
	// design); nothing signals the destroy but the pool's counts.
	assert.Eventually(t, func() bool { st := pool.Stat(); return st.AcquiredConns() == 0 && st.TotalConns() == 0 },
		waitBound, time.Millisecond, "the dead connection is destroyed")

	// The Locker works again afterwards, once the server has released the
	// dying backend's lock (its FATAL reaches the client before it exits):
	// a bounded wait, not a try.
	h2, err := l.Lock(ctx, k, &advisory.Options{Timeout: waitBound})
	require.NoError(t, err)
	require.NoError(t, h2.Unlock(ctx))
}

func TestHoldCancelsCallbackWithErrLockLost(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	k := key(t)
	inside := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- l.Hold(ctx, k, nil, func(ctx context.Context) error {
			close(inside)
			<-ctx.Done()
			assert.ErrorIs(t, context.Cause(ctx), advisory.ErrLockLost)
			return ctx.Err()
		})
	}()
	<-inside
	terminate(ctx, t, k)
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, err, advisory.ErrLockLost)
	case <-time.After(10 * time.Second):
		t.Fatal("Hold did not return after the loss")
	}
}

func TestHoldRunsAndReleases(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, pgtest.Pool(t), advisory.Config{})
	p := newProbe(t)
	k := key(t)
	sentinel := errors.New("done")
	err := l.Hold(ctx, k, nil, func(ctx context.Context) error {
		assert.False(t, p.free(ctx, k, false))
		return sentinel
	})
	assert.Same(t, sentinel, err)
	assert.True(t, p.free(ctx, k, false))

	h := hold(ctx, t, false, k)
	err = l.TryHold(ctx, k, nil, func(context.Context) error { t.Error("ran"); return nil })
	assert.ErrorIs(t, err, advisory.ErrNotAcquired)
	h.release()

	assert.PanicsWithValue(t, "hold bug", func() {
		_ = l.HoldAll(ctx, []keys.Key{k}, nil, func(context.Context) error { panic("hold bug") })
	})
	assert.True(t, p.free(ctx, k, false), "a panicking Hold releases before re-panicking")
}

func TestListLocksDecodesHoldersAndWaiters(t *testing.T) {
	ctx := testCtx(t)
	// The name is unique as the id is: a test run again (-count) registers
	// a new namespace, and a name may be registered once per process.
	id := pgtest.UniqueInt32(t)
	ns := keys.MustRegisterNamespace(id, fmt.Sprintf("list-test-%d", id))
	k := ns.Key(-42)
	other := key(t)
	cfg := pgtest.Config(t)
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	h, err := l.LockAll(ctx, []keys.Key{k, other}, &advisory.Options{Shared: true})
	require.NoError(t, err)
	defer h.Unlock(ctx) //nolint:errcheck

	waiterDone := make(chan error, 1)
	wctx, cancelWaiter := context.WithCancel(ctx)
	go func() {
		waiterDone <- l.WithLock(wctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	}()
	p := newProbe(t)
	awaitWaiting(ctx, t, p.pool, k, 1)

	infos, err := advisory.ListLocks(ctx, p.pool, k)
	require.NoError(t, err)
	require.Len(t, infos, 2, "one holder and one waiter on k")
	holderInfo, waiterInfo := infos[0], infos[1]
	assert.True(t, holderInfo.Granted)
	assert.True(t, holderInfo.Shared)
	assert.Equal(t, k, holderInfo.Key)
	assert.Equal(t, ns.Name(), holderInfo.Namespace)
	assert.Equal(t, cfg.ConnConfig.RuntimeParams["application_name"], holderInfo.ApplicationName)
	assert.False(t, holderInfo.BackendStart.IsZero())
	assert.False(t, waiterInfo.Granted)
	assert.False(t, waiterInfo.Shared)
	assert.False(t, waiterInfo.WaitStart.IsZero())
	assert.Equal(t, []int32{holderInfo.PID}, waiterInfo.BlockedBy)
	assert.Contains(t, waiterInfo.Query, "pg_advisory_lock")

	all, err := advisory.ListLocks(ctx, p.pool)
	require.NoError(t, err)
	found := 0
	for _, li := range all {
		if li.Key == other {
			found++
		}
	}
	assert.Equal(t, 1, found, "unfiltered listing includes the other key")

	cancelWaiter()
	assert.ErrorIs(t, <-waiterDone, context.Canceled)
	_, err = advisory.ListLocks(ctx, p.pool, keys.Key{})
	assert.ErrorIs(t, err, advisory.ErrInvalid)
}

func TestDetectProxyDirectConnection(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	proxied, err := advisory.DetectProxy(ctx, c.Conn())
	require.NoError(t, err)
	assert.False(t, proxied)
}

// Regression (issue 10 item 6): a Hold callback that returned the loss
// (context.Cause(ctx), the idiom) got it back from Hold twice over, once
// from fn and once from the unlock.
func TestHoldReportsTheLossOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		ret  func(ctx context.Context) error
	}{
		{"context.Cause", context.Cause},
		{"wrapped", func(ctx context.Context) error { return fmt.Errorf("work: %w", context.Cause(ctx)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			l := newLocker(t, pgtest.Pool(t), advisory.Config{})
			k := key(t)
			inside := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				errc <- l.Hold(ctx, k, nil, func(ctx context.Context) error {
					close(inside)
					<-ctx.Done()
					return tc.ret(ctx)
				})
			}()
			<-inside
			terminate(ctx, t, k)
			err := <-errc
			require.ErrorIs(t, err, advisory.ErrLockLost)
			assert.Equal(t, 1, strings.Count(err.Error(), "lock lost"), "%v", err)
			assert.Equal(t, 1, strings.Count(err.Error(), "57P01"), "%v", err)
		})
	}
}

package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// A silent partition (the proxy drops every byte, sockets stay open) is invisible to a
// blocked read; the heartbeat sees it. Holders learn of the loss while the server still
// holds their keys, so the heartbeat is what told them (the latency, about
// HeartbeatInterval + HeartbeatTimeout, is logged, not asserted: a loaded machine may
// add seconds to it). The history (holds; another session's tries refused during the
// partition; the keys taken by another session after it) is checked with
// history.LockModel: a loss the client saw bounds nothing until the keys are seen free.
func TestNetCutHeartbeatDetectsLoss(t *testing.T) {
	ctx := testCtx(t)
	cfg, proxy := proxiedPoolConfig(t)
	pool := pgtest.NewPool(t, cfg)
	admin := pgtest.Pool(t) // direct, not through the proxy
	const interval, timeout = 200 * time.Millisecond, 200 * time.Millisecond
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: interval, HeartbeatTimeout: timeout})

	holdKey, lockKey := int64Key(t), pairKey(t)
	rec := history.NewRecorder("test", nil)
	holdA := beginAttempt(rec, "hold", []keys.Key{holdKey}, false)
	entered, result := startHold(ctx, l, []keys.Key{holdKey})
	await(t, entered, "the Hold callback to start")
	holdA.Acquired()
	lockA := beginAttempt(rec, "handle", []keys.Key{lockKey}, false)
	h, err := l.Lock(ctx, lockKey, nil)
	require.NoError(t, err)
	lockA.Acquired()
	t.Cleanup(func() { _ = h.Unlock(context.Background()) })
	doneAt := make(chan time.Time, 1)
	go func() {
		<-h.Done()
		doneAt <- time.Now()
	}()
	holderPIDs(t, ctx, admin, holdKey, lockKey)

	// The holders' connections carry heartbeats while the network works (a ping is a
	// 13-byte simple query, "-- ping"), and the locks survive them.
	sent := proxy.ClientBytes()
	require.Eventually(t, func() bool { return proxy.ClientBytes() >= sent+4*13 }, waitBound, 5*time.Millisecond,
		"no heartbeat traffic through the proxy")
	require.NoError(t, h.Err(), "lost while the network worked")
	holderPIDs(t, ctx, admin, holdKey, lockKey)

	t0 := time.Now()
	// The Hold and the handle share one holder connection (issue 22).
	require.GreaterOrEqual(t, proxy.Cut(), 1, "the holders' connection")
	r := await(t, result, "Hold to return after the cut")
	lockLost := await(t, doneAt, "the handle's Done to close after the cut").Sub(t0)

	require.False(t, r.lostAt.IsZero(), "callback context not cancelled; Hold returned %v", r.err)
	assert.ErrorIs(t, r.cause, advisory.ErrLockLost)
	assert.ErrorIs(t, r.err, advisory.ErrLockLost)
	assert.ErrorIs(t, h.Err(), advisory.ErrLockLost)
	assert.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
	holdLost := r.lostAt.Sub(t0)
	t.Logf("network cut -> loss seen: Hold %v, Lock handle %v (bound: interval %v + timeout %v); cause: %v",
		holdLost.Round(time.Millisecond), lockLost.Round(time.Millisecond), interval, timeout, r.cause)
	assert.Zero(t, pool.Stat().AcquiredConns())

	// The server cannot tell a silent partition from an idle client: it still holds both
	// keys, so nobody else can take them until it finds out (TCP keepalive,
	// client_connection_check_interval). The holder stopped acting at once: safe.
	held := holderPIDs(t, ctx, admin, holdKey, lockKey)
	t.Logf("during the partition the server still holds the keys (backends %v)", held)
	direct := newLocker(t, admin, advisory.Config{})
	for _, k := range []keys.Key{holdKey, lockKey} {
		a := beginAttempt(rec, "probe "+k.String(), []keys.Key{k}, false)
		err := direct.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		require.ErrorIs(t, err, advisory.ErrNotAcquired, "the server still holds %v", k)
		a.Failed(history.Busy)
	}
	// End the partition with a reset: the sessions end and the keys are free.
	proxy.CloseCut()
	awaitLocks(t, ctx, admin, "the server to release the keys", func(ls []advisory.LockInfo) bool { return len(ls) == 0 },
		holdKey, lockKey)
	freed := history.Now()
	holdA.Lost(freed)
	lockA.Lost(freed)
	after := beginAttempt(rec, "after", []keys.Key{holdKey, lockKey}, false)
	err = direct.WithLockAll(ctx, []keys.Key{holdKey, lockKey}, nil, func(context.Context, *pgx.Conn) error {
		after.Acquired()
		after.Releasing()
		return nil
	})
	require.NoError(t, err)
	after.Released(true)
	history.Check(t, history.LockModel(), rec.Ops())
}

// With heartbeats disabled the watcher sends nothing; a terminated backend is still seen
// at once, by the blocked read on the idle connection.
func TestEventDrivenTerminateWithoutHeartbeat(t *testing.T) {
	ctx := testCtx(t)
	pool, admin := pgtest.Pool(t), pgtest.Pool(t)
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1})
	k := int64Key(t)

	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Unlock(context.Background()) })
	pid := holderPIDs(t, ctx, admin, k)[k]

	t0 := time.Now()
	terminate(t, ctx, admin, pid)
	await(t, h.Done(), "Done to close after the terminate")
	lost := time.Since(t0)
	assert.ErrorIs(t, h.Err(), advisory.ErrLockLost)
	assert.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
	t.Logf("heartbeat disabled: terminate -> Done closed: %v", lost)
}

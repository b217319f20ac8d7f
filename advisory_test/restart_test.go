package advisory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// A server restart (pg_ctl restart -m fast on a cluster this test owns) ends every
// session: every holder, Hold callbacks and Lock handles alike, sees ErrLockLost, no dead
// connection stays in the pool, and afterwards the same pool and Locker take locks again.
// The history (holds, losses bounded by the restart, the keys taken again after it) is
// checked with history.LockModel.
func TestRestartEveryHolderLoses(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.Cluster(t)
	cfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool := pgtest.NewPool(t, cfg)
	// Inspection goes through a pool of its own: an idle connection of the holders' pool
	// would outlive the restart dead, and the first call to draw it would fail (pgxpool
	// pings only connections idle for more than a second).
	adminCfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	admin := pgtest.NewPool(t, adminCfg)
	l := newLocker(t, pool, advisory.Config{})

	// Two Hold callbacks (one multi-key) and two handles (one shared, one multi-key).
	holdKeys := [][]keys.Key{{int64Key(t)}, {int64Key(t), pairKey(t)}}
	rec := history.NewRecorder("test", nil)
	var attempts []*attempt
	var results []<-chan holdResult
	for i, ks := range holdKeys {
		a := beginAttempt(rec, fmt.Sprint("hold", i), ks, false)
		entered, result := startHold(ctx, l, ks)
		await(t, entered, "a Hold callback to start")
		a.acquired()
		attempts = append(attempts, a)
		results = append(results, result)
	}
	sharedKey, multi := int64Key(t), []keys.Key{pairKey(t), int64Key(t)}
	a1 := beginAttempt(rec, "handle1", []keys.Key{sharedKey}, true)
	h1, err := l.Lock(ctx, sharedKey, &advisory.Options{Shared: true})
	require.NoError(t, err)
	a1.acquired()
	a2 := beginAttempt(rec, "handle2", multi, false)
	h2, err := l.LockAll(ctx, multi, nil)
	require.NoError(t, err)
	a2.acquired()
	attempts = append(attempts, a1, a2)
	handles := []*advisory.Lock{h1, h2}
	doneAt := make(chan time.Time, len(handles))
	for _, h := range handles {
		t.Cleanup(func() { _ = h.Unlock(context.Background()) }) // closes Done if the test fails early
		go func() {
			<-h.Done()
			doneAt <- time.Now()
		}()
	}

	all := append([]keys.Key{sharedKey}, multi...)
	for _, ks := range holdKeys {
		all = append(all, ks...)
	}
	holderPIDs(t, ctx, admin, all...)

	t0 := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	require.NoError(t, cluster.Restart(rctx))
	cancel()
	restarted := time.Since(t0)
	for _, a := range attempts {
		a.lost(history.Now()) // every session of the old server has ended
	}

	var detect []time.Duration
	for _, result := range results {
		r := await(t, result, "Hold to return after the restart")
		require.False(t, r.lostAt.IsZero(), "callback context not cancelled; Hold returned %v", r.err)
		assert.ErrorIs(t, r.cause, advisory.ErrLockLost)
		assert.ErrorIs(t, r.err, advisory.ErrLockLost)
		detect = append(detect, r.lostAt.Sub(t0))
	}
	for _, h := range handles {
		detect = append(detect, await(t, doneAt, "a handle's Done to close after the restart").Sub(t0))
		assert.ErrorIs(t, h.Err(), advisory.ErrLockLost)
		assert.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
	}
	t.Logf("restart issued -> loss seen (Hold callback ctx cancelled, handle Done closed): %s; pg_ctl restart took %v; handle errors: %v / %v",
		latencies(detect), restarted.Round(time.Millisecond), h1.Err(), h2.Err())

	st := pool.Stat()
	assert.Zero(t, st.AcquiredConns())
	assert.Zero(t, st.TotalConns(), "a connection of the old server stayed in the pool")

	// The pool recovers: fresh connections, and locks work again, contention included.
	k := int64Key(t)
	ran := false
	require.NoError(t, l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		ran = true
		return nil
	}))
	assert.True(t, ran)
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	err = l.TryWithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
	assert.ErrorIs(t, err, advisory.ErrNotAcquired, "another session of the pool must be excluded")
	require.NoError(t, h.Unlock(ctx))
	require.NoError(t, l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil }))
	err = l.Hold(ctx, k, nil, func(ctx context.Context) error { return ctx.Err() })
	require.NoError(t, err)
	assert.Zero(t, pool.Stat().AcquiredConns())

	// Every key the old server held is free on the new one.
	again := beginAttempt(rec, "after", all, false)
	require.NoError(t, l.TryWithLockAll(ctx, all, nil, func(context.Context, *pgx.Conn) error {
		again.acquired()
		again.releasing()
		return nil
	}))
	again.released(true)
	history.Check(t, history.LockModel(), rec.Ops())
}

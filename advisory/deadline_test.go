package advisory_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/keys"
)

// TestCycleSetsNoSocketDeadline: an uncontended cycle of each helper sets
// no deadline on its connection's socket. A deadline set and cleared per
// cycle (the unlock's cleanup bound did that) arms a runtime timer each
// time, which wakes Go's network poller (an eventfd write and a thread
// woken per cycle: issue 19, BENCHMARKS.md "where the time goes"); the
// cleanup bound is pooltx's shared one instead. Counted on the sockets,
// so it holds on a loaded machine. The handle's heartbeat is disabled:
// a watcher that starts in a slow cycle sets its read deadline, which is
// its job.
func TestCycleSetsNoSocketDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rt := &roundtrip.Counter{}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.DialFunc = rt.DialFunc
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1})
	k := key(t)
	ks := []keys.Key{key(t), key(t)}
	for _, c := range []struct {
		name string
		op   func() error
	}{
		{"WithLock", func() error { return l.WithLock(ctx, k, nil, noopSession) }},
		{"TryWithLock", func() error { return l.TryWithLock(ctx, k, nil, noopSession) }},
		{"WithLockAll", func() error { return l.WithLockAll(ctx, ks, nil, noopSession) }},
		{"Lock+Unlock", func() error { return handleCycle(ctx, l, k) }},
		{"LockAll+Unlock", func() error {
			h, err := l.LockAll(ctx, ks, nil)
			if err != nil {
				return err
			}
			return h.Unlock(ctx)
		}},
		{"WithXactLock", func() error { return l.WithXactLock(ctx, k, nil, noopXact) }},
	} {
		for range 3 { // connections dialled, statements and the reset's probe prepared
			require.NoError(t, c.op(), c.name)
		}
		rt.Deadlines()
		for range 20 {
			require.NoError(t, c.op(), c.name)
		}
		assert.Zero(t, rt.Deadlines(), "%s: socket deadlines set in 20 cycles", c.name)
	}
}

// TestBoundedWaitIsNotATimerContext: a call whose wait is bounded (a Try
// call's wait for a connection, Locker.tryConnWait; a blocking call's
// Options.Timeout or Config.LockTimeout) bounds it without a
// context.WithTimeout, whose runtime timer, armed and stopped per call,
// woke Go's network poller once per call (0.46-0.50 eventfd writes per
// TryWithLock cycle, 0.008 without; issue 19). The bounds themselves are
// TestNoConnectionIsNotALockTimeout's and the timeout tests'. The context
// the pool is asked under is seen by its PrepareConn hook; a timer
// context's type is the only way to tell one from outside.
func TestBoundedWaitIsNotATimerContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen []string
	cfg := pgtest.Config(t)
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		_, ok := ctx.Deadline()
		seen = append(seen, fmt.Sprintf("%T deadline=%v", ctx, ok))
		return true, nil
	}
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1})
	bounded := newLocker(t, pool, advisory.Config{LockTimeout: time.Minute, HeartbeatInterval: -1})
	k := key(t)
	ks := []keys.Key{key(t), key(t)}
	timeout := &advisory.Options{Timeout: time.Minute}
	for _, c := range []struct {
		name string
		op   func() error
	}{
		{"TryWithLock", func() error { return l.TryWithLock(ctx, k, nil, noopSession) }},
		{"WithLock, Options.Timeout", func() error { return l.WithLock(ctx, k, timeout, noopSession) }},
		{"WithLock, Config.LockTimeout", func() error { return bounded.WithLock(ctx, k, nil, noopSession) }},
		{"WithLockAll, Options.Timeout", func() error { return l.WithLockAll(ctx, ks, timeout, noopSession) }},
		{"Lock+Unlock, Options.Timeout", func() error {
			h, err := l.Lock(ctx, k, timeout)
			if err != nil {
				return err
			}
			return h.Unlock(ctx)
		}},
		{"TryLock+Unlock", func() error { return tryHandleCycle(ctx, l, k) }},
		{"TryWithXactLock", func() error { return l.TryWithXactLock(ctx, k, nil, noopXact) }},
		{"WithXactLock, Options.Timeout", func() error { return l.WithXactLock(ctx, k, timeout, noopXact) }},
		{"WithXactLock, Config.LockTimeout", func() error { return bounded.WithXactLock(ctx, k, nil, noopXact) }},
		{"WithXactLockAll, Options.Timeout", func() error { return l.WithXactLockAll(ctx, ks, timeout, noopXact) }},
		{"TryWithXactLockBatch", func() error { return l.TryWithXactLockBatch(ctx, ks, nil, selectOne()) }},
		{"WithXactLockBatch, Options.Timeout", func() error { return l.WithXactLockBatch(ctx, ks, timeout, selectOne()) }},
		{"WithXactLockBatch, Config.LockTimeout", func() error { return bounded.WithXactLockBatch(ctx, ks, nil, selectOne()) }},
	} {
		require.NoError(t, c.op(), c.name) // and the proxy check, once
		seen = nil
		require.NoError(t, c.op(), c.name)
		require.Len(t, seen, 1, c.name)
		assert.NotContains(t, seen[0], "context.timerCtx", c.name)
		assert.Contains(t, seen[0], "deadline=true", "%s: the wait is still bounded", c.name)
	}
}

// TestBoundReachedIsADeadlineInDerivedContexts: a context derived from a
// bounded call's wait (by a pool hook here; by the library's own ping of a
// connection it found dead, or a tracer) ends with
// context.DeadlineExceeded at the bound, as one derived from a
// context.WithTimeout does, and the call's error matches ErrNoConnection
// and context.DeadlineExceeded, never context.Canceled: the caller's ctx
// was not cancelled. (The library's bound once handed derived contexts
// context.Canceled.)
func TestBoundReachedIsADeadlineInDerivedContexts(t *testing.T) {
	ctx := testCtx(t)
	var block atomic.Bool
	seen := make(chan error, 1)
	cfg := pgtest.Config(t)
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if !block.Load() {
			return true, nil
		}
		d, cancel := context.WithCancel(ctx) // what a hook or tracer derives
		defer cancel()
		<-d.Done()
		seen <- d.Err()
		return false, d.Err()
	}
	pool := pgtest.NewPool(t, cfg)
	const bound = 50 * time.Millisecond
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: -1})
	bounded := newLocker(t, pool, advisory.Config{LockTimeout: bound, HeartbeatInterval: -1})
	timeout := &advisory.Options{Timeout: bound}
	k := key(t)
	for _, c := range []struct {
		name string
		op   func() error
	}{
		{"TryWithLock", func() error { return bounded.TryWithLock(ctx, k, nil, noopSession) }},
		{"WithLock, Options.Timeout", func() error { return l.WithLock(ctx, k, timeout, noopSession) }},
		{"Lock, Config.LockTimeout", func() error { return handleCycle(ctx, bounded, k) }},
		{"WithXactLock, Options.Timeout", func() error { return l.WithXactLock(ctx, k, timeout, noopXact) }},
		{"TryWithXactLock", func() error { return bounded.TryWithXactLock(ctx, k, nil, noopXact) }},
		{"WithXactLockBatch, Config.LockTimeout", func() error { return bounded.WithXactLockBatch(ctx, []keys.Key{k}, nil, selectOne()) }},
	} {
		require.NoError(t, c.op(), c.name) // the proxy check, once
		block.Store(true)
		err := c.op()
		block.Store(false)
		select {
		case derr := <-seen:
			assert.Equal(t, context.DeadlineExceeded, derr, "%s: the derived context's Err", c.name)
		default:
			t.Errorf("%s: the pool's hook did not run", c.name)
		}
		assert.ErrorIs(t, err, advisory.ErrNoConnection, c.name)
		assert.ErrorIs(t, err, context.DeadlineExceeded, c.name)
		assert.NotErrorIs(t, err, context.Canceled, "%s: ctx was not cancelled", c.name)
	}
}

// TestBoundErrNeverChanges: once a bounded call's wait has ended, the
// context's Err and context.Cause stay what they first were (the context
// contract), in the hook that saw the bound pass and in what it derived:
// a cancellation of the caller's ctx afterwards does not turn the bound's
// context.DeadlineExceeded into context.Canceled. (Review round 9.)
func TestBoundErrNeverChanges(t *testing.T) {
	ctx := testCtx(t)
	type seen struct{ atBound, afterCancel, cause, child error }
	got := make(chan seen, 1)
	reached, cancelled := make(chan struct{}), make(chan struct{})
	var block atomic.Bool
	cfg := pgtest.Config(t)
	cfg.PrepareConn = func(hctx context.Context, _ *pgx.Conn) (bool, error) {
		if !block.Load() {
			return true, nil
		}
		child, stop := context.WithCancel(hctx)
		defer stop()
		<-hctx.Done() // the bound passes
		var s seen
		s.atBound = hctx.Err()
		close(reached)
		<-cancelled    // the caller has cancelled its ctx
		<-child.Done() // ended by the bound, in a goroutine of its own (context.AfterFunc)
		s.afterCancel, s.cause, s.child = hctx.Err(), context.Cause(hctx), child.Err()
		got <- s
		return false, hctx.Err()
	}
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{LockTimeout: 50 * time.Millisecond, HeartbeatInterval: -1})
	require.NoError(t, l.WithLock(ctx, key(t), nil, noopSession)) // the proxy check, once
	block.Store(true)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.WithLock(cctx, key(t), nil, noopSession) }()
	<-reached
	cancel()
	close(cancelled)
	s := <-got
	err := <-done
	assert.Equal(t, context.DeadlineExceeded, s.atBound)
	assert.Equal(t, context.DeadlineExceeded, s.afterCancel, "Err changed after the caller's cancellation")
	assert.Equal(t, context.DeadlineExceeded, s.cause, "context.Cause")
	assert.Equal(t, context.DeadlineExceeded, s.child, "a context derived before the bound passed")
	assert.ErrorIs(t, err, advisory.ErrNoConnection)
}

// selectOne is a batch of one harmless statement.
func selectOne() *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue("SELECT 1")
	return b
}

package advisory_test

import (
	"context"
	"fmt"
	"testing"

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

// TestTryConnWaitIsNotATimerContext: a Try call bounds its wait for a
// connection (Locker.tryConnWait) without a context.WithTimeout, whose
// runtime timer, armed and stopped per call, woke Go's network poller once
// per call (0.46-0.50 eventfd writes per TryWithLock cycle, 0.008 without;
// issue 19). The bound itself is TestNoConnectionIsNotALockTimeout's. The
// context the pool is asked under is seen by its PrepareConn hook; a
// timer context's type is the only way to tell one from outside.
func TestTryConnWaitIsNotATimerContext(t *testing.T) {
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
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	require.NoError(t, l.TryWithLock(ctx, k, nil, noopSession)) // and the proxy check, once
	seen = nil
	require.NoError(t, l.TryWithLock(ctx, k, nil, noopSession))
	require.Len(t, seen, 1)
	assert.NotContains(t, seen[0], "context.timerCtx")
	assert.Contains(t, seen[0], "deadline=true", "the wait is still bounded")
}

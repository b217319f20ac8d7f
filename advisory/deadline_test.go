package advisory_test

import (
	"context"
	"testing"

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

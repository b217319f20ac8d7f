package advisory_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// The reset that undoes what a callback or batch did to its session runs after the
// call has returned: the call returns once its unlock or COMMIT has answered, and the
// connection goes back to the pool only once the reset has (the pool waits, not the
// caller). Made deterministic by a reset that cannot finish: the work plants, under the
// name of the reset's probe (which runs first), a statement that waits for a lock the
// test holds. Each call must return while the reset waits; its key must be free by
// then; its connection must stay out of the pool until the test lets the reset finish,
// and then go back holding nothing. A session-scope callback also takes its call's keys
// again (locks stack): they too are free when the call returns, the reset still waiting.
// Before, each call waited for the whole reset (it shared the unlock's or COMMIT's
// answer), and so for the test's lock: none returned.
func TestCallReturnsBeforeItsResetHasAnswered(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	blockerKey := pgtest.UniqueInt64(t)
	plant := []string{
		"DEALLOCATE pgxlock_reset",
		"PREPARE pgxlock_reset AS SELECT pg_catalog.pg_advisory_lock(" + strconv.FormatInt(blockerKey, 10) + ")",
	}
	var retake []string // the session-scope callback's own locks on its call's keys
	onConn := func(ctx context.Context, c *pgx.Conn) error {
		for _, sql := range append(retake, plant...) {
			if _, err := c.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	}
	onTx := func(ctx context.Context, tx pgx.Tx) error { return onConn(ctx, tx.Conn()) }
	batch := func() *pgx.Batch {
		b := &pgx.Batch{}
		for _, sql := range plant {
			b.Queue(sql)
		}
		return b
	}
	calls := []struct {
		name    string
		keys    int
		session bool // the callback takes the call's keys again
		call    func(l *advisory.Locker, ks []keys.Key) error
	}{
		{"WithLock", 1, true, func(l *advisory.Locker, ks []keys.Key) error { return l.WithLock(ctx, ks[0], nil, onConn) }},
		{"TryWithLock", 1, true, func(l *advisory.Locker, ks []keys.Key) error { return l.TryWithLock(ctx, ks[0], nil, onConn) }},
		{"WithLockAll", 3, true, func(l *advisory.Locker, ks []keys.Key) error { return l.WithLockAll(ctx, ks, nil, onConn) }},
		{"WithXactLock", 1, false, func(l *advisory.Locker, ks []keys.Key) error { return l.WithXactLock(ctx, ks[0], nil, onTx) }},
		{"WithXactLockAll", 3, false, func(l *advisory.Locker, ks []keys.Key) error { return l.WithXactLockAll(ctx, ks, nil, onTx) }},
		{"WithXactLockBatch", 2, false, func(l *advisory.Locker, ks []keys.Key) error { return l.WithXactLockBatch(ctx, ks, nil, batch()) }},
		{"TryWithXactLockBatch", 1, false, func(l *advisory.Locker, ks []keys.Key) error { return l.TryWithXactLockBatch(ctx, ks, nil, batch()) }},
		{"pooltx.WithConn", 0, false, func(l *advisory.Locker, _ []keys.Key) error {
			return pooltx.WithConn(ctx, l.Pool(), nil, func(ctx context.Context, c *pooltx.Conn) error { return onConn(ctx, c.Conn()) })
		}},
		{"pooltx.WithTx", 0, false, func(l *advisory.Locker, _ []keys.Key) error { return pooltx.WithTx(ctx, l.Pool(), nil, onTx) }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 2
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			p := newProbe(t)
			ks := make([]keys.Key, c.keys)
			retake = nil
			for i := range ks {
				ks[i] = key(t)
				if c.session {
					v, _ := ks[i].Int64()
					retake = append(retake, "SELECT pg_advisory_lock("+strconv.FormatInt(v, 10)+")")
				}
			}

			blocker, err := admin.Acquire(ctx)
			require.NoError(t, err)
			defer blocker.Release()
			_, err = blocker.Exec(ctx, "SELECT pg_advisory_lock($1)", blockerKey)
			require.NoError(t, err)
			unblocked := false
			unblock := func() {
				if !unblocked {
					unblocked = true
					_, err := blocker.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", blockerKey)
					require.NoError(t, err)
				}
			}
			defer unblock()

			done := make(chan error, 1)
			go func() { done <- c.call(l, ks) }()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second): // a guard, not a measure: the reset waits for the test
				t.Fatal("the call did not return while its reset waited: the caller waited for the reset")
			}
			for _, k := range ks {
				assert.True(t, p.free(ctx, k, false), "the call's key is free once it has returned (taken again by a session callback too)")
			}
			assert.EqualValues(t, 1, pool.Stat().AcquiredConns(), "the connection stays out of the pool while its reset waits")

			unblock()
			pgtest.Settle()
			assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
			assert.EqualValues(t, 1, pool.Stat().TotalConns(), "the reset succeeded: the connection was kept")
			pgtest.AssertNoAdvisoryLocks(t, pool) // the lock the planted probe took went with the reset
		})
	}
}

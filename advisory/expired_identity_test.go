package advisory_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// Review round 11, outcome "expired context": a WithLock whose bound expires
// after it pinned the connection but before its lock statement was sent
// ("Given up before the lock statement was sent: send nothing") releases a
// connection never lent, whose reset named no identity before: the next
// borrower got the login user. Tiny timeouts on a fresh Locker (whose first call
// also runs the proxy check) hit the window.
func TestWithLockExpiredBeforeLockStatementKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, newProbe(t).pool)
	pool := afterConnectRolePool(t, role, nil)
	pid0 := requireRole(ctx, t, pool, role)
	hits := 0
	for i := 0; i < 2000; i++ {
		l, err := advisory.New(pool, advisory.Config{})
		require.NoError(t, err)
		d := time.Duration(20+(i%40)*10) * time.Microsecond
		err = l.WithLock(ctx, key(t), &advisory.Options{Timeout: d}, func(context.Context, *pgx.Conn) error { return nil })
		if err == nil {
			continue
		}
		hits++
		cur, pid := whoAndPID(ctx, t, pool)
		if cur != role {
			t.Fatalf("attempt %d (timeout %v, err %v): the next borrower's current_user is %q (pid %d, first pid %d), not the AfterConnect role %q",
				i, d, err, cur, pid, pid0, role)
		}
	}
	t.Logf("%d calls failed, identity kept in every one", hits)
}

// Deterministic form: a PrepareConn hook that only waits (it runs no
// statement) lets the call's bound expire between the pin and the first
// statement; the call sends nothing, and before, the connection came back
// with the login user's identity.
func TestWithLockBoundExpiredAfterPinKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, newProbe(t).pool)
	var slow atomic.Bool
	pool := afterConnectRolePool(t, role, &slow)
	pid0 := requireRole(ctx, t, pool, role)
	l := newLocker(t, pool, advisory.Config{})
	slow.Store(true)
	err := l.WithLock(ctx, key(t), &advisory.Options{Timeout: 10 * time.Millisecond}, func(context.Context, *pgx.Conn) error { return nil })
	slow.Store(false)
	require.Error(t, err)
	t.Logf("WithLock: %v", err)
	assertKept(ctx, t, pool, pid0, role, "a WithLock whose bound expired before it sent anything")
}

// The same slow-PrepareConn window, every helper that takes a bound.
func TestEveryHelperBoundExpiredAfterPinKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, newProbe(t).pool)
	type helper struct {
		name string
		run  func(l *advisory.Locker, o *advisory.Options) error
	}
	nop := func(context.Context, *pgx.Conn) error { return nil }
	nopTx := func(context.Context, pgx.Tx) error { return nil }
	helpers := []helper{
		{"WithLock", func(l *advisory.Locker, o *advisory.Options) error { return l.WithLock(ctx, key(t), o, nop) }},
		{"WithLockAll", func(l *advisory.Locker, o *advisory.Options) error {
			return l.WithLockAll(ctx, []keys.Key{key(t), key(t)}, o, nop)
		}},
		{"WithXactLock", func(l *advisory.Locker, o *advisory.Options) error { return l.WithXactLock(ctx, key(t), o, nopTx) }},
		{"WithXactLockAll", func(l *advisory.Locker, o *advisory.Options) error {
			return l.WithXactLockAll(ctx, []keys.Key{key(t), key(t)}, o, nopTx)
		}},
		{"WithXactLockBatch", func(l *advisory.Locker, o *advisory.Options) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			return l.WithXactLockBatch(ctx, []keys.Key{key(t)}, o, b)
		}},
		{"Hold", func(l *advisory.Locker, o *advisory.Options) error {
			return l.Hold(ctx, key(t), o, func(context.Context) error { return nil })
		}},
		{"Lock", func(l *advisory.Locker, o *advisory.Options) error {
			h, err := l.Lock(ctx, key(t), o)
			if h != nil {
				_ = h.Unlock(ctx)
			}
			return err
		}},
	}
	for _, checked := range []bool{false, true} {
		for _, h := range helpers {
			t.Run(fmt.Sprintf("proxyChecked=%v/%s", checked, h.name), func(t *testing.T) {
				var slow atomic.Bool
				pool := afterConnectRolePool(t, role, &slow)
				l := newLocker(t, pool, advisory.Config{})
				if checked { // a first call that runs the proxy check and sends nothing else lent
					hd, err := l.Lock(ctx, key(t), nil)
					require.NoError(t, err)
					require.NoError(t, hd.Unlock(ctx))
				}
				pid0 := requireRole(ctx, t, pool, role)
				slow.Store(true)
				err := h.run(l, &advisory.Options{Timeout: 10 * time.Millisecond})
				slow.Store(false)
				t.Logf("%s: %v", h.name, err)
				assertKept(ctx, t, pool, pid0, role, h.name+" whose bound expired after the pin")
			})
		}
	}
}

package advisory_test

import (
	"context"
	"errors"
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
	"github.com/pgxlock/pgxlock/keys"
)

func firstUseRole(ctx context.Context, t *testing.T, p *pgxpool.Pool) string {
	r := fmt.Sprintf("pgxlock_fu_%d", pgtest.UniqueInt32(t)&0x7fffffff)
	_, err := p.Exec(ctx, "CREATE ROLE "+pgx.Identifier{r}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize())
	})
	return r
}

// afterConnectRolePool is a pool of one connection whose AfterConnect
// runs SET ROLE role; with slow set, its PrepareConn waits 30 ms (and runs
// no statement) while *slow is true.
func afterConnectRolePool(t *testing.T, role string, slow *atomic.Bool) *pgxpool.Pool {
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize())
		return err
	}
	if slow != nil {
		cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
			if slow.Load() {
				time.Sleep(30 * time.Millisecond)
			}
			return true, nil
		}
	}
	return pgtest.NewPool(t, cfg)
}

func whoAndPID(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (cur string, pid uint32) {
	t.Helper()
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text, pg_backend_pid()").Scan(&cur, &pid))
	return cur, pid
}

// requireRole checks that pool's connection runs as role and returns its
// backend's pid.
func requireRole(ctx context.Context, t *testing.T, pool *pgxpool.Pool, role string) uint32 {
	t.Helper()
	cur, pid := whoAndPID(ctx, t, pool)
	require.Equal(t, role, cur)
	return pid
}

// assertKept checks that the next borrower of pool has the connection of
// pid0, running as role, after what after says.
func assertKept(ctx context.Context, t *testing.T, pool *pgxpool.Pool, pid0 uint32, role, after string) {
	t.Helper()
	cur, pid := whoAndPID(ctx, t, pool)
	assert.Equal(t, pid0, pid, "same connection kept")
	assert.Equal(t, role, cur, "current_user of the next borrower after %s", after)
}

// Review round 11 (failed before the identity was recorded at the first
// pin): after every helper, in every outcome, the next borrower sees the
// identity AfterConnect set, never the login user's. Here the helper's
// outcome is a lock timeout (kept connection) on a connection never lent
// before.
func TestWithLockTimeoutOnFirstUseKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, pgtest.Pool(t))
	pool := afterConnectRolePool(t, role, nil)
	pid0 := requireRole(ctx, t, pool, role)

	k := key(t)
	h := hold(ctx, t, false, k)
	l := newLocker(t, pool, advisory.Config{})
	err := l.WithLock(ctx, k, &advisory.Options{Timeout: 200 * time.Millisecond}, func(context.Context, *pgx.Conn) error {
		return nil
	})
	require.True(t, errors.Is(err, advisory.ErrLockTimeout), "err: %v", err)
	assertKept(ctx, t, pool, pid0, role, "WithLock timed out")
	// (Before, the first Lend then recorded the login user as the
	// connection's identity, and every later reset kept it.)
	h.release()
	require.NoError(t, l.WithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SELECT 1")
		return err
	}))
	assertKept(ctx, t, pool, pid0, role, "a later WithLock whose callback ran a statement")
}

// Same, TryWithLockAll where one key of two is busy (a partial take).
func TestTryWithLockAllPartialOnFirstUseKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, pgtest.Pool(t))
	pool := afterConnectRolePool(t, role, nil)
	pid0 := requireRole(ctx, t, pool, role)

	k1, k2 := key(t), key(t)
	h := hold(ctx, t, false, k2)
	defer h.release()
	l := newLocker(t, pool, advisory.Config{})
	err := l.TryWithLockAll(ctx, []keys.Key{k1, k2}, nil, func(context.Context, *pgx.Conn) error { return nil })
	require.True(t, errors.Is(err, advisory.ErrNotAcquired), "err: %v", err)
	assertKept(ctx, t, pool, pid0, role, "TryWithLockAll was refused")
}

// Same, a handle: Locker.Lock timing out.
func TestLockHandleTimeoutOnFirstUseKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, pgtest.Pool(t))
	pool := afterConnectRolePool(t, role, nil)
	pid0 := requireRole(ctx, t, pool, role)

	k := key(t)
	h := hold(ctx, t, false, k)
	defer h.release()
	l := newLocker(t, pool, advisory.Config{DisableMultiplexing: true})
	lk, err := l.Lock(ctx, k, &advisory.Options{Timeout: 200 * time.Millisecond})
	if lk != nil {
		_ = lk.Unlock(ctx)
	}
	require.True(t, errors.Is(err, advisory.ErrLockTimeout), "err: %v", err)
	assertKept(ctx, t, pool, pid0, role, "Lock timed out")
}

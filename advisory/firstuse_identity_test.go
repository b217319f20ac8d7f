package advisory_test

import (
	"context"
	"errors"
	"fmt"
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

func afterConnectRolePool(t *testing.T, role string) *pgxpool.Pool {
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize())
		return err
	}
	return pgtest.NewPool(t, cfg)
}

func whoAndPID(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (cur string, pid uint32) {
	t.Helper()
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text, pg_backend_pid()").Scan(&cur, &pid))
	return cur, pid
}

// Review round 11 (failed before the identity was recorded at the first pin): after every helper, in every outcome, the next borrower sees
// the identity AfterConnect set, never the login user's. Here the helper's
// outcome is a lock timeout (kept connection) on a connection never lent
// before.
func TestWithLockTimeoutOnFirstUseKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, pgtest.Pool(t))
	pool := afterConnectRolePool(t, role)
	cur0, pid0 := whoAndPID(ctx, t, pool)
	require.Equal(t, role, cur0)

	k := key(t)
	h := hold(ctx, t, false, k)
	l := newLocker(t, pool, advisory.Config{})
	err := l.WithLock(ctx, k, &advisory.Options{Timeout: 200 * time.Millisecond}, func(context.Context, *pgx.Conn) error {
		return nil
	})
	require.True(t, errors.Is(err, advisory.ErrLockTimeout), "err: %v", err)
	cur, pid := whoAndPID(ctx, t, pool)
	assert.Equal(t, pid0, pid, "same connection kept")
	assert.Equal(t, role, cur, "current_user of the next borrower after WithLock timed out")
	// The first Lend now records the login user as the connection's
	// identity: every later reset keeps it.
	h.release()
	require.NoError(t, l.WithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SELECT 1")
		return err
	}))
	cur, pid = whoAndPID(ctx, t, pool)
	assert.Equal(t, pid0, pid, "same connection kept")
	assert.Equal(t, role, cur, "current_user of the next borrower after a later WithLock whose callback ran a statement")
}

// Same, TryWithLockAll where one key of two is busy (a partial take).
func TestTryWithLockAllPartialOnFirstUseKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, pgtest.Pool(t))
	pool := afterConnectRolePool(t, role)
	cur0, pid0 := whoAndPID(ctx, t, pool)
	require.Equal(t, role, cur0)

	k1, k2 := key(t), key(t)
	busy := k2
	if keys.Compare(k1, k2) > 0 {
		busy = k1
	}
	_ = busy
	h := hold(ctx, t, false, k2)
	defer h.release()
	l := newLocker(t, pool, advisory.Config{})
	err := l.TryWithLockAll(ctx, []keys.Key{k1, k2}, nil, func(context.Context, *pgx.Conn) error { return nil })
	require.True(t, errors.Is(err, advisory.ErrNotAcquired), "err: %v", err)
	cur, pid := whoAndPID(ctx, t, pool)
	assert.Equal(t, pid0, pid, "same connection kept")
	assert.Equal(t, role, cur, "current_user of the next borrower after TryWithLockAll was refused")
}

// Same, a handle: Locker.Lock timing out.
func TestLockHandleTimeoutOnFirstUseKeepsAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	role := firstUseRole(ctx, t, pgtest.Pool(t))
	pool := afterConnectRolePool(t, role)
	cur0, pid0 := whoAndPID(ctx, t, pool)
	require.Equal(t, role, cur0)

	k := key(t)
	h := hold(ctx, t, false, k)
	defer h.release()
	l := newLocker(t, pool, advisory.Config{DisableMultiplexing: true})
	lk, err := l.Lock(ctx, k, &advisory.Options{Timeout: 200 * time.Millisecond})
	if lk != nil {
		_ = lk.Unlock(ctx)
	}
	require.True(t, errors.Is(err, advisory.ErrLockTimeout), "err: %v", err)
	cur, pid := whoAndPID(ctx, t, pool)
	assert.Equal(t, pid0, pid, "same connection kept")
	assert.Equal(t, role, cur, "current_user of the next borrower after Lock timed out")
}

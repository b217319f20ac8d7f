package advisory_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// The waiting backend is frozen (SIGSTOP), so it can answer neither the
// wait nor the cancel request: after the grace period the library cuts the
// socket short, returns promptly, and destroys the connection. Runs on a
// private cluster so that the frozen backend bothers nobody else.
func TestCancelledWaitOnFrozenBackendReturnsAndDestroys(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.Cluster(t)
	newPool := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(cluster.DSN())
		require.NoError(t, err)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	pool, admin := newPool(), newPool()
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	v, _ := k.Int64()

	holder, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", v)
	require.NoError(t, err)

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- l.WithLock(wctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
	}()
	var pid int
	classid, objid, objsubid := k.PgLocks()
	require.Eventually(t, func() bool {
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid = $2 AND objsubid = $3`, classid, objid, objsubid).Scan(&pid)
		return err == nil
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	defer syscall.Kill(pid, syscall.SIGCONT) //nolint:errcheck

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
		t.Logf("returned %v after the cancel (grace 500ms)", time.Since(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("a cancelled wait on a frozen backend did not return")
	}
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "the connection in doubt is destroyed")
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	require.NoError(t, err)
}

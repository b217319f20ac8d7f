package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// ReleaseAll's doc: it deletes every lease of the owner, also one whose
// renewal is committing at that moment (review 30g: it waited for the
// renewal's row lock, then deleted nothing and returned 0).
func TestReleaseAllDeletesALeaseBeingRenewed(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	_, err := m.TryAcquire(ctx, "r", &lease.AcquireOptions{Owner: "dead"})
	require.NoError(t, err)
	holders := pgx.Identifier{schema, "pgxlock_leases"}.Sanitize()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// What a renewal does to the row, not yet committed.
	_, err = tx.Exec(ctx, "UPDATE "+holders+" SET expires_at = now() + interval '1 minute' WHERE resource = 'r'")
	require.NoError(t, err)
	var xid int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid))
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() { n, err := m.ReleaseAll(ctx, "dead"); done <- result{n, err} }()
	require.Eventually(t, func() bool {
		return queryOne[bool](t, pool, "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted AND transactionid::text::bigint = $1", xid)
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, int64(1), r.n)
	left, err := m.List(ctx, &lease.ListOptions{Owner: "dead", IncludeExpired: true})
	require.NoError(t, err)
	assert.Empty(t, left)
}

// The package doc's Isolation: a table lock on the lease tables is waited
// for without TryLockTimeout by a connection's first use of a statement (a
// Try call there ends with its context's error), and with it by a
// connection that has run the statement before (ErrNotAcquired).
func TestATableLockOnTheLeaseTablesAndTheFirstUseOfAStatement(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	cfg := lease.ManagerConfig{TTL: time.Minute, ReleaseTimeout: 200 * time.Millisecond}
	newManager(t, admin, schema, cfg) // the tables
	cfg.Schema = schema
	pcfg := pgtest.Config(t)
	pcfg.MaxConns = 1
	pool := pgtest.NewPool(t, pcfg) // a fresh connection: nothing prepared
	m, err := lease.NewManager(pool, cfg)
	require.NoError(t, err)
	holders := pgx.Identifier{schema, "pgxlock_leases"}.Sanitize()
	lockTable := func() pgx.Tx {
		tx, err := admin.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "LOCK TABLE "+holders+" IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
		return tx
	}

	tx := lockTable()
	bounded, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = m.TryAcquire(bounded, "r", nil)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, lease.ErrNotAcquired)
	require.NoError(t, tx.Rollback(ctx))

	l, err := m.TryAcquire(ctx, "r", nil) // the statement is now prepared on the connection
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	tx = lockTable()
	_, err = m.TryAcquire(ctx, "r", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired)
	require.NoError(t, tx.Rollback(ctx))
}

// Acquire's doc: an attempt whose connection failed ends the wait with the
// connection's error (not ErrNotAcquired): here a restart of the server
// while the wait goes on.
func TestAcquireWaitEndsWhenTheServerRestarts(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.Cluster(t)
	pcfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	pool := pgtest.NewPool(t, pcfg)
	m := newManager(t, pool, pgtest.Schema(t, pool), lease.ManagerConfig{TTL: time.Minute})
	_, err = m.TryAcquire(ctx, "r", nil) // held until its TTL
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := m.Acquire(wctx, "r", nil); errc <- err }()
	require.Eventually(t, func() bool { // the waiter's LISTEN connection is up
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'ClientRead' AND query LIKE 'LISTEN%'").Scan(&n)
		return n > 0
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, cluster.Restart(ctx))
	err = <-errc
	require.Error(t, err)
	var le *lease.Error
	require.ErrorAs(t, err, &le)
	assert.NotErrorIs(t, err, lease.ErrNotAcquired, "the wait ended before its context: %v", err)
	assert.NoError(t, wctx.Err())
}

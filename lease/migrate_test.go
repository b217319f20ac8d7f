package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// Issue 11 item 4: CREATE INDEX IF NOT EXISTS takes a SHARE lock even when
// the index exists (and ALTER TABLE ADD COLUMN IF NOT EXISTS an ACCESS
// EXCLUSIVE one), so a restarting process's Migrate queued behind an open
// transaction on the table, and every lease statement queued behind it.
// Re-running Migrate on an up-to-date schema must take no lock that
// conflicts with lease traffic.
func TestMigrateUpToDateTakesNoConflictingLock(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	col := usersTable(t, p1, schema, time.Minute, 1, 2)
	l, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)

	// An open transaction holding a row lock on each table.
	tx, err := p2.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{schema, lease.DefaultTable}.Sanitize()+" SET owner = owner WHERE resource = 'r'")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "users"}.Sanitize()+" SET auth_id = 'x' WHERE id = 2")
	require.NoError(t, err)

	mctx, cancel := context.WithTimeout(ctx, 10*time.Second) // above MigrateLockTimeout
	defer cancel()
	require.NoError(t, m.Migrate(mctx), "a second Migrate of the manager tables")
	require.NoError(t, col.Migrate(mctx), "a second Migrate of the lease columns")
	require.NoError(t, mctx.Err())

	// Lease traffic flows meanwhile.
	other, err := m.TryAcquire(ctx, "other", nil)
	require.NoError(t, err)
	require.NoError(t, other.Release(ctx))
	cl, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	require.NoError(t, cl.Release(ctx))

	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the other transaction is still open")
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, l.Release(ctx))
}

// Issue 11 item 4: a Migrate that does have DDL to run waits at most
// MigrateLockTimeout for its table lock, then fails with 55P03 and leaves
// the schema unchanged, instead of queueing lease traffic behind it.
func TestMigrateDDLBoundedByLockTimeout(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	table := pgx.Identifier{schema, "accounts"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+table+" (id bigint PRIMARY KEY)")
	mustExec(t, p1, "INSERT INTO "+table+" VALUES (1)")
	col, err := lease.NewColumn(p1, lease.ColumnConfig{Schema: schema, Table: "accounts", TTL: time.Minute})
	require.NoError(t, err)

	tx, err := p2.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+table+" WHERE id = 1 FOR UPDATE")
	require.NoError(t, err)

	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = col.Migrate(mctx)
	assertPgCode(t, err, "55P03")
	require.NoError(t, mctx.Err(), "ended by lock_timeout, not by the caller's context")
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, col.Migrate(ctx), "and succeeds once the transaction is gone")
}

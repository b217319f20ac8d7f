package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testCtx bounds every test: nothing here should take a minute.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// twoPools returns two independent pools on the test database, and a fresh
// schema (dropped at cleanup) for the test's tables.
func twoPools(t testing.TB) (p1, p2 *pgxpool.Pool, schema string) {
	t.Helper()
	p1, p2 = pgtest.Pool(t), pgtest.Pool(t)
	return p1, p2, pgtest.Schema(t, p1)
}

// allExecModes are pgx's five query exec modes, for tests that run in each.
var allExecModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}

// mustExec runs SQL that must succeed.
func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, sql, args...)
	require.NoError(t, err, sql)
}

// queryOne scans one row of SQL that must succeed.
func queryOne[T any](t testing.TB, pool *pgxpool.Pool, sql string, args ...any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var v T
	require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&v), sql)
	return v
}

// usersTable creates <schema>.users (id bigint primary key, auth_id text) with
// the given rows, and a Column lease on it whose lock columns Migrate adds.
func usersTable(t testing.TB, pool *pgxpool.Pool, schema string, ttl time.Duration, ids ...int64) *lease.Column {
	t.Helper()
	table := pgx.Identifier{schema, "users"}.Sanitize()
	mustExec(t, pool, "CREATE TABLE "+table+" (id bigint PRIMARY KEY, auth_id text NOT NULL DEFAULT '')")
	for _, id := range ids {
		mustExec(t, pool, "INSERT INTO "+table+" (id) VALUES ($1)", id)
	}
	col, err := lease.NewColumn(pool, usersConfig(schema, ttl))
	require.NoError(t, err)
	require.NoError(t, col.Migrate(testCtx(t)))
	return col
}

// usersConfig is the Column lease configuration of usersTable's table.
func usersConfig(schema string, ttl time.Duration) lease.ColumnConfig {
	return lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: ttl}
}

// columnCycle acquires row id of c, renews and releases it.
func columnCycle(ctx context.Context, t testing.TB, c *lease.Column, id int64) {
	t.Helper()
	l, err := c.TryAcquire(ctx, id)
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	require.NoError(t, l.Release(ctx))
}

// newManager creates a migrated lock-manager table in schema.
func newManager(t testing.TB, pool *pgxpool.Pool, schema string, cfg lease.ManagerConfig) *lease.Manager {
	t.Helper()
	cfg.Schema = schema
	m, err := lease.NewManager(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, m.Migrate(testCtx(t)))
	return m
}

// examplePool connects to the test database for an Example and creates a
// fresh schema; the returned func drops it and closes the pool.
func examplePool() (*pgxpool.Pool, string, func()) {
	ctx := context.Background()
	pool, closePool := pgtest.ExamplePool()
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		panic(err)
	}
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		closePool()
	}
}

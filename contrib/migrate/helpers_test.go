package pgxlockmigrate_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"testing/fstest"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	pgxlockmigrate "github.com/pgxlock/pgxlock/contrib/migrate"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// fixture is one schema with its migrations: each one logs its version in
// schema.applied, so a migration run twice shows as two rows (and fails on
// its CREATE TABLE, which has no IF NOT EXISTS). gate, when not zero, makes
// migration 2 wait for the transaction lock gate before it logs.
type fixture struct {
	schema string
	check  *pgxpool.Pool
	n      int
	gate   int64
}

func newFixture(t testing.TB, n int, gate int64) *fixture {
	t.Helper()
	check := pgtest.Pool(t)
	f := &fixture{schema: pgtest.Schema(t, check), check: check, n: n, gate: gate}
	_, err := check.Exec(testCtx(t), fmt.Sprintf("CREATE TABLE %s.applied (version int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())", f.schema))
	require.NoError(t, err)
	return f
}

func (f *fixture) source(t testing.TB) (string, source.Driver) {
	t.Helper()
	src, err := migrations(f.schema, f.n, f.gate)
	require.NoError(t, err)
	return "iofs", src
}

// migrations returns n migrations in schema (see fixture).
func migrations(schema string, n int, gate int64) (source.Driver, error) {
	fsys := fstest.MapFS{}
	for v := 1; v <= n; v++ {
		body := fmt.Sprintf("CREATE TABLE %s.t%d (id int);\n", schema, v)
		if v == 2 && gate != 0 {
			body += fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n", gate)
		}
		body += fmt.Sprintf("INSERT INTO %s.applied (version) VALUES (%d);\n", schema, v)
		fsys[fmt.Sprintf("%d_m%d.up.sql", v, v)] = &fstest.MapFile{Data: []byte(body)}
		fsys[fmt.Sprintf("%d_m%d.down.sql", v, v)] = &fstest.MapFile{Data: []byte(fmt.Sprintf("DROP TABLE %s.t%d;", schema, v))}
	}
	return iofs.New(fsys, ".")
}

// counts returns how many times each version was applied.
func (f *fixture) counts(t testing.TB) map[int]int {
	t.Helper()
	rows, err := f.check.Query(testCtx(t), fmt.Sprintf("SELECT version, count(*) FROM %s.applied GROUP BY version", f.schema))
	require.NoError(t, err)
	defer rows.Close()
	got := map[int]int{}
	for rows.Next() {
		var v, n int
		require.NoError(t, rows.Scan(&v, &n))
		got[v] = n
	}
	require.NoError(t, rows.Err())
	return got
}

// replica is one migrating process's worth of objects: a pool, a
// database/sql handle on it, the stock pgx/v5 driver and, unless stock,
// this package's Driver around it.
type replica struct {
	pool  *pgxpool.Pool
	db    *sql.DB
	inner database.Driver
	d     *pgxlockmigrate.Driver
	m     *migrate.Migrate
}

func (f *fixture) replica(t testing.TB, ctx context.Context, stock bool, cfg pgxlockmigrate.Config) *replica {
	t.Helper()
	r := &replica{pool: pgtest.Pool(t)}
	r.db = stdlib.OpenDBFromPool(r.pool)
	t.Cleanup(func() { _ = r.db.Close() })
	inner, err := pgxmigrate.WithInstance(r.db, &pgxmigrate.Config{SchemaName: f.schema})
	require.NoError(t, err)
	r.inner = inner
	drv := inner
	if !stock {
		cfg.SchemaName = f.schema
		r.d, err = pgxlockmigrate.Wrap(ctx, inner, r.pool, cfg)
		require.NoError(t, err)
		drv = r.d
	}
	name, src := f.source(t)
	r.m, err = migrate.NewWithInstance(name, src, "pgx5", drv)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = r.m.Close() }) // closes the inner driver's connection
	if r.d != nil {
		r.d.Attach(r.m)
	}
	return r
}

func isNoChange(err error) bool { return err == nil || errors.Is(err, migrate.ErrNoChange) }

// holdGate takes the fixture's gate in a transaction of the check pool, so
// that migration 2 waits for it, until the returned transaction ends (it is
// rolled back at cleanup).
func (f *fixture) holdGate(t testing.TB, ctx context.Context) pgx.Tx {
	t.Helper()
	tx, err := f.check.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", f.gate)
	require.NoError(t, err)
	return tx
}

package pgxlockgoose_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// waitBound bounds every wait of these tests.
const waitBound = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// migrations returns 5 SQL migrations, each recording itself in
// schema.applied, whose UNIQUE version makes a second run of one fail.
func migrations(schema string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for v := 1; v <= 5; v++ {
		fsys[fmt.Sprintf("%05d_m%d.sql", v, v)] = &fstest.MapFile{Data: []byte(fmt.Sprintf(`-- +goose Up
SELECT pg_sleep(0.02);
INSERT INTO %[1]s.applied (version, pid) VALUES (%[2]d, pg_backend_pid());
-- +goose Down
DELETE FROM %[1]s.applied WHERE version = %[2]d;
`, schema, v))}
	}
	return fsys
}

// migrationDB makes the schema and the applied table.
func migrationDB(t *testing.T, ctx context.Context) (schema string) {
	pool := pgtest.Pool(t)
	schema = pgtest.Schema(t, pool)
	_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "applied"}.Sanitize()+
		` (version int PRIMARY KEY, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	return schema
}

// openDB returns a database/sql handle on a pool of its own (so its sessions
// are its own), with the harness's end-of-test lock check.
func openDB(t *testing.T, maxConns int32) (*sql.DB, *pgxpool.Pool) {
	cfg := pgtest.Config(t)
	cfg.MaxConns = maxConns
	pool := pgtest.NewPool(t, cfg)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	return db, pool
}

// provider returns a goose provider over db for the test's migrations,
// with its version table in schema.
func provider(t *testing.T, db *sql.DB, schema string, opt goose.ProviderOption) *goose.Provider {
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations(schema),
		goose.WithTableName(schema+".goose_db_version"), opt)
	require.NoError(t, err)
	return p
}

// checkAppliedOnce checks that each of the 5 migrations ran exactly once
// and goose recorded each once.
func checkAppliedOnce(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) {
	var versions []int32
	rows, err := pool.Query(ctx, `SELECT version FROM `+pgx.Identifier{schema, "applied"}.Sanitize()+` ORDER BY version`)
	require.NoError(t, err)
	versions, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{1, 2, 3, 4, 5}, versions)
	var recorded []int64
	rows, err = pool.Query(ctx, `SELECT version_id FROM `+pgx.Identifier{schema, "goose_db_version"}.Sanitize()+
		` WHERE version_id > 0 ORDER BY version_id`)
	require.NoError(t, err)
	recorded, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4, 5}, recorded)
}

// gooseOwn returns goose's own session locker on key id, polling every
// second (its fastest setting) for up to a minute.
func gooseOwn(t *testing.T, id int64) lock.SessionLocker {
	l, err := lock.NewPostgresSessionLocker(lock.WithLockID(id), lock.WithLockTimeout(1, 60))
	require.NoError(t, err)
	return l
}

// rawConn runs fn on the pgx connection under c.
func rawConn(t *testing.T, c *sql.Conn, fn func(*pgx.Conn)) {
	require.NoError(t, c.Raw(func(dc any) error {
		fn(dc.(*stdlib.Conn).Conn())
		return nil
	}))
}

// poll calls cond every 5 ms until it returns true, failing after waitBound.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitBound); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitBound, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waiters counts sessions waiting for the bigint advisory key k.
func waiters(t *testing.T, ctx context.Context, pool *pgxpool.Pool, k int64) int {
	classid, objid, objsubid := keys.Int64(k).PgLocks()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = $1 AND objid = $2 AND objsubid = $3`, classid, objid, objsubid).Scan(&n))
	return n
}

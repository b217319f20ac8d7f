package pgxlockgoose_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The locker's statements name pg_catalog's functions and types: on a
// session whose search_path lists, before pg_catalog, a schema shadowing
// them with functions that fail, SessionLock and SessionUnlock still take
// and release the key.
func TestSearchPathCannotRedirectTheLocker(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	shadow := pgx.Identifier{fmt.Sprintf("shadow_%d", uint64(pgtest.UniqueInt64(t)))}.Sanitize()
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+shadow)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(ctx, "DROP SCHEMA "+shadow+" CASCADE") })
	for _, f := range []string{
		"pg_advisory_lock(bigint) RETURNS void", "pg_advisory_lock(integer, integer) RETURNS void",
		"pg_advisory_unlock(bigint) RETURNS bool", "pg_advisory_unlock(integer, integer) RETURNS bool",
		"set_config(text, text, bool) RETURNS text",
	} {
		_, err := admin.Exec(ctx, "CREATE FUNCTION "+shadow+"."+f+" LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked'; END$$")
		require.NoError(t, err)
	}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = shadow + ", pg_catalog"
	pool := pgtest.NewPool(t, cfg)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	_, err = pool.Exec(ctx, "SELECT pg_advisory_unlock(1::bigint)")
	require.ErrorContains(t, err, "hijacked", "the shadows are live on this pool")
	for _, k := range []keys.Key{keys.Int64(pgtest.UniqueInt64(t)), keys.Pair(pgtest.UniqueInt32(t), 7)} {
		l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: k, LockTimeout: time.Minute})
		require.NoError(t, err)
		c, err := db.Conn(ctx)
		require.NoError(t, err)
		require.NoError(t, l.SessionLock(ctx, c), k)
		require.NoError(t, l.SessionUnlock(ctx, c), k)
		require.NoError(t, c.Close())
	}
	pgtest.AssertNoAdvisoryLocks(t, pool)
}

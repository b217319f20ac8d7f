package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// The functions the lease statements name in pg_catalog (the package doc,
// "Time is the database's": now(), set_config, current_setting, and
// Migrate's to_regclass and pg_advisory_xact_lock) are pg_catalog's on a
// session whose search_path lists, before pg_catalog, a schema shadowing
// each of them with a function that fails: every lease call still works.
// (The doc says what else such a schema can redirect.)
func TestLeaseCallsPgCatalogsFunctions(t *testing.T) {
	ctx := testCtx(t)
	p1, _, schema := twoPools(t)
	shadow := pgx.Identifier{fmt.Sprintf("shadow_%d", uint64(pgtest.UniqueInt64(t)))}.Sanitize()
	mustExec(t, p1, "CREATE SCHEMA "+shadow)
	t.Cleanup(func() { mustExec(t, p1, "DROP SCHEMA "+shadow+" CASCADE") })
	for _, f := range []string{
		"now() RETURNS timestamptz",
		"set_config(text, text, bool) RETURNS text",
		"current_setting(text) RETURNS text",
		"current_setting(text, bool) RETURNS text",
		"pg_advisory_xact_lock(bigint) RETURNS void",
		"to_regclass(text) RETURNS regclass",
	} {
		mustExec(t, p1, "CREATE FUNCTION "+shadow+"."+f+" LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked'; END$$")
	}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = shadow + ", pg_catalog"
	pool := pgtest.NewPool(t, cfg)
	_, err := pool.Exec(ctx, "SELECT now()")
	require.ErrorContains(t, err, "hijacked", "the shadows are live on this pool")

	t.Run("column", func(t *testing.T) {
		mustExec(t, p1, "CREATE TABLE "+pgx.Identifier{schema, "jobs"}.Sanitize()+" (id bigint PRIMARY KEY)")
		mustExec(t, p1, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+" VALUES (1)")
		col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, col.Migrate(ctx))
		l, err := col.TryAcquire(ctx, int64(1))
		require.NoError(t, err)
		_, err = col.TryAcquire(ctx, int64(1))
		require.ErrorIs(t, err, lease.ErrNotAcquired)
		require.NoError(t, l.Renew(ctx))
		require.NoError(t, l.Release(ctx))
	})
	t.Run("manager", func(t *testing.T) {
		m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, m.Migrate(ctx))
		for _, mode := range []lease.Mode{lease.Exclusive, lease.Shared} {
			l, err := m.TryAcquire(ctx, "r", &lease.AcquireOptions{Mode: mode})
			require.NoError(t, err, mode)
			_, err = m.TryAcquire(ctx, "r", &lease.AcquireOptions{Mode: lease.Exclusive})
			require.ErrorIs(t, err, lease.ErrNotAcquired, mode)
			require.NoError(t, l.Renew(ctx), mode)
			require.NoError(t, l.Release(ctx), mode)
			l, err = m.Acquire(ctx, "r", &lease.AcquireOptions{Mode: mode})
			require.NoError(t, err, mode)
			infos, err := m.List(ctx, &lease.ListOptions{Resource: "r"})
			if assert.NoError(t, err) && assert.Len(t, infos, 1) {
				assert.False(t, infos[0].Expired)
			}
			require.NoError(t, l.Release(ctx), mode)
		}
	})
}

// Look-alike operators that give plausible wrong answers (the review's
// breaks: an expiry moved into the past, a takeover of a live lease, tokens
// that stop growing) are not used by the statements the package runs in its
// own transactions: the frame puts pg_catalog first on the transaction's
// search_path, ahead of the session's (the package doc, "Time is the
// database's").
func TestSearchPathLookAlikeOperatorsAreNotUsed(t *testing.T) {
	ctx := testCtx(t)
	p1, _, schema := twoPools(t)
	shadow := pgx.Identifier{fmt.Sprintf("shadow_%d", uint64(pgtest.UniqueInt64(t)))}.Sanitize()
	mustExec(t, p1, "CREATE SCHEMA "+shadow)
	t.Cleanup(func() { mustExec(t, p1, "DROP SCHEMA "+shadow+" CASCADE") })
	for _, ddl := range []string{
		// now() + TTL gives the past, now() - TTL the future, counter + 1 the counter.
		`CREATE FUNCTION %[1]s.tplus(timestamptz, interval) RETURNS timestamptz LANGUAGE sql AS 'SELECT $1 OPERATOR(pg_catalog.-) $2'`,
		`CREATE OPERATOR %[1]s.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = %[1]s.tplus)`,
		`CREATE FUNCTION %[1]s.tminus(timestamptz, interval) RETURNS timestamptz LANGUAGE sql AS 'SELECT $1 OPERATOR(pg_catalog.+) $2'`,
		`CREATE OPERATOR %[1]s.- (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = %[1]s.tminus)`,
		`CREATE FUNCTION %[1]s.iplus(bigint, integer) RETURNS bigint LANGUAGE sql AS 'SELECT $1'`,
		`CREATE OPERATOR %[1]s.+ (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = %[1]s.iplus)`,
		`CREATE FUNCTION %[1]s.bplus(bigint, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT $1'`,
		`CREATE OPERATOR %[1]s.+ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = %[1]s.bplus)`,
	} {
		mustExec(t, p1, fmt.Sprintf(ddl, shadow))
	}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = shadow + ", pg_catalog"
	hostile := pgtest.NewPool(t, cfg)
	var past bool
	require.NoError(t, hostile.QueryRow(ctx, "SELECT now() + interval '1 minute' < now()").Scan(&past))
	require.True(t, past, "the look-alikes are live on this pool")

	t.Run("manager", func(t *testing.T) {
		mh, err := lease.NewManager(hostile, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, mh.Migrate(ctx))
		mn, err := lease.NewManager(p1, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
		require.NoError(t, err)
		var last int64
		for range 3 {
			a, err := mh.TryAcquire(ctx, "r", nil)
			require.NoError(t, err)
			assert.Greater(t, a.Token(), last, "tokens grow")
			last = a.Token()
			assert.True(t, a.ExpiresAt().After(a.AcquiredAt()), "expires a TTL after it was acquired")
			_, err = mn.TryAcquire(ctx, "r", nil)
			require.ErrorIs(t, err, lease.ErrNotAcquired, "a live lease excludes")
			require.NoError(t, a.Renew(ctx))
			require.NoError(t, a.Release(ctx))
		}
	})
	t.Run("column", func(t *testing.T) {
		table := pgx.Identifier{schema, "jobs"}.Sanitize()
		mustExec(t, p1, "CREATE TABLE "+table+" (id bigint PRIMARY KEY)")
		mustExec(t, p1, "INSERT INTO "+table+" VALUES (1)")
		cfg := lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute}
		ch, err := lease.NewColumn(hostile, cfg)
		require.NoError(t, err)
		require.NoError(t, ch.Migrate(ctx))
		cn, err := lease.NewColumn(p1, cfg)
		require.NoError(t, err)
		var last int64
		for range 3 {
			l, err := cn.TryAcquire(ctx, int64(1))
			require.NoError(t, err)
			_, err = ch.TryAcquire(ctx, int64(1))
			require.ErrorIs(t, err, lease.ErrNotAcquired, "no takeover of a live lease")
			require.NoError(t, l.Release(ctx))
			l, err = ch.TryAcquire(ctx, int64(1))
			require.NoError(t, err)
			assert.Greater(t, l.Token(), last, "tokens grow")
			last = l.Token()
			require.NoError(t, l.Renew(ctx))
			require.NoError(t, l.Release(ctx))
		}
	})
}

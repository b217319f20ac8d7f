package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	shadow := shadowSchema(t, p1)
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
	pool := pathPool(t, shadow+", pg_catalog")
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
	shadow := shadowSchema(t, p1)
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
	hostile := pathPool(t, shadow+", pg_catalog")
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

// Two more ways in, found by the second review: a look-alike type, which
// fixes the type of a parameter when pgx prepares a statement (outside the
// frame, under the session's search_path), and an operator with no exact
// match in pg_catalog, which the frame's order cannot settle (PostgreSQL
// takes an exact match from any schema of the path over a pg_catalog
// operator that needs a cast), here the column lease's precision pad.
// Every cast of the statements names pg_catalog's type, and the pad's
// arithmetic names pg_catalog's operators.
func TestSearchPathLookAlikeTypesAndInexactOperatorsAreNotUsed(t *testing.T) {
	ctx := testCtx(t)
	p1, _, schema := twoPools(t)
	shadow := shadowSchema(t, p1)
	// The tables first, on the normal pool: Migrate's DDL follows the
	// session's search_path (the doc says so), and the shadow text type
	// below would become their columns' type.
	mgr, err := lease.NewManager(p1, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, mgr.Migrate(ctx))
	table := pgx.Identifier{schema, "jobs"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+table+" (id bigint PRIMARY KEY, locked_at timestamptz(3))")
	mustExec(t, p1, "INSERT INTO "+table+" VALUES (1)")
	colCfg := lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute}
	cn, err := lease.NewColumn(p1, colCfg)
	require.NoError(t, err)
	require.NoError(t, cn.Migrate(ctx))
	for _, ddl := range []string{
		// A text that every mode casts to 'shared'.
		`CREATE TYPE %[1]s.text AS ENUM ('exclusive', 'shared', 'upgraded')`,
		`CREATE FUNCTION %[1]s.totext(%[1]s.text) RETURNS pg_catalog.text LANGUAGE sql AS $$SELECT 'shared'::pg_catalog.text$$`,
		`CREATE CAST (%[1]s.text AS pg_catalog.text) WITH FUNCTION %[1]s.totext(%[1]s.text) AS ASSIGNMENT`,
		`CREATE FUNCTION %[1]s.eqf(pg_catalog.text, %[1]s.text) RETURNS bool LANGUAGE sql AS $$SELECT $1 OPERATOR(pg_catalog.=) $2::pg_catalog.text$$`,
		`CREATE OPERATOR %[1]s.= (LEFTARG = pg_catalog.text, RIGHTARG = %[1]s.text, FUNCTION = %[1]s.eqf)`,
		// bigint * interval, which pg_catalog has only as float8 * interval: a pad of -1 hour.
		`CREATE FUNCTION %[1]s.bi(bigint, interval) RETURNS interval LANGUAGE sql AS $$SELECT interval '-1 hour'$$`,
		`CREATE OPERATOR %[1]s.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = %[1]s.bi)`,
	} {
		mustExec(t, p1, fmt.Sprintf(ddl, shadow))
	}
	// After pg_catalog: the type then is not found first, but the inexact
	// operator still wins; before it, both are live.
	for _, path := range []string{shadow + ", pg_catalog", "pg_catalog, " + shadow} {
		t.Run(path, func(t *testing.T) {
			hostile := pathPool(t, path)
			var pad string
			require.NoError(t, hostile.QueryRow(ctx, "SELECT (5::bigint * interval '1 second')::pg_catalog.text").Scan(&pad))
			require.Equal(t, "-01:00:00", pad, "the look-alike operator is live on this pool")

			m, err := lease.NewManager(hostile, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
			require.NoError(t, err)
			a, err := m.TryAcquire(ctx, "r", nil)
			require.NoError(t, err)
			_, err = m.TryAcquire(ctx, "r", nil)
			require.ErrorIs(t, err, lease.ErrNotAcquired, "an exclusive lease excludes")
			_, err = mgr.TryAcquire(ctx, "r", &lease.AcquireOptions{Mode: lease.Shared})
			require.ErrorIs(t, err, lease.ErrNotAcquired, "an exclusive lease excludes a shared one")
			require.NoError(t, a.Release(ctx))

			ch, err := lease.NewColumn(hostile, colCfg)
			require.NoError(t, err)
			l, err := cn.TryAcquire(ctx, int64(1))
			require.NoError(t, err)
			_, err = ch.TryAcquire(ctx, int64(1))
			require.ErrorIs(t, err, lease.ErrNotAcquired, "no takeover of a live lease")
			require.NoError(t, l.Renew(ctx))
			require.NoError(t, l.Release(ctx))
		})
	}
}

// The third review: comparisons whose types have no exact operator in
// pg_catalog take an exact look-alike from any schema of the path, even one
// after pg_catalog: a locked-at column of a domain over timestamptz (a
// look-alike < made every lease look expired), and the precision pad's
// catalog lookup (oid = regclass: a look-alike that matches every column
// made the pad's subquery return many rows). Those comparisons name
// pg_catalog's operators.
func TestSearchPathInexactComparisonsAreNotRedirected(t *testing.T) {
	ctx := testCtx(t)
	p1, _, schema := twoPools(t)
	shadow := shadowSchema(t, p1)
	ts := pgx.Identifier{schema, "ts"}.Sanitize()
	mustExec(t, p1, "CREATE DOMAIN "+ts+" AS timestamptz(3)")
	table := pgx.Identifier{schema, "jobs"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+table+" (id bigint PRIMARY KEY, locked_at "+ts+")")
	mustExec(t, p1, "INSERT INTO "+table+" VALUES (1)")
	for _, ddl := range []string{
		`CREATE FUNCTION %[1]s.lt(%[2]s, timestamptz) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE OPERATOR %[1]s.< (LEFTARG = %[2]s, RIGHTARG = timestamptz, FUNCTION = %[1]s.lt)`,
		`CREATE FUNCTION %[1]s.eq(oid, regclass) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE OPERATOR %[1]s.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = %[1]s.eq)`,
	} {
		mustExec(t, p1, fmt.Sprintf(ddl, shadow, ts))
	}
	cfg := lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute}
	cn, err := lease.NewColumn(p1, cfg)
	require.NoError(t, err)
	require.NoError(t, cn.Migrate(ctx))
	for _, path := range []string{shadow + ", pg_catalog", "pg_catalog, " + shadow} {
		t.Run(path, func(t *testing.T) {
			hostile := pathPool(t, path)
			var n int
			require.NoError(t, hostile.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = 'pg_catalog.pg_class'::pg_catalog.regclass").Scan(&n))
			require.Greater(t, n, 0)
			var live bool
			require.NoError(t, hostile.QueryRow(ctx, "SELECT oid = 'pg_catalog.pg_type'::pg_catalog.regclass FROM pg_catalog.pg_class WHERE relname = 'pg_class'").Scan(&live))
			require.True(t, live, "the look-alike = is live on this pool")
			ch, err := lease.NewColumn(hostile, cfg)
			require.NoError(t, err)
			l, err := ch.TryAcquire(ctx, int64(1))
			require.NoError(t, err)
			_, err = ch.TryAcquire(ctx, int64(1))
			require.ErrorIs(t, err, lease.ErrNotAcquired, "no takeover of a live lease")
			_, err = cn.TryAcquire(ctx, int64(1))
			require.ErrorIs(t, err, lease.ErrNotAcquired)
			require.NoError(t, l.Renew(ctx))
			require.NoError(t, l.Release(ctx))
		})
	}
}

// shadowSchema creates a schema for look-alikes, dropped after the test,
// and returns its quoted name.
func shadowSchema(t *testing.T, admin *pgxpool.Pool) string {
	t.Helper()
	shadow := pgx.Identifier{fmt.Sprintf("shadow_%d", uint64(pgtest.UniqueInt64(t)))}.Sanitize()
	mustExec(t, admin, "CREATE SCHEMA "+shadow)
	t.Cleanup(func() { mustExec(t, admin, "DROP SCHEMA "+shadow+" CASCADE") })
	return shadow
}

// pathPool returns a pool on the test database whose sessions start with
// search_path set to path.
func pathPool(t *testing.T, path string) *pgxpool.Pool {
	t.Helper()
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = path
	return pgtest.NewPool(t, cfg)
}

// Look-alikes of another result type break a statement where pgx prepares
// it, outside the frame, under the session's search_path: a * on bigints
// that returns boolean made every acquisition fail with 42804 in pgx's
// default exec mode (review 25), in the fencing token's arithmetic. The
// statements name every function and operator of the token in pg_catalog.
func TestSearchPathLookAlikesOfAnotherResultTypeDoNotBreakAcquisition(t *testing.T) {
	ctx := testCtx(t)
	p1, _, schema := twoPools(t)
	shadow := shadowSchema(t, p1)
	for _, ddl := range []string{
		`CREATE FUNCTION %[1]s.bb(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
		`CREATE OPERATOR %[1]s.* (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = %[1]s.bb)`,
		`CREATE FUNCTION %[1]s.bi(bigint, integer) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
		`CREATE OPERATOR %[1]s.- (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = %[1]s.bi)`,
		`CREATE OPERATOR %[1]s.+ (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = %[1]s.bi)`,
		`CREATE FUNCTION %[1]s.tt(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
		`CREATE OPERATOR %[1]s.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.tt)`,
		`CREATE FUNCTION %[1]s.substr(text, integer, integer) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION %[1]s.pg_walfile_name(pg_lsn) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
		// Not an aggregate: count(*) resolved to it fails with 42809 (review 26).
		`CREATE FUNCTION %[1]s.count() RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'`,
	} {
		mustExec(t, p1, fmt.Sprintf(ddl, shadow))
	}
	hostile := pathPool(t, shadow+", pg_catalog")
	var hijacked bool
	require.NoError(t, hostile.QueryRow(ctx, "SELECT 2::bigint * 3::bigint").Scan(&hijacked))
	require.True(t, hijacked, "the look-alikes are live on this pool")

	mh, err := lease.NewManager(hostile, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, mh.Migrate(ctx))
	l, err := mh.Acquire(ctx, "r", nil)
	require.NoError(t, err)
	assert.Positive(t, l.Token())
	require.NoError(t, l.Release(ctx))
	_, err = mh.Sweep(ctx)
	require.NoError(t, err)
	_, err = mh.ReleaseAll(ctx, "nobody")
	require.NoError(t, err)

	table := pgx.Identifier{schema, "jobs"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+table+" (id bigint PRIMARY KEY)")
	mustExec(t, p1, "INSERT INTO "+table+" VALUES (1)")
	ch, err := lease.NewColumn(hostile, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, ch.Migrate(ctx))
	for range 2 { // the first acquisition's statement and the later ones'
		cl, err := ch.TryAcquire(ctx, int64(1))
		require.NoError(t, err)
		assert.Positive(t, cl.Token())
		require.NoError(t, cl.Release(ctx))
	}
}

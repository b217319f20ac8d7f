package advisory_test

import (
	"context"
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

// shadowedFuncs are the functions the package's statements call; the
// shadow schema of hijackSchema has one of each signature.
var shadowedFuncs = []string{
	"pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared",
	"pg_advisory_xact_lock", "pg_advisory_xact_lock_shared", "pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared",
	"pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all",
	"set_config", "current_setting", "unnest", "now", "clock_timestamp", "cardinality",
	"current_database", "pg_blocking_pids", "pg_backend_pid",
}

// hijackSchema creates a schema that shadows, for a session whose
// search_path lists it before pg_catalog, every function the package's
// statements call, the operators they use and the types they cast to: a
// shadow function or operator fails with "hijacked", a shadow type's
// domain rejects every value, and a shadow table is empty. It returns the
// schema's quoted name. (pg_catalog is searched first unless the
// search_path names it; one that names it after a schema others can write
// to is how a statement that does not qualify its names gets redirected,
// CVE-2018-1058.)
func hijackSchema(ctx context.Context, t *testing.T, admin *pgxpool.Pool) string {
	t.Helper()
	schema := pgx.Identifier{fmt.Sprintf("hijack_%d", uint64(pgtest.UniqueInt64(t)))}.Sanitize()
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		assert.NoError(t, err)
	})
	// One shadow per signature of each function in pg_catalog (DO takes
	// no parameters: the names are inlined).
	arr := "ARRAY["
	for i, f := range shadowedFuncs {
		if i > 0 {
			arr += ","
		}
		arr += "'" + f + "'"
	}
	arr += "]"
	_, err = admin.Exec(ctx, `
DO $do$
DECLARE r record;
BEGIN
  FOR r IN SELECT p.proname, pg_catalog.pg_get_function_arguments(p.oid) AS args,
                  pg_catalog.pg_get_function_result(p.oid) AS res
           FROM pg_catalog.pg_proc p
           WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f'
             AND p.proname = ANY (`+arr+`)
  LOOP
    EXECUTE pg_catalog.format('CREATE FUNCTION %s.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
      '`+schema+`', r.proname, r.args, r.res,
      'BEGIN RAISE EXCEPTION ''hijacked: ' || r.proname || '''; END');
  END LOOP;
END
$do$`)
	require.NoError(t, err)
	ddl := []string{
		// The aggregate and the operators the statements use.
		`CREATE FUNCTION %[1]s.hijacked_int4(int4, int4) RETURNS int4 LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: int4 operator'; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_int8(int8, int8) RETURNS int8 LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: int8 operator'; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_numeric(numeric, numeric) RETURNS numeric LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: numeric operator'; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_interval(timestamptz, timestamptz) RETURNS interval LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: timestamptz operator'; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_text(pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: text operator'; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_eq_text(pg_catalog.text, pg_catalog.text) RETURNS bool LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: text ='; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_eq_int4(int4, int4) RETURNS bool LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: int4 ='; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_eq_oid(oid, oid) RETURNS bool LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: oid ='; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_eq_name(name, name) RETURNS bool LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: name ='; END$$`,
		`CREATE FUNCTION %[1]s.hijacked_min(int4, int4) RETURNS int4 LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked: min'; END$$`,
		`CREATE AGGREGATE %[1]s.min(int4) (SFUNC = %[1]s.hijacked_min, STYPE = int4)`,
		`CREATE OPERATOR %[1]s./ (LEFTARG = int4, RIGHTARG = int4, FUNCTION = %[1]s.hijacked_int4)`,
		`CREATE OPERATOR %[1]s.- (LEFTARG = int8, RIGHTARG = int8, FUNCTION = %[1]s.hijacked_int8)`,
		`CREATE OPERATOR %[1]s.* (LEFTARG = numeric, RIGHTARG = numeric, FUNCTION = %[1]s.hijacked_numeric)`,
		`CREATE OPERATOR %[1]s.- (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = %[1]s.hijacked_interval)`,
		`CREATE OPERATOR %[1]s.|| (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text, FUNCTION = %[1]s.hijacked_text)`,
		`CREATE OPERATOR %[1]s.= (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text, FUNCTION = %[1]s.hijacked_eq_text)`,
		`CREATE OPERATOR %[1]s.= (LEFTARG = int4, RIGHTARG = int4, FUNCTION = %[1]s.hijacked_eq_int4)`,
		`CREATE OPERATOR %[1]s.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = %[1]s.hijacked_eq_oid)`,
		`CREATE OPERATOR %[1]s.= (LEFTARG = name, RIGHTARG = name, FUNCTION = %[1]s.hijacked_eq_name)`,
		// The relations ListLocks reads.
		`CREATE TABLE %[1]s.pg_locks (LIKE pg_catalog.pg_locks)`,
		`CREATE TABLE %[1]s.pg_stat_activity (LIKE pg_catalog.pg_stat_activity)`,
		`CREATE TABLE %[1]s.pg_database (LIKE pg_catalog.pg_database)`,
		// The types the statements cast to, last: the DDL above names them
		// unqualified.
		`CREATE DOMAIN %[1]s.int8 AS pg_catalog.int8 CHECK (false)`,
		`CREATE DOMAIN %[1]s.int4 AS pg_catalog.int4 CHECK (false)`,
		`CREATE DOMAIN %[1]s.int2 AS pg_catalog.int2 CHECK (false)`,
		`CREATE DOMAIN %[1]s.oid AS pg_catalog.oid CHECK (false)`,
		`CREATE DOMAIN %[1]s.text AS pg_catalog.text CHECK (false)`,
	}
	for _, d := range ddl {
		_, err := admin.Exec(ctx, fmt.Sprintf(d, schema))
		require.NoError(t, err, d)
	}
	return schema
}

// A search_path that lists another schema before pg_catalog (set in the
// connection string, by ALTER ROLE ... SET, or by AfterConnect) does not
// redirect the package's statements: every function, operator, type and
// relation they name is named in pg_catalog. Against a schema that shadows
// them all, every helper still takes, excludes and releases its keys.
func TestSearchPathCannotRedirectTheStatements(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := hijackSchema(ctx, t, admin)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema + ", pg_catalog"
	pool := pgtest.NewPool(t, cfg)
	// The shadows are live on this pool: an unqualified call is hijacked.
	_, err := pool.Exec(ctx, "SELECT pg_advisory_lock(1::bigint)")
	require.ErrorContains(t, err, "hijacked")

	p := newProbe(t)
	l := newLocker(t, pool, advisory.Config{})
	ns := keys.MustRegisterNamespace(pgtest.UniqueInt32(t), fmt.Sprintf("hijack-%d", pgtest.UniqueInt64(t)))
	bounded := &advisory.Options{Timeout: time.Minute}
	shared := &advisory.Options{Shared: true}
	busy := func(ks ...keys.Key) {
		t.Helper()
		for _, k := range ks {
			assert.False(t, p.free(ctx, k, false), "key %v not held inside the call", k)
		}
	}
	session := func(ks ...keys.Key) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error {
			busy(ks...)
			_, err := c.Exec(ctx, "SELECT 1") // the reset runs too
			return err
		}
	}
	xact := func(ks ...keys.Key) func(context.Context, pgx.Tx) error {
		return func(context.Context, pgx.Tx) error { busy(ks...); return nil }
	}
	for _, opts := range []*advisory.Options{nil, bounded, shared} {
		name := "default"
		switch opts {
		case bounded:
			name = "timeout"
		case shared:
			name = "shared"
		}
		t.Run(name, func(t *testing.T) {
			k, k2, pair := key(t), key(t), ns.Key(int32(pgtest.UniqueInt32(t)))
			check := func(what string, ks []keys.Key, err error) {
				t.Helper()
				require.NoError(t, err, what)
				for _, k := range ks {
					assert.True(t, p.free(ctx, k, false), "%s: key %v still held after the call", what, k)
				}
			}
			busyOnly := func(ks ...keys.Key) {
				if opts != shared {
					busy(ks...)
				}
			}
			session := func(ks ...keys.Key) func(context.Context, *pgx.Conn) error {
				if opts == shared {
					return func(context.Context, *pgx.Conn) error { return nil }
				}
				return session(ks...)
			}
			xact := func(ks ...keys.Key) func(context.Context, pgx.Tx) error {
				if opts == shared {
					return func(context.Context, pgx.Tx) error { return nil }
				}
				return xact(ks...)
			}
			all := []keys.Key{k, k2, pair}
			check("WithLock", all[:1], l.WithLock(ctx, k, opts, session(k)))
			check("TryWithLock", all[:1], l.TryWithLock(ctx, k, opts, session(k)))
			check("WithLock pair", []keys.Key{pair}, l.WithLock(ctx, pair, opts, session(pair)))
			check("WithLockAll", all, l.WithLockAll(ctx, all, opts, session(all...)))
			check("TryWithLockAll", all, l.TryWithLockAll(ctx, all, opts, session(all...)))
			check("WithXactLock", all[:1], l.WithXactLock(ctx, k, opts, xact(k)))
			check("TryWithXactLock", all[:1], l.TryWithXactLock(ctx, k, opts, xact(k)))
			check("WithXactLockAll", all, l.WithXactLockAll(ctx, all, opts, xact(all...)))
			check("TryWithXactLockAll", all, l.TryWithXactLockAll(ctx, all, opts, xact(all...)))
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			check("WithXactLockBatch", all, l.WithXactLockBatch(ctx, all, opts, b))
			b = &pgx.Batch{}
			b.Queue("SELECT 1")
			check("TryWithXactLockBatch", all, l.TryWithXactLockBatch(ctx, all, opts, b))
			for _, try := range []bool{false, true} {
				var h *advisory.Lock
				var err error
				if try {
					h, err = l.TryLockAll(ctx, all, opts)
				} else {
					h, err = l.LockAll(ctx, all, opts)
				}
				require.NoError(t, err)
				busyOnly(all...)
				check(fmt.Sprintf("LockAll (try %v)", try), all, h.Unlock(ctx))
				if try {
					h, err = l.TryLock(ctx, k, opts)
				} else {
					h, err = l.Lock(ctx, k, opts)
				}
				require.NoError(t, err)
				busyOnly(k)
				check(fmt.Sprintf("Lock (try %v)", try), all[:1], h.Unlock(ctx))
			}
			check("Hold", all[:1], l.Hold(ctx, k, opts, func(context.Context) error { busyOnly(k); return nil }))
			check("HoldAll", all, l.HoldAll(ctx, all, opts, func(context.Context) error { busyOnly(all...); return nil }))
			for _, try := range []bool{false, true} {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					if try {
						err = l.TryLockAllInTx(ctx, tx, all, opts)
					} else {
						err = l.LockAllInTx(ctx, tx, all, opts)
					}
					if err != nil {
						return err
					}
					busyOnly(all...)
					if try {
						return l.TryLockInTx(ctx, tx, k, opts)
					}
					return l.LockInTx(ctx, tx, k, opts)
				})
				check(fmt.Sprintf("LockAllInTx (try %v)", try), all, err)
			}
			h, err := l.Lock(ctx, k, opts)
			require.NoError(t, err)
			infos, err := advisory.ListLocks(ctx, pool, k)
			require.NoError(t, err)
			if assert.Len(t, infos, 1) {
				assert.Equal(t, k, infos[0].Key)
			}
			check("ListLocks", all[:1], h.Unlock(ctx))
		})
	}
}

// The statements pooltx runs around a lent connection (the first Lend's
// reading of the session's identity, the reset) are named in pg_catalog
// too: against the shadowing schema, the connection of a helper whose
// callback ran SQL goes back to the pool, every time (a statement that a
// shadow broke would have destroyed it).
func TestSearchPathCannotBreakTheReset(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := hijackSchema(ctx, t, admin)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.ConnConfig.RuntimeParams["search_path"] = schema + ", pg_catalog"
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			var pids []uint32
			for range 3 {
				require.NoError(t, l.WithLock(ctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error {
					pids = append(pids, c.PgConn().PID())
					_, err := c.Exec(ctx, "SELECT 1")
					return err
				}))
				require.NoError(t, l.WithXactLock(ctx, key(t), nil, func(ctx context.Context, tx pgx.Tx) error {
					pids = append(pids, tx.Conn().PgConn().PID())
					_, err := tx.Exec(ctx, "SELECT 1")
					return err
				}))
			}
			for _, pid := range pids {
				assert.Equal(t, pids[0], pid, "one connection served every call: none was destroyed")
			}
		})
	}
}

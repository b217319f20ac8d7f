package pooltx_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// The package doc: every setting goes back to its value when the
// connection was first pinned, a SET that pgxpool's AfterConnect ran
// included (restored with set_config after RESET ALL). Review 22: before,
// RESET ALL dropped them, so that after one reset the pool's
// search_path, default_transaction_isolation and read-only default were
// gone (a lease Manager then split its tables between two schemas).
func TestResetRestoresSettingsAfterConnectSet(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	odd := `Odd "S"; 'x'` + fmt.Sprint(pgtest.UniqueInt32(t)&0xffff)
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{odd}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{odd}.Sanitize()+" CASCADE")
	})
	searchPath := pgx.Identifier{odd}.Sanitize() + ", " + pgx.Identifier{schema}.Sanitize()
	connect := []string{
		"SET search_path = " + searchPath,
		"SET default_transaction_isolation = 'repeatable read'",
		"SET work_mem = '7MB'",
		"SET TimeZone = 'Asia/Kathmandu'",
		"SET statement_timeout = '1234s'",
	}
	const watch = "SELECT current_setting('search_path'), current_setting('default_transaction_isolation'), " +
		"current_setting('work_mem'), current_setting('TimeZone'), current_setting('statement_timeout'), current_user::text"
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, deferIdentity := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/defer=%v", mode, deferIdentity), func(t *testing.T) {
				cfg := pgtest.Config(t)
				cfg.MaxConns = 1
				cfg.ConnConfig.DefaultQueryExecMode = mode
				pgtest.SetOnConnect(cfg, connect...)
				pool := pgtest.NewPool(t, cfg)
				seen := func() [6]string {
					t.Helper()
					var v [6]string
					require.NoError(t, pool.QueryRow(ctx, watch).Scan(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5]))
					return v
				}
				want := seen()
				require.Equal(t, "repeatable read", want[1])
				opts := &pooltx.ConnOptions{DeferIdentity: deferIdentity}
				changes := "RESET ALL; SET search_path = public; SET work_mem = '64MB'; SET default_transaction_isolation = 'serializable'; SET statement_timeout = 0"
				for i := range 3 {
					require.NoError(t, pooltx.WithConn(ctx, pool, opts, func(ctx context.Context, c *pooltx.Conn) error {
						_, err := c.Conn().Exec(ctx, changes, pgx.QueryExecModeSimpleProtocol)
						return err
					}))
					assert.Equal(t, want, seen(), "after WithConn %d", i)
					c, err := pooltx.Acquire(ctx, pool, opts)
					require.NoError(t, err)
					require.NoError(t, c.Tx(ctx, nil, func(ctx context.Context, tx pgx.Tx) error {
						_, err := tx.Exec(ctx, changes, pgx.QueryExecModeSimpleProtocol)
						return err
					}))
					require.False(t, c.Release(), "reset, not destroyed")
					assert.Equal(t, want, seen(), "after Conn.Tx %d", i)
				}
			})
		}
	}
}

// The package doc: the reset is ASCII, so a client_encoding the lent code
// left cannot change how it reads; transaction_* settings are not
// restored. Review 23: a search_path with a non-ASCII name and a backslash,
// restored as a quoted literal, read as other characters under SJIS (the
// next borrower got "xﾃ―", public); a SET transaction_deferrable in
// AfterConnect made every reset fail (PostgreSQL refuses it after a
// statement), destroying the connection each time.
func TestResetReadsTheSameWhateverTheClientEncoding(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	odd := fmt.Sprintf(`%d xÁ\`, pgtest.UniqueInt32(t)&0xffff) // UTF-8 C3 81 5C: SJIS reads 81 5C as one character
	role := fmt.Sprintf(`Rôle\ "q" %d`, pgtest.UniqueInt32(t)&0xffff)
	for _, sql := range []string{"CREATE SCHEMA " + pgx.Identifier{odd}.Sanitize(), "CREATE ROLE " + pgx.Identifier{role}.Sanitize()} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		p := pgtest.Pool(t)
		_, _ = p.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{odd}.Sanitize()+" CASCADE")
		_, _ = p.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
	})
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, connectRole := range []string{"SET ROLE ", "SET SESSION AUTHORIZATION "} {
			for _, deferrable := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%s/deferrable=%v", mode, connectRole, deferrable), func(t *testing.T) {
					cfg := pgtest.Config(t)
					cfg.MaxConns = 1
					cfg.ConnConfig.DefaultQueryExecMode = mode
					stmts := []string{
						"SET search_path = " + pgx.Identifier{odd}.Sanitize() + ", public",
						"SET application_name = 'a\\b''c'",
						connectRole + pgx.Identifier{role}.Sanitize(),
					}
					if deferrable {
						stmts = append(stmts, "SET transaction_deferrable = off")
					}
					pgtest.SetOnConnect(cfg, stmts...)
					pool := pgtest.NewPool(t, cfg)
					seen := func() (v [4]string, pid uint32) {
						t.Helper()
						require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('search_path'), current_setting('application_name'), current_user::text, session_user::text, pg_backend_pid()").
							Scan(&v[0], &v[1], &v[2], &v[3], &pid))
						return v, pid
					}
					want, pid0 := seen()
					require.Equal(t, role, want[2])
					for i := range 3 {
						require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
							_, err := c.Conn().Exec(ctx, "SET client_encoding = 'SJIS'", pgx.QueryExecModeSimpleProtocol)
							return err
						}))
						got, pid := seen()
						assert.Equal(t, want, got, "after WithConn %d", i)
						assert.Equal(t, pid0, pid, "reset, not destroyed (%d)", i)
					}
				})
			}
		}
	}
}

// Review 24: in a database whose encoding is not UTF8, pgx's connection
// runs in that encoding, and the identity names it reads are its bytes:
// the reset names them as pgx quotes them (the Unicode-escaped form, for
// UTF-8 names, mapped é to another byte: another role, or none, so that
// every reset failed and destroyed the connection).
func TestResetNamesTheIdentityInANonUTF8Database(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	role := fmt.Sprintf("pgxlock_ké_%d", pgtest.UniqueInt32(t)&0xffff)
	_, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
	})
	cfg := encodedDatabase(ctx, t, "LATIN1")
	pgtest.SetOnConnect(cfg, "SET ROLE "+pgx.Identifier{role}.Sanitize())
	pool := pgtest.NewPool(t, cfg)
	seen := func() (cur string, pid uint32) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text, pg_backend_pid()").Scan(&cur, &pid))
		return cur, pid
	}
	want, pid0 := seen()
	require.Equal(t, role, want)
	for i := range 2 {
		require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			_, err := c.Conn().Exec(ctx, "RESET ROLE")
			return err
		}))
		cur, pid := seen()
		assert.Equal(t, want, cur, "after WithConn %d", i)
		assert.Equal(t, pid0, pid, "reset, not destroyed (%d)", i)
	}
}

// Review 24: in an SQL_ASCII database a setting may hold bytes that are
// not UTF-8; the first pin's read converted every value to UTF-8 and
// failed there, so that no connection of such a pool could be pinned.
// Values now travel as their bytes in the database's encoding.
func TestResetRestoresNonUTF8BytesOfAnSQLASCIIDatabase(t *testing.T) {
	ctx := testCtx(t)
	cfg := encodedDatabase(ctx, t, "SQL_ASCII")
	pgtest.SetOnConnect(cfg, "SET search_path = \"\xe9t\xe9\", public")
	pool := pgtest.NewPool(t, cfg)
	seen := func() (sp []byte, pid uint32) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_catalog.convert_to(current_setting('search_path'), 'SQL_ASCII'), pg_backend_pid()").Scan(&sp, &pid))
		return sp, pid
	}
	want, pid0 := seen()
	require.Contains(t, string(want), "\xe9t\xe9")
	for i := range 2 {
		require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			_, err := c.Conn().Exec(ctx, "SET search_path = public")
			return err
		}))
		got, pid := seen()
		assert.Equal(t, want, got, "after WithConn %d", i)
		assert.Equal(t, pid0, pid, "reset, not destroyed (%d)", i)
	}
}

// encodedDatabase creates a database of the given encoding (C locale),
// dropped at cleanup, and returns the configuration of a pool of one
// connection to it.
func encodedDatabase(ctx context.Context, t *testing.T, encoding string) *pgxpool.Config {
	t.Helper()
	db := fmt.Sprintf("pgxlock_%s_%d", strings.ToLower(encoding), pgtest.UniqueInt32(t)&0xffff)
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()+
		" ENCODING '"+encoding+"' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'") // encoding: a constant of the caller
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	})
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.Database = db
	return cfg
}

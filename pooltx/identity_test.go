package pooltx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/pooltx"
)

// oddRole creates a role whose name needs quoting (a double quote, a
// single quote, a semicolon, upper case), dropped at cleanup.
func oddRole(ctx context.Context, t *testing.T, p *pgxpool.Pool) string {
	r := fmt.Sprintf(`Odd "Role"; 'x' %d`, pgtest.UniqueInt32(t)&0x7fffffff)
	_, err := p.Exec(ctx, "CREATE ROLE "+pgx.Identifier{r}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize())
	})
	return r
}

// Lend's and Reset's doc: every reset returns the session to the identity
// it had when first lent, one set in AfterConnect included (SET ROLE, or
// SET SESSION AUTHORIZATION for a superuser login), never to the
// authenticated user's; names that need quoting included. Before, RESET
// ROLE and RESET SESSION AUTHORIZATION handed the next borrower the
// authenticated user (here a superuser).
func TestResetRestoresTheIdentityAfterConnectSet(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	base, other := oddRole(ctx, t, admin), oddRole(ctx, t, admin)
	q := pgx.Identifier{base}.Sanitize()
	_, err := admin.Exec(ctx, "GRANT "+pgx.Identifier{other}.Sanitize()+" TO "+q) // base may SET ROLE other
	require.NoError(t, err)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, connect := range []string{"SET ROLE " + q, "SET SESSION AUTHORIZATION " + q} {
			t.Run(fmt.Sprintf("%v/%s", mode, connect[:8]), func(t *testing.T) {
				cfg := pgtest.Config(t)
				cfg.MaxConns = 1
				cfg.ConnConfig.DefaultQueryExecMode = mode
				cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
					_, err := c.Exec(ctx, connect)
					return err
				}
				pool := pgtest.NewPool(t, cfg)
				who := func() (cur, sess string) {
					t.Helper()
					require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text, session_user::text").Scan(&cur, &sess))
					return cur, sess
				}
				cur0, sess0 := who()
				require.Equal(t, base, cur0)
				for _, sw := range []string{
					"SET ROLE " + pgx.Identifier{other}.Sanitize(),
					"SET SESSION AUTHORIZATION " + pgx.Identifier{other}.Sanitize(),
					"RESET ROLE", "RESET SESSION AUTHORIZATION", "SET ROLE NONE",
				} {
					require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
						_, err := c.Conn().Exec(ctx, sw)
						return err
					}), sw)
					cur, sess := who()
					assert.Equal(t, [2]string{cur0, sess0}, [2]string{cur, sess}, "after a WithConn that ran %s", sw)
					require.NoError(t, pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
						_, err := tx.Exec(ctx, sw)
						return err
					}), sw)
					cur, sess = who()
					assert.Equal(t, [2]string{cur0, sess0}, [2]string{cur, sess}, "after a WithTx that ran %s", sw)
				}
			})
		}
	}
}

// Lend's doc: the first Lend of a connection records its identity in one
// round trip, once in the connection's life (with the probe's PREPARE
// where pgx's statement cache is in use).
func TestFirstLendRecordsTheIdentityOnce(t *testing.T) {
	ctx := testCtx(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			rt := &roundtrip.Counter{}
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.ConnConfig.DialFunc = rt.DialFunc
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
			pool := pgtest.NewPool(t, cfg)
			var counts []int64
			for range 3 {
				rt.Reset()
				require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(context.Context, *pooltx.Conn) error { return nil }))
				counts = append(counts, rt.Count())
			}
			assert.Equal(t, []int64{1, 0, 0}, counts, "round trips of three WithConn calls whose work sent nothing")
		})
	}
}

// Doc: a role whose grant was revoked since the connection was first lent
// makes the reset fail, which destroys the connection (its session ends).
func TestResetToARevokedRoleDestroys(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	login, base := oddRole(ctx, t, admin), oddRole(ctx, t, admin)
	ql, qb := pgx.Identifier{login}.Sanitize(), pgx.Identifier{base}.Sanitize()
	for _, sql := range []string{"ALTER ROLE " + ql + " LOGIN", "GRANT " + qb + " TO " + ql} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.User = login
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+qb)
		return err
	}
	pool := pgtest.NewPool(t, cfg)
	var pid uint32
	work := func(ctx context.Context, c *pooltx.Conn) error {
		pid = c.Conn().PgConn().PID()
		_, err := c.Conn().Exec(ctx, "SELECT 1")
		return err
	}
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, work))
	first := pid
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, work))
	require.Equal(t, first, pid, "the reset to the role succeeded: the connection was kept")
	_, err := admin.Exec(ctx, "REVOKE "+qb+" FROM "+ql)
	require.NoError(t, err)
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, work), "the work's own outcome stands")
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "the connection whose reset failed did not go back to the pool")
	require.Eventually(t, func() bool { // its backend ends once it reads the close
		var alive bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", int64(first)).Scan(&alive))
		return !alive
	}, 10*time.Second, 5*time.Millisecond, "the session of the destroyed connection ended")
}

// Lend's doc: a first Lend inside a transaction of the caller's records no
// identity (a SET LOCAL ROLE may be in force, and the identity at
// connection start need not be the pool's: a SET ROLE in AfterConnect), so
// Release destroys the connection unless the lent code was found quiet.
// Review 22: before, the reset returned to the identity at connection
// start, and the next borrower of a pool whose AfterConnect ran SET ROLE
// got the login user (here a superuser); with a SET LOCAL ROLE in force, a
// recorded identity would have kept the local role.
func TestFirstLendInsideATransactionRecordsNoIdentity(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	base, other := oddRole(ctx, t, admin), oddRole(ctx, t, admin)
	_, err := admin.Exec(ctx, "GRANT "+pgx.Identifier{other}.Sanitize()+" TO "+pgx.Identifier{base}.Sanitize())
	require.NoError(t, err)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, connect := range []string{"", "SET ROLE ", "SET SESSION AUTHORIZATION "} {
			for _, local := range []bool{false, true} {
				for _, lent := range []string{"SELECT 1", "SET ROLE NONE", ""} {
					name := fmt.Sprintf("%v/connect=%q/local=%v/lent=%q", mode, connect, local, lent)
					t.Run(name, func(t *testing.T) {
						cfg := pgtest.Config(t)
						cfg.MaxConns = 1
						cfg.ConnConfig.DefaultQueryExecMode = mode
						if connect != "" {
							cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
								_, err := c.Exec(ctx, connect+pgx.Identifier{base}.Sanitize())
								return err
							}
						}
						pool := pgtest.NewPool(t, cfg)
						who := func() (cur, sess string) {
							t.Helper()
							require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text, session_user::text").Scan(&cur, &sess))
							return cur, sess
						}
						cur0, sess0 := who()
						c, err := pooltx.Acquire(ctx, pool, &pooltx.ConnOptions{DeferIdentity: true})
						require.NoError(t, err)
						tx, err := c.Conn().Begin(ctx)
						require.NoError(t, err)
						if local {
							_, err = tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{other}.Sanitize())
							require.NoError(t, err)
						}
						conn := c.Lend(ctx)
						require.NoError(t, c.Dirty())
						if lent != "" {
							_, err = conn.Exec(ctx, lent)
							require.NoError(t, err)
						}
						quiet := c.Reclaim()
						require.NoError(t, tx.Commit(ctx))
						destroyed := c.Release()
						if lent == "" && quiet {
							assert.False(t, destroyed, "lent code that sent nothing changed nothing: kept")
						} else {
							assert.True(t, destroyed, "lent inside a transaction, identity unknown: destroyed")
						}
						cur, sess := who()
						assert.Equal(t, [2]string{cur0, sess0}, [2]string{cur, sess}, "the next borrower's identity is the pool's")
						// A later lend outside a transaction records the identity.
						require.NoError(t, pooltx.WithConn(ctx, pool, &pooltx.ConnOptions{DeferIdentity: true}, func(ctx context.Context, c *pooltx.Conn) error {
							_, err := c.Conn().Exec(ctx, "SET ROLE "+pgx.Identifier{other}.Sanitize())
							return err
						}))
						cur, sess = who()
						assert.Equal(t, [2]string{cur0, sess0}, [2]string{cur, sess}, "after a later lend")
					})
				}
			}
		}
	}
}

// Acquire's doc (review round 11): a connection's first pin records its
// identity, so a Reset of a connection never lent returns to the role
// AfterConnect set, not the login user's (before, RESET ROLE dropped it).
func TestResetOnANeverLentConnectionKeepsTheAfterConnectRole(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	base := oddRole(ctx, t, admin)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{base}.Sanitize())
		return err
	}
	pool := pgtest.NewPool(t, cfg)
	c, err := pooltx.Acquire(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, c.Reset(ctx))
	require.False(t, c.Release())
	var cur string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text").Scan(&cur))
	assert.Equal(t, base, cur)
}

// Lend's doc: a later Lend outside a transaction records the identity that
// a first Lend inside one could not, and the connection is then kept.
// Review 23: the first lend's mark was never cleared, and Release
// destroyed the connection all the same.
func TestALaterLendRecordsTheIdentityAndKeepsTheConnection(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	c, err := pooltx.Acquire(ctx, pool, &pooltx.ConnOptions{DeferIdentity: true})
	require.NoError(t, err)
	_, err = c.Conn().Exec(ctx, "BEGIN")
	require.NoError(t, err)
	c.Lend(ctx)
	require.True(t, c.Reclaim(), "the lent code sent nothing")
	_, err = c.Conn().Exec(ctx, "COMMIT")
	require.NoError(t, err)
	conn := c.Lend(ctx) // outside a transaction: records the identity
	_, err = conn.Exec(ctx, "SET work_mem = '5MB'")
	require.NoError(t, err)
	assert.False(t, c.Release(), "reset and kept")
}

package pooltx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// sessionState is what one borrower can leave on a connection for the
// next: its backend, the advisory locks it holds, and three settings.
type sessionState struct {
	pid              uint32
	locks            int
	searchPath       string
	statementTimeout string
	lockTimeout      string
}

// stateOfNextBorrower borrows pool's connection the way any user of the
// pool would (pool.Acquire, not pooltx) and reads its session state.
func stateOfNextBorrower(ctx context.Context, t *testing.T, pool *pgxpool.Pool) sessionState {
	t.Helper()
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	s := sessionState{pid: c.Conn().PgConn().PID()}
	require.NoError(t, c.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
		current_setting('search_path'), current_setting('statement_timeout'), current_setting('lock_timeout')`).
		Scan(&s.locks, &s.searchPath, &s.statementTimeout, &s.lockTimeout))
	return s
}

// execer is what both *pgx.Conn and pgx.Tx offer.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// leaveDirty runs what a careless callback runs. Inside a transaction each
// statement is session-level all the same: the lock survives COMMIT and
// ROLLBACK alike, the SETs survive COMMIT.
func leaveDirty(ctx context.Context, e execer, key int64) error {
	for _, sql := range []string{
		fmt.Sprintf("SELECT pg_advisory_lock(%d)", key),
		"SET search_path = pg_catalog",
		"SET statement_timeout = '4321ms'",
		"SET lock_timeout = '1234ms'",
	} {
		if _, err := e.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

// failWith returns err when work succeeded.
func failWith(work, err error) error {
	if work != nil {
		return work
	}
	return err
}

// expect returns nil when err is want, and an error saying what came
// otherwise.
func expect(err, want error) error {
	if errors.Is(err, want) {
		return nil
	}
	return fmt.Errorf("want %v, got %v", want, err)
}

// The rule of the package, on a pool of one connection: whatever a callback
// leaves (a session-level advisory lock, SET search_path, SET
// statement_timeout, SET lock_timeout), the next borrower of the connection
// gets none of it, on every path out of WithConn, WithTx and Release. The
// connection is reset and kept (same backend), not destroyed, and the
// settings of the connection string (RuntimeParams) survive the reset.
func TestNextBorrowerGetsNoLockAndNoSetting(t *testing.T) {
	ctx := testCtx(t)
	other := pgtest.Pool(t)
	errWork := errors.New("work failed")

	paths := []struct {
		name string
		run  func(ctx context.Context, pool *pgxpool.Pool, key int64) error
	}{
		{"WithConn", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
			return pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
				return leaveDirty(ctx, c.Conn(), key)
			})
		}},
		{"WithConn error", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
			return expect(pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
				return failWith(leaveDirty(ctx, c.Conn(), key), errWork)
			}), errWork)
		}},
		{"Acquire and Release", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
			c, err := pooltx.Acquire(ctx, pool, nil)
			if err != nil {
				return err
			}
			defer c.Release()
			return leaveDirty(ctx, c.Conn(), key)
		}},
		{"WithTx commit", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
			return pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
				return leaveDirty(ctx, tx, key)
			})
		}},
		{"WithTx rollback", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
			// A session lock survives ROLLBACK; the SETs do not.
			return expect(pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
				return failWith(leaveDirty(ctx, tx, key), errWork)
			}), errWork)
		}},
		{"WithTx serializable", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
			opts := &pooltx.TxOptions{Tx: pgx.TxOptions{IsoLevel: pgx.Serializable}}
			return pooltx.WithTx(ctx, pool, opts, func(ctx context.Context, tx pgx.Tx) error {
				return leaveDirty(ctx, tx, key)
			})
		}},
		{"WithTx callback commits itself", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
			return pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
				if err := tx.Commit(ctx); err != nil {
					return err
				}
				return leaveDirty(ctx, tx.Conn(), key) // now outside any transaction
			})
		}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			cfg.ConnConfig.RuntimeParams["statement_timeout"] = "9876ms" // the connection's own default
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
			pool := pgtest.NewPool(t, cfg)
			before := stateOfNextBorrower(ctx, t, pool)
			require.Equal(t, "9876ms", before.statementTimeout)

			key := pgtest.UniqueInt64(t)
			require.NoError(t, p.run(ctx, pool, key))

			after := stateOfNextBorrower(ctx, t, pool)
			assert.Equal(t, before, after, "the next borrower must find the session as it was")
			assert.Equal(t, before.pid, after.pid, "a connection that can be reset is kept, not destroyed")
			assert.True(t, keyFree(ctx, t, other, key), "the callback's session lock went into the pool")
		})
	}
}

// The package doc: a SET run in AfterConnect survives a release by pooltx
// that follows work which sent anything (RESET ALL, then the settings the
// session had set itself at its first pin); work that sent nothing leaves
// it alone. (Before review 22 the reset dropped it, as this test then
// asserted.)
func TestResetKeepsAfterConnectSettings(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET statement_timeout = '5555ms'")
		return err
	}
	pool := pgtest.NewPool(t, cfg)
	require.Equal(t, "5555ms", stateOfNextBorrower(ctx, t, pool).statementTimeout)
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(context.Context, *pooltx.Conn) error { return nil }))
	require.Equal(t, "5555ms", stateOfNextBorrower(ctx, t, pool).statementTimeout, "work that sent nothing: no reset")
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		_, err := c.Conn().Exec(ctx, "SELECT 1")
		return err
	}))
	assert.Equal(t, "5555ms", stateOfNextBorrower(ctx, t, pool).statementTimeout, "work that sent something: reset")
}

// The reset shares the COMMIT's round trip: WithTx costs what it cost
// before the reset existed (BEGIN, COMMIT); WithConn pays one round trip
// for it, and none when its work sent nothing.
func TestResetRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	pool, rt := countedPool(t)
	for range 2 { // the second call runs on prepared statements
		rt.Reset()
		require.NoError(t, pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		}))
	}
	assert.EqualValues(t, 3, rt.Count(), "BEGIN; SELECT 1; COMMIT with the reset")
	rt.Reset()
	require.NoError(t, pooltx.WithTx(ctx, pool, nil, func(context.Context, pgx.Tx) error { return nil }))
	assert.EqualValues(t, 2, rt.Count(), "BEGIN; COMMIT")
	rt.Reset()
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		_, err := c.Conn().Exec(ctx, "SELECT 1")
		return err
	}))
	assert.EqualValues(t, 2, rt.Count(), "SELECT 1, then the reset at release")
	rt.Reset()
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(context.Context, *pooltx.Conn) error { return nil }))
	assert.EqualValues(t, 0, rt.Count(), "work that sent nothing: no reset")
}

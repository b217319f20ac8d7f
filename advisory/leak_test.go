package advisory_test

import (
	"context"
	"errors"
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

// pooledSession is what a borrower of the pool finds on its connection.
type pooledSession struct {
	pid                                   uint32
	advisoryLocks                         int
	searchPath, lockTimeout, savedTimeout string
}

func nextBorrower(ctx context.Context, t *testing.T, pool *pgxpool.Pool) pooledSession {
	t.Helper()
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	s := pooledSession{pid: c.Conn().PgConn().PID()}
	require.NoError(t, c.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
			current_setting('search_path'), current_setting('lock_timeout'),
			coalesce(current_setting('pgxlock.saved_lock_timeout', true), '<not defined>')`).
		Scan(&s.advisoryLocks, &s.searchPath, &s.lockTimeout, &s.savedTimeout))
	return s
}

// After any helper returns, the pooled connection holds no advisory lock
// and no setting changed by the call: not a session lock the callback took
// on the lock's connection or transaction, not a session-level SET of the
// callback, not the library's own lock_timeout (or a placeholder setting
// that carried it). Checked on a pool of one connection, which is kept
// (same backend), and with the callback failing too (a session lock
// survives ROLLBACK).
func TestHelpersLeaveNoLockAndNoSettingInThePool(t *testing.T) {
	ctx := testCtx(t)
	other := pgtest.Pool(t)
	errWork := errors.New("work failed")
	opts := &advisory.Options{Timeout: 2 * time.Second} // the wait sets lock_timeout

	type exec func(ctx context.Context, sql string, args ...any) error
	dirty := func(ctx context.Context, run exec, k2 int64) error {
		for _, sql := range []string{
			fmt.Sprintf("SELECT pg_advisory_lock(%d)", k2),
			"SET lock_timeout = '777ms'",
			"SET search_path = pg_catalog",
		} {
			if err := run(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	}
	txFn := func(k2 int64, fail bool) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			err := dirty(ctx, func(ctx context.Context, sql string, args ...any) error {
				_, err := tx.Exec(ctx, sql, args...)
				return err
			}, k2)
			if err == nil && fail {
				err = errWork
			}
			return err
		}
	}
	connFn := func(k2 int64, fail bool) func(ctx context.Context, c *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error {
			err := dirty(ctx, func(ctx context.Context, sql string, args ...any) error {
				_, err := c.Exec(ctx, sql, args...)
				return err
			}, k2)
			if err == nil && fail {
				err = errWork
			}
			return err
		}
	}
	calls := []struct {
		name string
		fail bool
		call func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error
	}{
		{"WithXactLock", false, func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error {
			return l.WithXactLock(ctx, k, opts, txFn(k2, fail))
		}},
		{"WithXactLock failing", true, func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error {
			return l.WithXactLock(ctx, k, opts, txFn(k2, fail))
		}},
		{"TryWithXactLock", false, func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error {
			return l.TryWithXactLock(ctx, k, nil, txFn(k2, fail))
		}},
		{"WithXactLockAll", false, func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error {
			return l.WithXactLockAll(ctx, []keys.Key{k, keys.Pair(pgtest.UniqueInt32(t), 7)}, opts, txFn(k2, fail))
		}},
		{"WithXactLockAll failing", true, func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error {
			return l.WithXactLockAll(ctx, []keys.Key{k, keys.Pair(pgtest.UniqueInt32(t), 7)}, opts, txFn(k2, fail))
		}},
		{"WithLock", false, func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error {
			return l.WithLock(ctx, k, opts, connFn(k2, fail))
		}},
		{"WithLockAll failing", true, func(l *advisory.Locker, k keys.Key, k2 int64, fail bool) error {
			return l.WithLockAll(ctx, []keys.Key{k, keys.Pair(pgtest.UniqueInt32(t), 7)}, opts, connFn(k2, fail))
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			before := nextBorrower(ctx, t, pool)
			k2 := pgtest.UniqueInt64(t)
			err := tc.call(l, key(t), k2, tc.fail)
			if tc.fail {
				require.ErrorIs(t, err, errWork)
			} else {
				require.NoError(t, err)
			}
			after := nextBorrower(ctx, t, pool)
			assert.Equal(t, before, after, "the next borrower must find the session as it was")
			var free bool
			require.NoError(t, other.QueryRow(ctx, "SELECT pg_try_advisory_lock($1) AND pg_advisory_unlock($1)", k2).Scan(&free))
			assert.True(t, free, "the callback's session lock went into the pool")
		})
	}
}

// A callback that commits the transaction itself is accepted: its commit
// counts (and ends the lock with it), the call returns nil and the
// connection is kept.
func TestXactCallbackCommittingItselfIsAccepted(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	schema := pgtest.Schema(t, pool)
	table := pgx.Identifier{schema, "t"}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id int)")
	require.NoError(t, err)
	before := nextBorrower(ctx, t, pool)
	k := key(t)
	err = l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
	assert.Equal(t, 1, n, "the callback's commit counts")
	assert.Equal(t, before, nextBorrower(ctx, t, pool), "the connection is kept, clean")
}

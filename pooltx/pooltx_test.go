package pooltx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/pooltx"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// keyFree reports, from a connection of another pool, whether key can be
// locked right now (it unlocks again at once).
func keyFree(ctx context.Context, t *testing.T, other *pgxpool.Pool, key int64) bool {
	t.Helper()
	var got bool
	err := other.QueryRow(ctx, `SELECT pg_try_advisory_lock($1) AND pg_advisory_unlock($1)`, key).Scan(&got)
	require.NoError(t, err)
	return got
}

// awaitKeyFree waits (bounded) until key is free as seen from other: a
// destroyed session releases its locks when its backend exits.
func awaitKeyFree(ctx context.Context, t *testing.T, other *pgxpool.Pool, key int64) {
	t.Helper()
	require.Eventually(t, func() bool { return keyFree(ctx, t, other, key) }, 5*time.Second, 2*time.Millisecond,
		"key %d still held after its connection was destroyed", key)
}

func createTable(ctx context.Context, t *testing.T, pool *pgxpool.Pool, ddl string) string {
	t.Helper()
	schema := pgtest.Schema(t, pool)
	name := pgx.Identifier{schema, "t"}.Sanitize()
	_, err := pool.Exec(ctx, fmt.Sprintf(ddl, name))
	require.NoError(t, err)
	return name
}

func countRows(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func TestWithConnReleasesCleanConnection(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	var pid1, pid2 uint32
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		pid1 = c.Conn().PgConn().PID()
		return nil
	}))
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		pid2 = c.Conn().PgConn().PID()
		return nil
	}))
	assert.Equal(t, pid1, pid2, "a clean connection goes back to the pool and is reused")
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	assert.EqualValues(t, 1, pool.Stat().TotalConns())
}

func TestWithConnValueReturnsValueAndError(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	v, err := pooltx.WithConnValue(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) (int, error) {
		var n int
		return n, c.Conn().QueryRow(ctx, "SELECT 41 + 1").Scan(&n)
	})
	require.NoError(t, err)
	assert.Equal(t, 42, v)

	sentinel := errors.New("boom")
	_, err = pooltx.WithConnValue(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) (int, error) {
		return 0, sentinel
	})
	assert.ErrorIs(t, err, sentinel)
}

func TestWithConnPanicDestroysConnectionAndRepanics(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	other := pgtest.Pool(t)
	key := pgtest.UniqueInt64(t)

	assert.PanicsWithValue(t, "callback bug", func() {
		_ = pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			_, err := c.Conn().Exec(ctx, "SELECT pg_advisory_lock($1)", key)
			require.NoError(t, err)
			panic("callback bug")
		})
	})
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "the panicking connection must be destroyed, not pooled")
	awaitKeyFree(ctx, t, other, key)
}

func TestWithConnLeftOpenTransactionIsDestroyed(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		_, err := c.Conn().Exec(ctx, "BEGIN")
		return err
	}))
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "a connection left inside a transaction must not be pooled")
}

func TestMarkDirtyDestroysConnection(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	other := pgtest.Pool(t)
	key := pgtest.UniqueInt64(t)
	reason := errors.New("unlock outcome unknown")
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		if _, err := c.Conn().Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return err
		}
		c.MarkDirty(reason)
		c.MarkDirty(errors.New("second reason is ignored"))
		assert.Equal(t, reason, c.Dirty())
		return nil
	}))
	assert.EqualValues(t, 0, pool.Stat().TotalConns())
	awaitKeyFree(ctx, t, other, key)
}

func TestAcquireReleaseIsIdempotent(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	c, err := pooltx.Acquire(ctx, pool, &pooltx.ConnOptions{CleanupTimeout: time.Second})
	require.NoError(t, err)
	assert.Equal(t, time.Second, c.CleanupTimeout())
	assert.False(t, c.Release())
	assert.False(t, c.Release())
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())

	_, err = pooltx.Acquire(ctx, nil, nil)
	assert.Error(t, err)
}

func TestWithTxCommitsOnSuccess(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	table := createTable(ctx, t, pool, "CREATE TABLE %s (id int PRIMARY KEY)")
	n, err := pooltx.WithTxValue(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		tag, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1), (2)")
		return tag.RowsAffected(), err
	})
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	assert.Equal(t, 2, countRows(ctx, t, pool, table))
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

func TestWithTxRollsBackOnError(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	table := createTable(ctx, t, pool, "CREATE TABLE %s (id int PRIMARY KEY)")
	sentinel := errors.New("business rule failed")
	err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
			return err
		}
		return sentinel
	})
	assert.ErrorIs(t, err, sentinel)
	assert.Equal(t, 0, countRows(ctx, t, pool, table))
	assert.EqualValues(t, 1, pool.Stat().TotalConns(), "a clean rollback keeps the connection")
}

func TestWithTxPanicRollsBackDestroysAndRepanics(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	other := pgtest.Pool(t)
	table := createTable(ctx, t, other, "CREATE TABLE %s (id int PRIMARY KEY)")
	key := pgtest.UniqueInt64(t)
	assert.PanicsWithError(t, "boom", func() {
		_ = pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "SELECT pg_advisory_lock($1)", key) // a session lock inside the tx
			require.NoError(t, err)
			panic(errors.New("boom"))
		})
	})
	assert.EqualValues(t, 0, pool.Stat().TotalConns())
	awaitKeyFree(ctx, t, other, key)
	assert.Equal(t, 0, countRows(ctx, t, other, table))
}

// The caller's context is cancelled while the callback runs: the callback's
// query fails, the transaction is rolled back and nothing stays acquired.
func TestWithTxCancelledMidCallbackRollsBack(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	table := createTable(ctx, t, pool, "CREATE TABLE %s (id int PRIMARY KEY)")

	t.Run("query interrupted", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		err := pooltx.WithTx(cctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
				return err
			}
			cancel()
			_, err := tx.Exec(ctx, "SELECT pg_sleep(30)")
			return err
		})
		require.Error(t, err)
		assert.ErrorIs(t, err, context.Canceled)
		assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
		assert.Equal(t, 0, countRows(ctx, t, pool, table))
	})

	t.Run("callback returns ctx error", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		err := pooltx.WithTx(cctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (2)"); err != nil {
				return err
			}
			cancel()
			return ctx.Err()
		})
		assert.ErrorIs(t, err, context.Canceled)
		assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
		assert.Equal(t, 0, countRows(ctx, t, pool, table), "rollback must run although the caller's context is done")
	})
}

func TestWithTxFailingPreambleRollsBack(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	table := createTable(ctx, t, pool, "CREATE TABLE %s (id int PRIMARY KEY)")
	called := false
	err := pooltx.WithTx(ctx, pool, &pooltx.TxOptions{Preamble: func(b *pgx.Batch) {
		b.Queue("INSERT INTO " + table + " VALUES (1)")
		b.Queue("SELECT 1/0")
	}}, func(ctx context.Context, tx pgx.Tx) error {
		called = true
		return nil
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "22012", pgErr.Code)
	assert.False(t, called, "the callback must not run after a failed preamble")
	assert.Equal(t, 0, countRows(ctx, t, pool, table))
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	assert.EqualValues(t, 1, pool.Stat().TotalConns(), "a failed preamble the server answered keeps the connection")
}

func TestWithTxPreambleHandlerErrorIsReturnedAsIs(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	notAcquired := errors.New("not acquired")
	key := pgtest.UniqueInt64(t)
	other := pgtest.Pool(t)
	// Hold the key elsewhere so the try-lock in the preamble returns false.
	holder, err := other.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)
	defer holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key) //nolint:errcheck

	err = pooltx.WithTx(ctx, pool, &pooltx.TxOptions{Preamble: func(b *pgx.Batch) {
		b.Queue("SELECT pg_try_advisory_xact_lock($1)", key).QueryRow(func(r pgx.Row) error {
			var ok bool
			if err := r.Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return notAcquired
			}
			return nil
		})
	}}, func(ctx context.Context, tx pgx.Tx) error {
		t.Error("callback ran without the lock")
		return nil
	})
	assert.ErrorIs(t, err, notAcquired)
	assert.EqualValues(t, 1, pool.Stat().TotalConns())
}

func TestWithTxCommitErrorIsReturned(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	table := createTable(ctx, t, pool, "CREATE TABLE %s (id int, CONSTRAINT u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
	err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1), (1)")
		return err // the violation surfaces only at COMMIT
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "23505", pgErr.Code)
	assert.ErrorIs(t, err, pooltx.ErrNotCommitted, "the server refused the COMMIT: nothing was committed")
	assert.Equal(t, 0, countRows(ctx, t, pool, table))
	assert.EqualValues(t, 1, pool.Stat().TotalConns(), "the server answered the commit: the connection is clean")
}

// The backend dies under the callback; the rollback cannot run, so the
// error names the step and the connection is destroyed.
func TestWithTxFailedRollbackIsCleanupErrorAndDestroys(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	other := pgtest.Pool(t)
	sentinel := errors.New("callback failed")
	err := pooltx.WithTx(ctx, pool, &pooltx.TxOptions{CleanupTimeout: 2 * time.Second}, func(ctx context.Context, tx pgx.Tx) error {
		pid := tx.Conn().PgConn().PID()
		var ok bool
		require.NoError(t, other.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok))
		require.True(t, ok)
		return sentinel
	})
	assert.ErrorIs(t, err, sentinel)
	var cerr *pooltx.CleanupError
	require.ErrorAs(t, err, &cerr, "the failed rollback is reported with its step")
	assert.Equal(t, "rollback", cerr.Step)
	assert.EqualValues(t, 0, pool.Stat().TotalConns())
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

// BEGIN and the preamble go out in one round trip; COMMIT is the second.
func TestWithTxBeginAndPreambleIsOneRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	var counter roundtrip.Counter
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = counter.DialFunc
	pool := pgtest.NewPool(t, cfg)
	key := pgtest.UniqueInt64(t)

	run := func() (atCallback, total int64) {
		err := pooltx.WithTx(ctx, pool, &pooltx.TxOptions{Preamble: func(b *pgx.Batch) {
			counter.Reset()
			b.Queue("SELECT set_config('lock_timeout', $1, true)", "2s")
			b.Queue("SELECT pg_advisory_xact_lock($1)", key)
		}}, func(ctx context.Context, tx pgx.Tx) error {
			atCallback = counter.Count()
			return nil
		})
		require.NoError(t, err)
		return atCallback, counter.Count()
	}
	run() // the first call prepares the statements (pgx's statement cache)
	atCallback, total := run()
	assert.EqualValues(t, 1, atCallback, "BEGIN + preamble must be one round trip")
	assert.EqualValues(t, 2, total, "BEGIN + preamble, then COMMIT")

	// The same work by hand costs one trip per statement: the counter can tell.
	counter.Reset()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", "2s"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key)
		return err
	}))
	assert.EqualValues(t, 4, counter.Count(), "naive BEGIN / set / lock / COMMIT")
}

func TestCleanupContextIgnoresCancellation(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancel()
	ctx, stop := pooltx.CleanupContext(parent, time.Minute)
	defer stop()
	assert.NoError(t, ctx.Err())
	assert.Equal(t, "v", ctx.Value(ctxKey{}))
	dl, ok := ctx.Deadline()
	require.True(t, ok)
	assert.WithinDuration(t, time.Now().Add(time.Minute), dl, 5*time.Second)

	ctx2, stop2 := pooltx.CleanupContext(parent, 0)
	defer stop2()
	dl2, _ := ctx2.Deadline()
	assert.WithinDuration(t, time.Now().Add(pooltx.DefaultCleanupTimeout), dl2, 5*time.Second)
}

type ctxKey struct{}

func TestCleanupErrorUnwraps(t *testing.T) {
	cause := &pgconn.PgError{Code: "57P01"}
	err := error(&pooltx.CleanupError{Step: "unlock", Err: cause})
	assert.Contains(t, err.Error(), "pooltx: unlock:")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "57P01", pgErr.Code)
}

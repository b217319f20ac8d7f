package advisory_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// ownTable makes a one-column table in the test's schema.
func ownTable(ctx context.Context, t *testing.T) string {
	t.Helper()
	admin := pgtest.Pool(t)
	table := pgx.Identifier{pgtest.Schema(t, admin), "own"}.Sanitize()
	_, err := admin.Exec(ctx, "CREATE TABLE "+table+" (id int)")
	require.NoError(t, err)
	return table
}

func rowsIn(ctx context.Context, t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// WithXactLock's doc: a COMMIT AND CHAIN commits what came before it and
// ends the lock; the error of the call's COMMIT (here ErrNotCommitted, the
// chained transaction having failed) is that new transaction's only, and
// what fn committed stays committed.
func TestXactCallbackCommitAndChainKeepsWhatItCommitted(t *testing.T) {
	ctx := testCtx(t)
	table := ownTable(ctx, t)
	l := newLocker(t, onePool(t, nil), advisory.Config{})
	p := newProbe(t)
	k := key(t)
	err := l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "COMMIT AND CHAIN")
		require.NoError(t, err)
		assert.True(t, p.free(ctx, k, false), "the lock ended with fn's commit")
		_, err = tx.Exec(ctx, "SELECT 1/0")
		require.Error(t, err) // and swallowed
		return nil
	})
	require.ErrorIs(t, err, pooltx.ErrNotCommitted)
	assert.Equal(t, 1, rowsIn(ctx, t, table), "what fn committed stays committed")
}

// WithXactLock's doc: a PREPARE TRANSACTION of fn's own that fails (here:
// prepared transactions are disabled, max_prepared_transactions = 0, the
// server's default) rolls back; that is fn's outcome and the call returns
// fn's nil.
func TestXactCallbackFailedPrepareIsFnsOutcome(t *testing.T) {
	ctx := testCtx(t)
	var max int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&max))
	require.Zero(t, max, "the test needs PREPARE TRANSACTION to fail")
	table := ownTable(ctx, t)
	l := newLocker(t, onePool(t, nil), advisory.Config{})
	k := key(t)
	err := l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "PREPARE TRANSACTION 'pgxlock_own'")
		require.Error(t, err) // and swallowed
		return nil
	})
	require.NoError(t, err)
	assert.Zero(t, rowsIn(ctx, t, table))
	assert.True(t, newProbe(t).free(ctx, k, false))
}

// ErrCallbackInTx's doc: what a WithLock callback committed itself before
// the transaction it left open (a COMMIT AND CHAIN) is kept; the open one
// is rolled back.
func TestCallbackInTxAfterCommitAndChainKeepsWhatWasCommitted(t *testing.T) {
	ctx := testCtx(t)
	table := ownTable(ctx, t)
	l := newLocker(t, onePool(t, nil), advisory.Config{})
	err := l.WithLock(ctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error {
		for _, q := range []string{"BEGIN", "INSERT INTO " + table + " VALUES (1)", "COMMIT AND CHAIN", "INSERT INTO " + table + " VALUES (2)"} {
			_, err := c.Exec(ctx, q)
			require.NoError(t, err)
		}
		return nil
	})
	require.ErrorIs(t, err, advisory.ErrCallbackInTx)
	assert.Equal(t, 1, rowsIn(ctx, t, table), "the row before the chain is kept, the one after rolled back")
}

// WithXactLock's doc: a COMMIT AND CHAIN in a transaction a statement of
// which failed rolls back, as COMMIT does, without an error: nothing is
// committed, and the call returns fn's nil.
func TestXactCallbackCommitAndChainInAFailedTransactionRollsBack(t *testing.T) {
	ctx := testCtx(t)
	table := ownTable(ctx, t)
	l := newLocker(t, onePool(t, nil), advisory.Config{})
	err := l.WithXactLock(ctx, key(t), nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT 1/0")
		require.Error(t, err) // and swallowed
		_, err = tx.Exec(ctx, "COMMIT AND CHAIN")
		require.NoError(t, err)
		return nil
	})
	require.NoError(t, err)
	assert.Zero(t, rowsIn(ctx, t, table))
}

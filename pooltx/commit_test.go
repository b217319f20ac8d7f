package pooltx_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// A callback that ends the transaction itself is accepted: what it did is
// the outcome, WithTx returns nil, and the connection is kept.
func TestWithTxCallbackEndingTheTransactionIsAccepted(t *testing.T) {
	ctx := testCtx(t)
	cases := []struct {
		name string
		end  func(ctx context.Context, tx pgx.Tx) error
		rows int
	}{
		{"tx.Commit", func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }, 1},
		{"COMMIT", func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT"); return err }, 1},
		{"tx.Rollback", func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			pool := pgtest.NewPool(t, cfg)
			table := createTable(ctx, t, pool, "CREATE TABLE %s (id int PRIMARY KEY)")
			before := stateOfNextBorrower(ctx, t, pool)
			err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
					return err
				}
				return tc.end(ctx, tx)
			})
			require.NoError(t, err, "the callback's own end of the transaction counts")
			assert.Equal(t, tc.rows, countRows(ctx, t, pool, table))
			assert.Equal(t, before, stateOfNextBorrower(ctx, t, pool), "the connection is kept and clean")
		})
	}
}

// fn returned nil but the context ended before COMMIT: nothing is
// committed, the error says so (ErrNotCommitted, and the context's error),
// and the connection, rolled back, is kept.
func TestWithTxContextEndedBeforeCommitIsNotCommitted(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	table := createTable(ctx, t, pool, "CREATE TABLE %s (id int PRIMARY KEY)")
	before := stateOfNextBorrower(ctx, t, pool)

	dctx := newExpiring(ctx)
	err := pooltx.WithTx(dctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
			return err
		}
		dctx.expire() // the deadline passes as the work finishes
		return nil
	})
	require.ErrorIs(t, err, pooltx.ErrNotCommitted)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, 0, countRows(ctx, t, pool, table))
	assert.Equal(t, before, stateOfNextBorrower(ctx, t, pool), "rolled back, reset and kept")
}

// The server refuses the COMMIT of a transaction that already failed
// (fn swallowed the error): ErrNotCommitted and pgx.ErrTxCommitRollback,
// connection kept.
func TestWithTxFailedTransactionIsNotCommitted(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	before := stateOfNextBorrower(ctx, t, pool)
	err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1/0")
		require.Error(t, err)
		return nil
	})
	assert.ErrorIs(t, err, pooltx.ErrNotCommitted)
	assert.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	assert.Equal(t, before, stateOfNextBorrower(ctx, t, pool))
}

// COMMIT is sent and no answer comes before the context ends: the outcome
// is unknown (ErrCommitUnknown) and the connection is destroyed. A deferred
// trigger that waits for an advisory lock the test holds keeps the COMMIT
// from answering.
func TestWithTxCommitWithoutAnswerIsUnknown(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	other := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	table := pgx.Identifier{schema, "t"}.Sanitize()
	fn := pgx.Identifier{schema, "wait"}.Sanitize()
	key := pgtest.UniqueInt64(t)
	for _, ddl := range []string{
		"CREATE TABLE " + table + " (id int)",
		"CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock(" +
			strconv.FormatInt(key, 10) + "); RETURN NULL; END $$",
		"CREATE CONSTRAINT TRIGGER w AFTER INSERT ON " + table + " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + fn + "()",
	} {
		_, err := pool.Exec(ctx, ddl)
		require.NoError(t, err)
	}
	holder, err := other.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)
	defer holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock_all()") //nolint:errcheck

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // cancel once the COMMIT waits in the trigger
		_ = pollWaiter(ctx, other, key)
		cancel()
	}()
	err = pooltx.WithTx(cctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
		return err
	})
	require.ErrorIs(t, err, pooltx.ErrCommitUnknown)
	assert.NotErrorIs(t, err, pooltx.ErrNotCommitted)
	assert.ErrorIs(t, err, context.Canceled)
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "a COMMIT without an answer destroys the connection")
}

// pollWaiter waits (bounded) until some session waits for key.
func pollWaiter(ctx context.Context, observer interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key int64) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		classid, objid, objsubid := keys.Int64(key).PgLocks()
		err := observer.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid = $2 AND objsubid = $3`, classid, objid, objsubid).Scan(&n)
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return errors.New("no waiter")
}

// expiring is a context whose deadline passes when the test says so.
type expiring struct {
	context.Context
	done chan struct{}
}

func newExpiring(parent context.Context) *expiring {
	return &expiring{Context: parent, done: make(chan struct{})}
}

func (e *expiring) expire()                     { close(e.done) }
func (e *expiring) Done() <-chan struct{}       { return e.done }
func (e *expiring) Deadline() (time.Time, bool) { return time.Time{}, false }
func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// WithTx's doc and ErrNotCommitted's: a transaction whose session the
// server ended for idling past idle_in_transaction_session_timeout before
// COMMIT ran is not committed: ErrNotCommitted (not ErrCommitUnknown), the
// 25P03 in the chain, none of its rows kept, and the connection destroyed.
func TestIdleInTransactionTimeoutIsNotCommitted(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	table := createTable(ctx, t, admin, "CREATE TABLE %s (id int)")
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "200ms"
	pool := pgtest.NewPool(t, cfg)
	var pid uint32
	err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
		require.NoError(t, err)
		pid = tx.Conn().PgConn().PID()
		pgtest.AwaitBackendGone(ctx, t, admin, pid) // the event: the server ended the idle session
		return nil
	})
	require.ErrorIs(t, err, pooltx.ErrNotCommitted)
	require.NotErrorIs(t, err, pooltx.ErrCommitUnknown)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "25P03", pgErr.Code)
	assert.Equal(t, 0, countRows(ctx, t, admin, table))
	var next uint32
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&next))
	assert.NotEqual(t, pid, next, "the ended connection was destroyed")
}

// WithTx's doc: a COMMIT AND CHAIN of fn's own commits what came before
// it; the outcome WithTx reports (here ErrNotCommitted: the chained
// transaction failed) is the new transaction's only. A PREPARE TRANSACTION
// of fn's own that fails has rolled back: WithTx returns fn's nil.
func TestWithTxOwnEndings(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	pool := pgtest.Pool(t)
	t.Run("commit and chain", func(t *testing.T) {
		table := createTable(ctx, t, admin, "CREATE TABLE %s (id int)")
		err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			for _, q := range []string{"INSERT INTO " + table + " VALUES (1)", "COMMIT AND CHAIN", "INSERT INTO " + table + " VALUES (2)"} {
				_, err := tx.Exec(ctx, q)
				require.NoError(t, err)
			}
			_, err := tx.Exec(ctx, "SELECT 1/0")
			require.Error(t, err) // and swallowed
			return nil
		})
		require.ErrorIs(t, err, pooltx.ErrNotCommitted)
		assert.Equal(t, 1, countRows(ctx, t, admin, table))
	})
	t.Run("failed prepare", func(t *testing.T) {
		table := createTable(ctx, t, admin, "CREATE TABLE %s (id int)")
		err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
			require.NoError(t, err)
			// Prepared transactions are disabled: max_prepared_transactions = 0.
			_, err = tx.Exec(ctx, "PREPARE TRANSACTION 'pgxlock_own'")
			require.Error(t, err) // and swallowed
			return nil
		})
		require.NoError(t, err)
		assert.Zero(t, countRows(ctx, t, admin, table))
	})
}

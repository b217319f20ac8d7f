package pooltx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TxOptions are per-call options for [WithTx]. A nil *TxOptions means a
// default transaction, no preamble and the default cleanup timeout.
type TxOptions struct {
	// Tx is passed to BEGIN (isolation level, access mode, deferrable). A
	// BeginQuery in it is sent as pgx sends it, and counts as the caller's
	// SQL: the session is reset after the transaction, as after
	// statements of fn's (it may hold anything, a session lock or a SET
	// among them, and need not begin a transaction at all).
	Tx pgx.TxOptions

	// Preamble, when set, queues statements into the batch that begins the
	// transaction, so that BEGIN and these statements reach the server in
	// one round trip. Attach result handlers with QueuedQuery.QueryRow or
	// QueuedQuery.Exec; they run before fn, and an error from one aborts
	// the call (the transaction is rolled back) and is returned unchanged.
	// Preamble must not call Batch.BeginTx.
	Preamble func(b *pgx.Batch)

	// PreambleChangesNoState vouches that the statements Preamble queues
	// change no session state that outlives the transaction (a
	// transaction-level lock, say, or SET LOCAL): with it, as without a
	// preamble, a transaction in which fn sent nothing on the connection
	// ([Conn.Reclaim]) ends without the reset, which has nothing to undo.
	// Like [Conn.MarkClean], the caller vouches for every statement.
	PreambleChangesNoState bool

	// PreambleContext, when set, governs BEGIN and the preamble instead of
	// the call's context, which still governs fn and COMMIT. A lock helper
	// uses it to give a lock wait its own cancellation policy.
	PreambleContext context.Context

	// CleanupTimeout bounds ROLLBACK and closing a destroyed connection.
	// Zero means DefaultCleanupTimeout.
	CleanupTimeout time.Duration
}

// WithTx pins one connection of pool, begins a transaction together with
// opts.Preamble in one round trip, runs fn, and commits when fn returns nil.
// The COMMIT and the reset of the session ([Conn.Reset]: identity,
// settings and session state restored, session-level advisory locks
// dropped) share one round trip, so a session lock, a SET ROLE or a SET that
// fn left behind never reaches the pool. When fn sent nothing on the
// connection ([Conn.Reclaim]) and there is no preamble, or one the caller
// vouches for (PreambleChangesNoState), COMMIT (or ROLLBACK) runs alone.
//
// ctx governs acquiring, BEGIN with the preamble, fn and COMMIT. When the
// preamble or fn fails, the transaction is rolled back (and the session
// reset, in the same round trip) under a fresh context bounded by the
// cleanup timeout, and fn's error is returned. When fn panics, the
// connection is destroyed (which ends the transaction server-side) and the
// panic is re-raised.
//
// fn may end the transaction itself (tx.Commit, tx.Rollback, or the SQL):
// that is accepted, what fn did is the outcome, and WithTx returns fn's nil
// after resetting the session; what fn ran after that ran outside any
// transaction. The errors of fn's own Commit are fn's to return: a COMMIT
// or PREPARE TRANSACTION of fn's own that the server refused, or a COMMIT
// in a failed transaction (which rolls back without an error), has rolled
// back, and WithTx still returns fn's nil (where the connection was lost
// under fn instead, the error matches [ErrCommitUnknown]). A COMMIT AND
// CHAIN in a transaction that has not failed commits what came before it
// and opens a new transaction, which WithTx commits as its own: the
// outcome reported below is that new transaction's only.
//
// When fn returned nil but the transaction was not committed, the error
// matches [ErrNotCommitted]: the context ended before COMMIT was sent (it
// also matches the context's error; the transaction was rolled back and
// the connection kept), or the server refused the COMMIT (its
// *pgconn.PgError, such as a deferred constraint or a serialization
// failure, is in the chain), or the transaction had already failed
// (pgx.ErrTxCommitRollback), or the server had ended the session for
// idling in the transaction before it ran COMMIT (idle_in_transaction_session_timeout:
// the 25P03 is in the chain, and the connection is destroyed). When COMMIT was sent but no answer came (the
// connection failed, or the context ended while waiting), the error matches
// [ErrCommitUnknown] and the connection is destroyed.
func WithTx(ctx context.Context, pool *pgxpool.Pool, opts *TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var timeout time.Duration
	if opts != nil {
		timeout = opts.CleanupTimeout
	}
	c, err := Acquire(ctx, pool, &ConnOptions{CleanupTimeout: timeout})
	if err != nil {
		return err
	}
	defer c.Release()
	c.MarkClean() // as the pool gave it out: nothing has run on it
	return c.Tx(ctx, opts, fn)
}

// WithTxValue is [WithTx] for a callback that returns a value.
func WithTxValue[T any](ctx context.Context, pool *pgxpool.Pool, opts *TxOptions, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	var v T
	err := WithTx(ctx, pool, opts, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		v, err = fn(ctx, tx)
		return err
	})
	return v, err
}

// Tx runs one transaction on the pinned connection c, as [WithTx] does,
// without releasing c afterwards. A COMMIT or ROLLBACK that runs without
// the reset (fn sent nothing, see WithTx) leaves c as clean as it was
// before Tx: what its caller ran on c before is still reset at release. Any doubt about the outcome marks c
// dirty so that its eventual Release destroys it. opts.CleanupTimeout is
// ignored in favour of c's own.
func (c *Conn) Tx(ctx context.Context, opts *TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if opts == nil {
		opts = &TxOptions{}
	}
	// BEGIN and a preamble that changes no session state are c's own:
	// until fn runs, c counts as not lent (a failure rolls back without
	// the reset), and what fn sends is counted from after them.
	// (On a connection already lent, and not reset since, nothing is c's
	// own: the earlier lend stands.)
	own := (opts.Preamble == nil || opts.PreambleChangesNoState) && opts.Tx.BeginQuery == "" && !c.lent
	// A COMMIT or ROLLBACK that runs alone (no reset) leaves c as clean as
	// it was before: statements its caller ran on c before Tx are not
	// vouched for by Tx (WithTx vouches for a connection fresh from the
	// pool with MarkClean).
	c.txClean = c.clean
	if err := c.lend(!own); err != nil { // fn gets the transaction, and with it the connection
		// The connection could not be readied (pooltx closed it): nothing
		// was sent, fn does not run.
		return fmt.Errorf("%w: %w", ErrNotCommitted, err)
	}
	if own {
		c.lent = false
	}
	c.batch = pgx.Batch{QueuedQueries: c.queued[:0]}
	clear(c.queued[:])
	b := &c.batch
	b.BeginTx(opts.Tx)
	if opts.Preamble != nil {
		opts.Preamble(b)
	}
	bctx := ctx
	if opts.PreambleContext != nil {
		bctx = opts.PreambleContext
	}
	br := c.conn.SendBatch(bctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		// BEGIN may or may not have run: roll back whatever is open. A
		// failure here (or a connection pgx already closed) destroys c.
		return joinCleanup(err, c.rollback(ctx))
	}
	if own {
		c.lent = true
		c.markSent()
	}

	fnErr := runGuarded(c, fn, ctx, tx)
	c.Reclaim() // fn sent nothing: COMMIT or ROLLBACK alone
	if fnErr != nil {
		return joinCleanup(fnErr, c.rollback(ctx))
	}
	return c.commit(ctx)
}

// codeIdleInTxTimeout is SQLSTATE 25P03, idle_in_transaction_session_timeout.
const codeIdleInTxTimeout = "25P03"

// commit ends the transaction fn returned nil in, with the reset of the
// session in the same round trip, and classifies the outcome (see WithTx).
func (c *Conn) commit(ctx context.Context) error {
	pg := c.conn.PgConn()
	if c.conn.IsClosed() {
		// The connection failed under fn (which returned nil all the same):
		// the server rolls back an open transaction when its client goes,
		// but fn may have committed, or tried to, itself.
		c.MarkDirty(errors.New("pooltx: connection closed before COMMIT"))
		return fmt.Errorf("%w: the connection closed before COMMIT", ErrCommitUnknown)
	}
	switch pg.TxStatus() {
	case 'I':
		// fn ended the transaction itself: accepted. Only the reset is left.
		cctx, cancel := CleanupContext(ctx, c.timeout)
		defer cancel()
		_ = c.Reset(cctx) // a failure destroys c; fn's outcome stands
		return nil
	}
	if err := ctx.Err(); err != nil {
		// Not sent: roll back, which keeps the connection.
		return joinCleanup(fmt.Errorf("%w: the context ended before COMMIT: %w", ErrNotCommitted, err), c.rollback(ctx))
	}
	failed := pg.TxStatus() == 'E' // COMMIT will answer ROLLBACK
	// One simple-protocol round trip: COMMIT, then the statements of the
	// reset (none when fn sent nothing: see Reclaim). The server stops at
	// the first error. The answers are read message by message
	// (readAnswers): no allocation per statement.
	want := 1
	if c.lent {
		want += c.ResetCount()
	}
	results, commitErr, err := c.execCommit(ctx, failed)
	if commitErr == nil || errors.Is(commitErr, pgx.ErrTxCommitRollback) {
		// COMMIT answered. The reset ran after it unless err says otherwise.
		switch {
		case err != nil || results < want:
			c.MarkDirty(&CleanupError{Step: "reset", Err: errors.Join(err, errResetIncomplete)})
		case c.lent:
			c.clean = true // the reset ran
		default:
			c.clean = c.txClean
		}
		if commitErr != nil {
			return fmt.Errorf("%w: %w", ErrNotCommitted, commitErr)
		}
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(commitErr, &pgErr) && pgErr.Severity == "ERROR" && !c.conn.IsClosed() && pg.TxStatus() == 'I' {
		// The server refused the COMMIT and rolled back; the statements
		// after it were skipped. Reset on their own, where fn ran any.
		if !c.lent {
			c.clean = c.txClean
			return fmt.Errorf("%w: %w", ErrNotCommitted, commitErr)
		}
		cctx, cancel := CleanupContext(ctx, c.timeout)
		defer cancel()
		_ = c.Reset(cctx)
		return fmt.Errorf("%w: %w", ErrNotCommitted, commitErr)
	}
	if errors.As(commitErr, &pgErr) && pgErr.Code == codeIdleInTxTimeout {
		// The server ended the session for idling in the transaction. It
		// raises 25P03 only while it waits for the next command, and checks
		// for it once more after reading one and before running it, so
		// COMMIT never ran: the transaction was rolled back with the session.
		c.MarkDirty(&CleanupError{Step: "commit", Err: commitErr})
		return fmt.Errorf("%w: the session was ended before COMMIT ran: %w", ErrNotCommitted, commitErr)
	}
	// Sent (or, after a failed write, possibly sent), no answer: the outcome is unknown, and so is the session's.
	c.MarkDirty(&CleanupError{Step: "commit", Err: commitErr})
	return fmt.Errorf("%w: %w", ErrCommitUnknown, commitErr)
}

// execCommit sends "COMMIT; <reset>" (COMMIT alone on a connection not
// lent: see Reclaim) and reads the answers under ctx. It
// returns how many statements completed, COMMIT's own outcome (nil,
// pgx.ErrTxCommitRollback when the transaction had failed, the server's
// error, or, when COMMIT got no answer, the connection's error) and the
// first error of the whole string.
func (c *Conn) execCommit(ctx context.Context, failed bool) (results int, commitErr, err error) {
	pg := c.conn.PgConn()
	if c.lent {
		c.query.String = "COMMIT; " + c.resetSQL()
	} else {
		c.query.String = "COMMIT"
	}
	fe := pg.Frontend()
	fe.Send(&c.query)
	if err = fe.Flush(); err != nil {
		return 0, err, err // sent or not: unknown
	}
	// ctx ends the wait by a deadline on the socket: one watcher for the
	// whole answer, where pgconn's would be armed message by message. An
	// unanswered COMMIT is in doubt either way, and c is destroyed.
	if ctx.Done() != nil {
		nc := pg.Conn()
		stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
		defer func() {
			if !stop() {
				// ctx ended while the answers were read: the deadline may
				// be set (or about to be) on the socket, whatever the
				// answers said. Such a socket never goes back to the pool.
				c.MarkDirty(&CleanupError{Step: "commit", Err: context.Cause(ctx)})
			}
		}()
	}
	results, err = readAnswersCtx(context.Background(), pg, nil, func(i int, tag []byte) {
		if i == 0 && (failed || string(tag) == "ROLLBACK") {
			commitErr = pgx.ErrTxCommitRollback
		}
	})
	if err != nil && ctx.Err() != nil {
		err = errors.Join(context.Cause(ctx), err)
	}
	if results == 0 {
		commitErr = err // no answer to COMMIT itself
	}
	return results, commitErr, err
}

// rollback ends whatever transaction is open on c and resets the session
// (only where c is lent: a connection that ran only its caller's own
// statements needs the ROLLBACK alone), in one round trip under a bounded
// context that ignores ctx's cancellation. A failure marks c dirty and
// returns a *CleanupError with Step "rollback"; a connection pgx has
// already closed is marked dirty and nil is returned (its session is
// over).
func (c *Conn) rollback(ctx context.Context) error {
	if c.conn.IsClosed() {
		c.MarkDirty(errors.New("pooltx: connection closed"))
		return nil
	}
	sql := ""
	if c.lent {
		sql = c.resetSQL()
	}
	if c.conn.PgConn().TxStatus() != 'I' {
		if sql == "" {
			sql = "ROLLBACK"
		} else {
			sql = "ROLLBACK; " + sql
		}
	}
	if sql == "" {
		c.clean = c.txClean
		return nil
	}
	cctx, cancel := CleanupContext(ctx, c.timeout)
	defer cancel()
	done := false
	defer func() {
		if !done {
			// The pool's code panicked in the statement (its tracer, even
			// after the answers were read): c goes, the panic on up.
			c.MarkDirty(errors.New("pooltx: the rollback panicked"))
		}
	}()
	_, err := c.conn.Exec(cctx, sql)
	done = true
	if err != nil {
		cerr := &CleanupError{Step: "rollback", Err: err}
		c.MarkDirty(cerr)
		return cerr
	}
	if c.conn.PgConn().TxStatus() != 'I' {
		cerr := &CleanupError{Step: "rollback", Err: errors.New("transaction still open after rollback")}
		c.MarkDirty(cerr)
		return cerr
	}
	c.clean = c.lent || c.txClean // with the reset, or as clean as before Tx
	return nil
}

// joinCleanup returns err unchanged when cleanup succeeded, and both joined
// otherwise.
func joinCleanup(err, cleanupErr error) error {
	if cleanupErr == nil {
		return err
	}
	return errors.Join(err, cleanupErr)
}

package pooltx

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TxOptions are per-call options for [WithTx]. A nil *TxOptions means a
// default transaction, no preamble and the default cleanup timeout.
type TxOptions struct {
	// Tx is passed to BEGIN (isolation level, access mode, deferrable).
	Tx pgx.TxOptions

	// Preamble, when set, queues statements into the batch that begins the
	// transaction, so that BEGIN and these statements reach the server in
	// one round trip. Attach result handlers with QueuedQuery.QueryRow or
	// QueuedQuery.Exec; they run before fn, and an error from one aborts
	// the call (the transaction is rolled back) and is returned unchanged.
	// Preamble must not call Batch.BeginTx.
	Preamble func(b *pgx.Batch)

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
//
// ctx governs acquiring, BEGIN with the preamble, fn and COMMIT. When the
// preamble or fn fails, the transaction is rolled back under a fresh context
// bounded by the cleanup timeout and fn's error is returned. When fn panics,
// the connection is destroyed (which ends the transaction server-side) and
// the panic is re-raised. A COMMIT whose outcome cannot be known (the
// connection failed during it) destroys the connection and returns the
// error; a COMMIT the server turned into a rollback returns
// pgx.ErrTxCommitRollback.
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

// Tx runs one transaction on the pinned connection c, exactly as [WithTx]
// does, without releasing c afterwards. Any doubt about the outcome marks c
// dirty so that its eventual Release destroys it. opts.CleanupTimeout is
// ignored in favour of c's own.
func (c *Conn) Tx(ctx context.Context, opts *TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if opts == nil {
		opts = &TxOptions{}
	}
	b := &pgx.Batch{}
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
		return joinCleanup(err, c.rollback(ctx, tx))
	}

	if fnErr := runGuarded(c, func() error { return fn(ctx, tx) }); fnErr != nil {
		return joinCleanup(fnErr, c.rollback(ctx, tx))
	}

	if err := tx.Commit(ctx); err != nil {
		if !errors.Is(err, pgx.ErrTxCommitRollback) && !isServerError(err) {
			// No answer from the server: the commit may or may not have
			// happened, and the session state is unknown.
			c.MarkDirty(&CleanupError{Step: "commit", Err: err})
		}
		if c.conn.PgConn().TxStatus() != 'I' {
			c.MarkDirty(&CleanupError{Step: "commit", Err: err})
		}
		return err
	}
	return nil
}

// rollback ends tx under a bounded context that ignores ctx's cancellation.
// It returns nil when nothing was open; a failed rollback marks c dirty and
// returns a *CleanupError.
func (c *Conn) rollback(ctx context.Context, tx pgx.Tx) error {
	if c.conn.IsClosed() {
		c.MarkDirty(errors.New("pooltx: connection closed"))
		return nil
	}
	if c.conn.PgConn().TxStatus() == 'I' {
		return nil
	}
	cctx, cancel := CleanupContext(ctx, c.timeout)
	defer cancel()
	if err := tx.Rollback(cctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		cerr := &CleanupError{Step: "rollback", Err: err}
		c.MarkDirty(cerr)
		return cerr
	}
	if c.conn.PgConn().TxStatus() != 'I' {
		cerr := &CleanupError{Step: "rollback", Err: errors.New("transaction still open after rollback")}
		c.MarkDirty(cerr)
		return cerr
	}
	return nil
}

// isServerError reports whether err carries an error response from the
// server, which means the server answered and the connection is in sync.
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// joinCleanup returns err unchanged when cleanup succeeded, and both joined
// otherwise.
func joinCleanup(err, cleanupErr error) error {
	if cleanupErr == nil {
		return err
	}
	return errors.Join(err, cleanupErr)
}

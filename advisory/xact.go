package advisory

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// WithXactLock begins a transaction on a pooled connection, takes key with
// pg_advisory_xact_lock, runs fn with the transaction and commits. BEGIN,
// the lock_timeout for the wait and the lock travel in one round trip. The
// lock lasts until the transaction ends: nothing is unlocked by hand, and a
// rollback, a failed commit or a dead connection releases it.
//
// fn runs with the lock_timeout the session had before the call (the
// wait's own timeout is restored before fn). ctx governs the wait for a
// connection, the lock wait (as for WithLock), fn and COMMIT. When fn
// returns an error or the wait fails, the transaction is rolled back under
// a fresh context bounded by Config.CleanupTimeout; a panic in fn destroys
// the connection and is re-raised.
//
// It returns fn's error or COMMIT's error unchanged, or a *LockError
// matching ErrLockTimeout, ErrDeadlock, ErrTooManyLocks or ErrInvalid.
func (l *Locker) WithXactLock(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return l.withXact(ctx, []keys.Key{key}, opts, false, fn)
}

// TryWithXactLock is WithXactLock without waiting: when key is busy the
// transaction is rolled back, fn does not run and the error matches
// ErrNotAcquired.
func (l *Locker) TryWithXactLock(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return l.withXact(ctx, []keys.Key{key}, opts, true, fn)
}

// WithXactLockAll is WithXactLock for several keys, sorted, de-duplicated
// and taken in order in the same round trip as BEGIN. A failure part-way
// rolls back and so releases every key.
func (l *Locker) WithXactLockAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return l.withXact(ctx, ks, opts, false, fn)
}

// TryWithXactLockAll is WithXactLockAll without waiting: if any key is
// busy, the transaction is rolled back and the error matches
// ErrNotAcquired.
func (l *Locker) TryWithXactLockAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return l.withXact(ctx, ks, opts, true, fn)
}

func xactOp(try bool) kind {
	if try {
		return kindTryXactLock
	}
	return kindXactLock
}

func (l *Locker) withXact(ctx context.Context, ks []keys.Key, opts *Options, try bool, fn func(ctx context.Context, tx pgx.Tx) error) error {
	shared := opts.shared()
	op := opName(xactOp(try), shared)
	if fn == nil {
		return &LockError{Op: op, Keys: ks, Err: invalid("nil callback")}
	}
	s, err := newKeySet(ks, l.cfg.MaxKeys)
	if err != nil {
		return &LockError{Op: op, Keys: ks, Err: err}
	}
	sp := l.startSpan(ctx, ScopeXact, s.all, shared, try)
	wctx, stopBound := l.waitBound(ctx, opts, try)
	defer stopBound()
	c, t, err := l.pin(wctx, &s, try)
	if err != nil {
		err = &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
		sp.acquired(err)
		return err
	}
	defer l.unpin(c)
	defer t.leave() // idempotent: a second leave finds nothing taken

	w := noWait(ctx)
	if !try {
		w = l.waitFor(wctx, c.Conn().PgConn())
	}
	defer w.stop()
	timeout := w.timeout

	falses := 0
	var check func(pgx.Rows) error // void results: errors only
	if try {
		bools := boolResults(&falses)
		check = func(rows pgx.Rows) error {
			if err := bools(rows); err != nil {
				return err
			}
			if falses > 0 {
				return ErrNotAcquired // rolls back: every key taken goes with it
			}
			return nil
		}
	}
	txOpts := &pooltx.TxOptions{
		PreambleContext: w.ctx,
		Preamble: func(b *pgx.Batch) {
			if timeout != "" {
				b.Queue(sqlSaveTimeout, timeout)
			}
			s.queue(b, xactOp(try), shared, "", check)
			if timeout != "" {
				b.Queue(sqlRestoreTimeout)
			}
		},
	}

	inFn, returned := false, false
	defer func() {
		if inFn && !returned { // fn panicked: the connection was destroyed
			sp.released(errors.New("callback panicked; connection destroyed"))
		}
	}()
	err = c.Tx(ctx, txOpts, func(ctx context.Context, tx pgx.Tx) error {
		w.stop()
		t.leave()
		if w.sent.Load() || w.hard.Load() || ctx.Err() != nil {
			// Granted after the wait was given up: roll back, which releases.
			if err := ctx.Err(); err != nil {
				return err
			}
			return context.Cause(wctx) // the call's timeout; wctx has ended
		}
		sp.acquired(nil)
		inFn = true
		return fn(ctx, tx)
	})
	returned = true
	if !inFn {
		w.stop()
		w.settle(c, err) // a pending cancel request makes c unfit for the pool
	}
	if inFn {
		sp.released(nil)
		return err // fn's or COMMIT's error, unchanged
	}
	if err == nil {
		return nil // unreachable: fn ran unless the preamble failed
	}
	if falses > 0 {
		err = &LockError{Op: op, Keys: s.all, Err: join(ErrNotAcquired, ctx.Err())}
	} else {
		err = &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
	}
	sp.acquired(err)
	return err
}

package advisory

import (
	"context"
	"errors"
	"time"

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
// fn runs with the session's own lock_timeout as pooltx first found it on
// this connection, which every reset returns it to (the server's,
// database's, role's or connection string's, or one a SET in pgxpool's
// AfterConnect gave it): the wait's own timeout is set back to it with SET
// LOCAL before fn, storing nothing. A value set per borrow (PrepareConn,
// BeforeAcquire) or left on the connection by other code of the pool since
// is not seen: fn gets the first one (see pooltx.Conn.SessionLockTimeout).
// ctx governs the wait for a connection, the lock wait (as for WithLock),
// fn and COMMIT. When fn returns an error or the wait fails, the
// transaction is rolled back under a fresh context bounded by
// Config.CleanupTimeout; a panic in fn destroys the connection and is
// re-raised. After the call the pooled connection holds no advisory lock
// and no setting fn changed, a session-level lock or SET included: COMMIT
// or ROLLBACK shares its round trip with pooltx's reset (COMMIT or
// ROLLBACK runs alone when fn sent nothing on the connection:
// pooltx.Conn.Reclaim).
//
// fn may commit or roll back the transaction itself: that is accepted, its
// outcome stands, and the lock ends with it (whatever fn runs afterwards
// runs unlocked and outside the transaction). A COMMIT or PREPARE
// TRANSACTION of fn's own that the server refuses, or a COMMIT in a
// transaction a statement of which failed (PostgreSQL then rolls back
// without an error), rolls the transaction back: that too is fn's outcome,
// and the call returns fn's nil (where the connection was lost under fn
// instead, the error matches pooltx.ErrCommitUnknown). A COMMIT AND CHAIN
// (in a transaction that has not failed: else it rolls back, as COMMIT
// does) commits what came before it, ends the lock, and opens a new
// transaction that the call then commits: COMMIT's outcome, and the error
// that reports it (pooltx.ErrNotCommitted included), is that new
// transaction's only; what fn had committed stays committed. A transaction fn prepares
// (PREPARE TRANSACTION) has ended too, as far as the session goes, and the
// call returns fn's nil; but a prepared transaction keeps its locks, the
// call's key included, until COMMIT PREPARED or ROLLBACK PREPARED.
//
// Options.TxOptions, when set, are passed to BEGIN (isolation level,
// access mode, deferrable mode), still in BEGIN's round trip; values pgx
// does not name, a BeginQuery or a CommitQuery are refused with
// ErrInvalid.
//
// It returns fn's error or COMMIT's error unchanged, or a *LockError
// matching ErrLockTimeout, ErrDeadlock, ErrTooManyLocks or ErrInvalid.
// COMMIT's errors match pooltx.ErrNotCommitted (nothing was committed,
// including when ctx ended before COMMIT was sent) or
// pooltx.ErrCommitUnknown (COMMIT went unanswered: the work may or may not
// be committed; the connection is destroyed).
func (l *Locker) WithXactLock(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	x := &xactCall{}
	x.key1[0] = key
	return l.withXact(ctx, x, x.key1[:], opts, false, fn)
}

// TryWithXactLock is WithXactLock without waiting: when key is busy the
// transaction is rolled back, fn does not run and the error matches
// ErrNotAcquired. It waits for a connection, and for BEGIN and its try
// statement to answer, as TryWithLock does: a server that does not answer
// in time is ErrNoConnection.
func (l *Locker) TryWithXactLock(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	x := &xactCall{}
	x.key1[0] = key
	return l.withXact(ctx, x, x.key1[:], opts, true, fn)
}

// WithXactLockAll is WithXactLock for several keys, sorted, de-duplicated
// and taken in order in the same round trip as BEGIN. A failure part-way
// rolls back and so releases every key. As for WithLockAll, the timeout and
// ctx's deadline bound the whole wait, all keys together, on the server:
// reaching it gives ErrLockTimeout (55P03) and keeps the connection.
func (l *Locker) WithXactLockAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return l.withXact(ctx, &xactCall{}, ks, opts, false, fn)
}

// TryWithXactLockAll is WithXactLockAll without waiting: if any key is
// busy, the transaction is rolled back and the error matches
// ErrNotAcquired.
func (l *Locker) TryWithXactLockAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return l.withXact(ctx, &xactCall{}, ks, opts, true, fn)
}

func xactOp(try bool) kind {
	if try {
		return kindTryXactLock
	}
	return kindXactLock
}

// xactCall is the state of one transaction-scope call, allocated once per
// call: every part of it that must be on the heap lives here. It must not
// move once in use (its fields point into it).
type xactCall struct {
	x    xactAttempt
	r    request     // what the call asks for; r.s are its keys
	key1 [1]keys.Key // the argument of a one-key call
	sp   span
	tk   ticket
	w    serverWait // the first attempt's lock wait
	bw   boundWait  // the bound of the call's wait (waitBound)
	opts pooltx.TxOptions
}

func (l *Locker) withXact(ctx context.Context, call *xactCall, ks []keys.Key, opts *Options, try bool, fn func(ctx context.Context, tx pgx.Tx) error) error {
	r := &call.r
	r.set(l, xactOp(try), opts, try)
	shared, op := r.shared, r.op
	if fn == nil {
		return &LockError{Op: op, Keys: ks, Err: invalid("nil callback")}
	}
	if err := opts.checkTxOptions(); err != nil {
		return &LockError{Op: op, Keys: ks, Err: err}
	}
	s := &r.s
	if err := s.init(ks, l.cfg.MaxKeys); err != nil {
		return &LockError{Op: op, Keys: ks, Err: err}
	}
	sp := &call.sp
	l.initSpan(sp, ctx, ScopeXact, s.all, shared, try)
	defer sp.endCut(op)
	wctx := l.waitBound(ctx, &call.bw, opts, try)
	defer call.bw.stop()
	c, t, err := l.pinInto(wctx, r, &call.tk)
	if err != nil {
		err = &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
		sp.acquired(err)
		return err
	}
	defer func() { l.unpin(c) }()
	defer t.leave() // idempotent: a second leave finds nothing taken

	x := &call.x
	for retried := false; ; retried = true {
		w := &call.w
		if retried {
			w = &serverWait{} // a serverWait is used once
		}
		*x = xactAttempt{l: l, ctx: ctx, wctx: wctx, c: c, t: t, s: s, op: op, shared: shared, try: try, sp: sp, w: w, txOpts: &call.opts, tx: opts.txOptions()}
		err = x.run(fn)
		if x.inFn {
			sp.released(nil)
			return err // fn's or COMMIT's error, unchanged
		}
		if err == nil {
			return nil // unreachable: fn ran unless the preamble failed
		}
		if retried || !diedIdle(ctx, wctx, c, err) {
			sp.acquired(err)
			return err
		}
		// The pooled connection was dead before we used it: nothing was
		// begun or locked. Once more, on a fresh one.
		if c, err = l.repin(wctx, c); err != nil {
			err = &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
			sp.acquired(err)
			return err
		}
	}
}

// xactAttempt is one try of a transaction-scope call on one connection.
type xactAttempt struct {
	l         *Locker
	ctx, wctx context.Context
	c         *pooltx.Conn
	t         *ticket
	s         *keySet
	op        string
	shared    bool
	try       bool
	sp        *span
	w         *serverWait       // zero: the attempt's lock wait
	txOpts    *pooltx.TxOptions // zero: filled by run
	inFn      bool              // fn was called: the lock was acquired
	tx        pgx.TxOptions     // for BEGIN (Options.TxOptions)

	// Filled by run for preamble.
	timeout textArg
	restore textArg // the session's lock_timeout, set back before fn (see restoreTimeout)
	bound   time.Duration
	check   func(pgx.Rows) error
	falses  int
}

// preamble queues the statements that follow BEGIN: the wait's
// lock_timeout, the locks, and the restore of lock_timeout.
func (x *xactAttempt) preamble(b *pgx.Batch) {
	if x.timeout != "" {
		b.Queue(sqlSetTimeout, &x.timeout) // a pointer: no boxing (it prints as the text: textArg)
	}
	x.s.queue(b, xactOp(x.try), x.shared, x.bound, x.check)
	if x.timeout != "" {
		queueRestoreTimeout(b, x.c, &x.restore)
	}
}

// run begins, locks and, when the locks were granted in time, runs fn and
// commits. Errors before fn are *LockError; fn's and COMMIT's are returned
// unchanged.
func (x *xactAttempt) run(fn func(ctx context.Context, tx pgx.Tx) error) error {
	ctx, wctx, c, t := x.ctx, x.wctx, x.c, x.t
	if !x.try && wctx.Err() != nil {
		// Given up before BEGIN and the lock were sent: send nothing, so
		// that no cancel request races them (see Locker.waitFor).
		return &LockError{Op: x.op, Keys: x.s.all, Err: classify(ctx, context.Cause(wctx))}
	}
	w := x.w
	w.ctx = ctx
	if !x.try {
		w.arrange(wctx, c.Conn().PgConn())
	} else {
		w.startTry(c.Conn().PgConn(), x.l.tryConnWait())
		defer w.stopTry() // idempotent: ended once the preamble has answered
	}
	defer w.stop()
	// The wait's bound becomes the transaction's lock_timeout between the
	// save and the restore; several keys share it (see keySet.queue).
	if w.bound > 0 {
		x.timeout = textArg(formatTimeout(w.bound))
		if len(x.s.all) > 1 {
			x.bound = w.bound
		}
	}

	if x.try { // else void results: errors only
		bools := boolResults(&x.falses)
		x.check = func(rows pgx.Rows) error {
			if err := bools(rows); err != nil {
				return err
			}
			if x.falses > 0 {
				return ErrNotAcquired // rolls back: every key taken goes with it
			}
			return nil
		}
	}
	txOpts := x.txOpts
	// The preamble is the lock (transaction-level, with a SET LOCAL bound):
	// nothing of it outlives the transaction.
	*txOpts = pooltx.TxOptions{Tx: x.tx, PreambleContext: w.ctx, Preamble: x.preamble, PreambleChangesNoState: true}

	returned := false
	defer func() {
		if x.inFn && !returned { // fn panicked: the connection was destroyed
			x.sp.released(errors.New("callback panicked; connection destroyed"))
		}
	}()
	// c is as the pool gave it out (only this package's statements, none
	// that change the session, ran on it): a quiet fn leaves it clean.
	c.MarkClean()
	err := c.Tx(ctx, txOpts, func(ctx context.Context, tx pgx.Tx) error {
		w.stop()
		w.stopTry() // the Try statement answered
		t.leave()
		if w.sent.Load() || w.hard.Load() || ctx.Err() != nil {
			// Granted after the wait was given up: roll back, which releases.
			if err := ctx.Err(); err != nil {
				return err
			}
			return context.Cause(wctx) // the call's timeout; wctx has ended
		}
		x.sp.acquired(nil)
		x.inFn = true
		return fn(ctx, tx)
	})
	returned = true
	if x.inFn || err == nil {
		return err
	}
	w.stop()
	if x.try {
		err = w.endTry(ctx, err)
	}
	err = w.cut(err)
	w.settle(c, err) // a pending cancel request makes c unfit for the pool
	if x.falses > 0 {
		return &LockError{Op: x.op, Keys: x.s.all, Err: join(ErrNotAcquired, ctx.Err())}
	}
	return &LockError{Op: x.op, Keys: x.s.all, Err: classify(ctx, err)}
}

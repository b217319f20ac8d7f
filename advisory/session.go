package advisory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlock/pgxlock/internal/cutoff"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// WithLock takes key at session level on one pinned pooled connection,
// waiting while it is held in a conflicting mode, runs fn, unlocks and
// releases the connection.
//
// fn may use conn, the connection that holds the lock; it must not close
// it or keep it after returning. Any session-level advisory lock fn leaves
// on conn is released with the lock, and whatever fn changed in the
// session (settings, role, session authorization, temporary tables, LISTEN,
// cursors) is reset in the unlock's round trip (see pooltx.Conn.Reset); an
// fn that sent nothing on conn changed nothing, and the unlock runs alone
// (pooltx.Conn.Reclaim). A
// transaction fn begins must end before fn returns (a COMMIT or ROLLBACK of
// its own is fine): one left open or aborted is rolled back before the
// unlock, and the call returns an error matching ErrCallbackInTx. One fn
// prepares (PREPARE TRANSACTION) has ended as far as the session goes: it
// and its locks outlive the call until COMMIT PREPARED or ROLLBACK PREPARED.
//
// ctx governs the wait for a connection, the wait for the lock and fn. The
// whole wait is bounded by Options.Timeout, else Config.LockTimeout, and by
// ctx's deadline, whichever comes first: reaching the bound while waiting
// for the lock ends with ErrLockTimeout, while still waiting for a
// connection with ErrNoConnection; a cancelled ctx ends either with ctx's
// error. If the lock is granted but ctx has ended by then, the lock is
// released at once and the call returns ctx's error: a granted lock is never
// left behind. Unlock runs under a fresh context bounded by
// Config.CleanupTimeout.
//
// It returns fn's error unchanged when the lock was taken and released
// cleanly. Otherwise the error is a *LockError matching ErrLockTimeout (the
// wait for the lock, local queue included, reached its bound),
// ErrNoConnection (no connection could be had within the bound: pool or
// Config.MaxConns exhausted, server unreachable or silent), ErrDeadlock,
// ErrTooManyLocks, ErrNotHeld (the unlock found the lock gone: the
// connection is destroyed), ErrLockLost (the unlock found the connection
// closed: the server ended the session, died or failed over, or the network
// did, at some moment while fn ran, so another session may have held the
// key meanwhile; fn's own error, if any, is joined; the tracer gets it as
// one TraceLost, no TraceRelease), ErrCallbackInTx (fn returned inside a
// transaction it began: see above) or ErrInvalid; an unlock that failed
// with no answer on a connection still open (another session cancelled
// it) wraps a *pooltx.CleanupError (the connection is destroyed, which
// frees the key); a wait that another session's pg_cancel_backend ended
// is a *LockError with the server's 57014 in the chain, matching no
// sentinel where the server's messages are in English (see "Server
// timeouts" in the package doc): nothing is held, and fn did not run. A reset that fails after the unlock answered (a
// statement_timeout it outlasted, another session's pg_cancel_backend or
// pg_terminate_backend) changes nothing of this: the unlock's answer said
// whether the key was held, the connection is destroyed, and the failure
// is logged at Warn. A panic in fn destroys
// the connection, which releases the lock server-side, and is re-raised.
func (l *Locker) WithLock(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	a, ks := oneKey(key)
	return l.withSession(ctx, a, ks, opts, false, fn)
}

// TryWithLock is WithLock without waiting: when key is held in a
// conflicting mode it returns a *LockError matching ErrNotAcquired and fn
// does not run. It waits only for a connection, for at most
// Config.LockTimeout, else DefaultTryConnWait (or until ctx ends, if
// sooner), and then fails with ErrNoConnection, never ErrNotAcquired. Its
// statement, which waits for no lock, is bounded by the same duration, from
// when it is sent, and by ctx's deadline: a server or network that does not
// answer it ends the call with ErrNoConnection (context.DeadlineExceeded in
// the chain), never ErrLockTimeout, and the connection is destroyed.
func (l *Locker) TryWithLock(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	a, ks := oneKey(key)
	return l.withSession(ctx, a, ks, opts, true, fn)
}

// WithLockAll is WithLock for several keys at once, all or nothing. The
// keys are sorted by keys.Compare and de-duplicated, then taken in that
// order in one round trip, so callers that each pass every key they need
// in one call can never deadlock each other, whatever order they list them
// in. When any wait fails, every key taken so far is released before the
// call returns. Options.Timeout (else Config.LockTimeout) and ctx's
// deadline bound the whole wait, all keys together, not each key: PostgreSQL
// applies lock_timeout to one lock wait at a time, so before each key the
// lock statement sets it to what the earlier keys left of the bound,
// measured on the server's clock. A wait that reaches the bound ends on the
// server with ErrLockTimeout (SQLSTATE 55P03), releases the keys already
// taken and keeps the connection.
func (l *Locker) WithLockAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	return l.withSession(ctx, &acquired{}, ks, opts, false, fn)
}

// TryWithLockAll is WithLockAll without waiting: if any key is busy, none
// stays held and it returns ErrNotAcquired.
func (l *Locker) TryWithLockAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	return l.withSession(ctx, &acquired{}, ks, opts, true, fn)
}

func (l *Locker) connOptions() *pooltx.ConnOptions {
	return &pooltx.ConnOptions{CleanupTimeout: l.cfg.CleanupTimeout, DeferIdentity: true}
}

func (l *Locker) withSession(ctx context.Context, a *acquired, ks []keys.Key, opts *Options, try bool, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	if fn == nil {
		return &LockError{Op: opName(sessionOp(try), opts.shared()), Keys: ks, Err: invalid("nil callback")}
	}
	if err := a.init(l, sessionOp(try), ks, opts, try); err != nil {
		return err
	}
	if err := l.acquireSession(ctx, a); err != nil {
		return err
	}
	panicked := true
	defer func() {
		if panicked {
			// Destroying the connection ends its session and every lock in
			// it; then the panic goes on up.
			a.c.MarkDirty(errors.New("advisory: callback panicked"))
			a.span.released(errors.New("callback panicked; connection destroyed"))
			l.unpin(a.c)
		}
	}()
	conn := a.c.Lend(ctx)
	if derr := a.c.Dirty(); derr != nil {
		// pooltx could not ready the connection for fn (its first Lend
		// failed, and closed it, ending the session and the lock): fn
		// does not run.
		panicked = false
		err := &LockError{Op: opName(sessionOp(try), a.shared), Keys: a.s.all, Err: noConnection(derr)}
		a.span.released(err)
		l.unpin(a.c)
		return err
	}
	fnErr := fn(ctx, conn)
	panicked = false
	unlocking := true
	defer func() {
		if unlocking {
			// A statement of the clean-up panicked (a pgx tracer's or
			// hook's panic): destroying the connection releases the lock;
			// the panic goes on up.
			a.c.MarkDirty(errStatementPanicked)
			a.span.released(errStatementPanicked)
			l.unpin(a.c)
		}
	}()
	a.c.Reclaim() // fn sent nothing on the connection: the unlock alone, no reset
	txErr := l.endLeftTx(ctx, a)
	uerr := l.unlockSession(ctx, a.c, &a.request)
	unlocking = false
	a.span.ended(uerr) // a loss found by the unlock is traced as one
	l.unpin(a.c)
	return join(fnErr, txErr, uerr)
}

// endLeftTx rolls back a transaction fn began on the lock's connection and
// left open or aborted, under a fresh bounded context, and returns an
// error matching ErrCallbackInTx; nil when fn left none. Session locks
// survive ROLLBACK, so the unlock that follows still finds the lock (or
// its loss: a ROLLBACK that fails on a dead connection leaves the unlock
// to report ErrLockLost).
func (l *Locker) endLeftTx(ctx context.Context, a *acquired) error {
	pg := a.c.Conn().PgConn()
	st := pg.TxStatus()
	if pg.IsClosed() || st == 'I' {
		return nil
	}
	err := &LockError{Op: opName(kindUnlock, a.shared), Keys: a.s.all,
		Err: fmt.Errorf("%w (transaction status %q)", ErrCallbackInTx, st)}
	a.c.BoundCleanup()
	_, rerr := pg.Exec(context.Background(), "ROLLBACK").ReadAll()
	a.c.EndBound()
	if rerr != nil || pg.TxStatus() != 'I' {
		a.c.MarkDirty(err) // destroyed after the unlock: that ends the transaction
	}
	if rerr != nil {
		// Keep what the ROLLBACK read: the FATAL of a session the server
		// ended (idle_in_transaction_session_timeout's 25P03, say).
		err.Err = fmt.Errorf("%w: rollback: %w", err.Err, rerr)
	}
	return err
}

func sessionOp(try bool) kind {
	if try {
		return kindTryLock
	}
	return kindLock
}

var opNames = func() (n [numKinds][2]string) {
	for k, name := range [numKinds]string{
		kindLock:        "lock",
		kindTryLock:     "try-lock",
		kindXactLock:    "xact-lock",
		kindTryXactLock: "try-xact-lock",
		kindUnlock:      "unlock",
	} {
		n[k] = [2]string{name, name + "-shared"}
	}
	return n
}()

func opName(k kind, shared bool) string { return opNames[k][b2i(shared)] }

// request is what one lock call asks for. The call's entry point sets it
// once, from its arguments, before anything is waited for (init, or set
// and then s.init); from then on it is only read, by everything that
// acquires, locks and unlocks for the call, which takes it instead of
// separate keys, mode and wait flags. It lives in the call's own state
// (acquired, xactCall; a batch call's frame), never on its own on the heap.
type request struct {
	// s holds the keys, sorted and de-duplicated (keySet.init); the call
	// queues in process for the first one (see queues).
	s keySet
	// shared is the mode: true for shared (Options.Shared), false for
	// exclusive.
	shared bool
	// try is the wait policy: true for a Try call, which never waits for a
	// key and waits for a connection at most Locker.tryConnWait; false for
	// a blocking call, whose whole wait timeout bounds.
	try bool
	// timeout is a blocking call's bound of its whole wait (local queue,
	// connection cap, pool, server): Options.Timeout, else
	// Config.LockTimeout (Locker.timeout); 0 is none. A Try call's is 0.
	timeout time.Duration
	// op is the operation name of the call's errors and traces ("lock",
	// "try-lock-shared", "xact-lock", ...: opName).
	op string
}

// set fills the mode, wait policy, timeout and operation name of r, a zero
// request, for a call of kind k (kindLock, kindTryLock, kindXactLock or
// kindTryXactLock; try says which form) with opts. The keys are left to
// s.init.
func (r *request) set(l *Locker, k kind, opts *Options, try bool) {
	r.shared, r.try = opts.shared(), try
	r.op = opName(k, r.shared)
	if !try {
		r.timeout = l.timeout(opts)
	}
}

// init is set, then the keys ks; invalid keys give the call's LockError.
func (r *request) init(l *Locker, k kind, ks []keys.Key, opts *Options, try bool) error {
	r.set(l, k, opts, try)
	if err := r.s.init(ks, l.cfg.MaxKeys); err != nil {
		return &LockError{Op: r.op, Keys: ks, Err: err}
	}
	return nil
}

// queues reports whether the call queues in process for its first key: a
// blocking call for one key, or for several in exclusive mode (see gate.go).
func (r *request) queues() bool {
	return !r.try && (len(r.s.all) == 1 || !r.shared)
}

// acquired is the state of one session-scope call and, once the lock is
// taken, the lock: what was asked for (request, set by the call's entry
// point), the pinned connection that holds it and the trace span it belongs
// to. Everything the call needs on the heap lives in it, so that an
// uncontended call allocates it and little else; it must not move once in
// use (its fields point into it).
type acquired struct {
	request
	c    *pooltx.Conn
	span *span

	key1 [1]keys.Key // the argument of a one-key call (see oneKey)
	sp   span        // what span points to
	tk   ticket      // the call's place in the local queue
	w    serverWait  // the first attempt's lock wait
	bw   boundWait   // the bound of the call's wait (waitCtx)
}

// boundWait bounds a call's whole wait: a Try call's wait for a connection
// (Locker.tryConnWait), a blocking call's wait under its timeout
// (Options.Timeout, Config.LockTimeout). It is a context that ends with
// context.DeadlineExceeded once the bound has passed, or when ctx ends:
// context.WithTimeout without the runtime timer of its own, which woke
// Go's network poller once per call (an eventfd write and a woken thread:
// issue 19, BENCHMARKS.md "where the time goes"); the bound rides on the
// timer internal/cutoff shares between every bound of the process. It
// lives in the call's state and must not move once started; a zero one
// that was never started may be stopped.
//
// A context derived from it (by the library, a pool hook, a tracer) ends
// with context.DeadlineExceeded at the bound too, as one derived from a
// context.WithTimeout does: the context package hangs a child directly on
// the cancelCtx it finds by Value, and hands it that cancelCtx's error,
// which for done, cancelled at the bound, would be context.Canceled. So
// Value does not show done's cancelCtx: a child goes through AfterFunc,
// and takes this context's Err (it ends just after, in a goroutine of its
// own, as the child of any context not the context package's does); context.Cause reports Err, or ctx's own
// cause once ctx has ended.
type boundWait struct {
	done     context.Context // context.WithCancel(ctx): Done, ctx's values
	cancel   context.CancelFunc
	parent   context.Context
	deadline time.Time
	reason   atomic.Int32 // why done ended, once known: reasonExpired, reasonStopped, reasonParent
	bound    cutoff.Bound
}

// Why a boundWait ended: the first reason recorded stands, so that Err and
// context.Cause never change once reported.
const (
	reasonNone    int32 = iota
	reasonExpired       // the bound passed
	reasonStopped       // the call's wait is over
	reasonParent        // ctx ended
)

// why returns why w ended (reasonNone while it has not): the reason stop or
// Expire recorded before ending it, else ctx's end, recorded now.
func (w *boundWait) why() int32 {
	if w.done.Err() == nil {
		return reasonNone
	}
	w.reason.CompareAndSwap(reasonNone, reasonParent)
	return w.reason.Load()
}

// start begins the bound of d on a zero boundWait and returns it.
func (w *boundWait) start(ctx context.Context, d time.Duration) context.Context {
	w.done, w.cancel = context.WithCancel(ctx)
	w.parent, w.deadline = ctx, time.Now().Add(d)
	w.bound.StartExpiry(w, d)
	return w
}

// stop ends the bound; the context ends too (context.Canceled, as a
// context.WithTimeout's cancel leaves it). A boundWait never started is
// left alone.
func (w *boundWait) stop() {
	if w.cancel == nil {
		return
	}
	if w.done.Err() == nil {
		w.reason.CompareAndSwap(reasonNone, reasonStopped)
	}
	w.bound.End()
	w.cancel()
}

// Expire ends the context once the bound has passed (cutoff.Expirer),
// unless it has ended already.
func (w *boundWait) Expire() {
	if w.done.Err() == nil && w.reason.CompareAndSwap(reasonNone, reasonExpired) {
		w.cancel()
	}
}

// Deadline is the bound's, or ctx's when earlier.
func (w *boundWait) Deadline() (time.Time, bool) {
	if d, ok := w.parent.Deadline(); ok && d.Before(w.deadline) {
		return d, true
	}
	return w.deadline, true
}

// Done is closed once the bound has passed, ctx has ended or stop ran.
func (w *boundWait) Done() <-chan struct{} { return w.done.Done() }

// Err is nil while Done is open; then, for good, whatever ended it first:
// context.DeadlineExceeded for the bound, ctx's error for ctx, or
// context.Canceled once stopped.
func (w *boundWait) Err() error {
	switch w.why() {
	case reasonNone:
		return nil
	case reasonExpired:
		return context.DeadlineExceeded
	case reasonParent:
		return w.parent.Err()
	default:
		return context.Canceled
	}
}

// Value is ctx's, but for the context package's own key, which would find
// done's cancelCtx: nil, so that context.Cause reports Err, unless ctx
// ended it, whose cancelCtx then carries ctx's cause.
func (w *boundWait) Value(key any) any {
	v := w.done.Value(key)
	if v != any(w.done) {
		return v
	}
	if w.why() == reasonParent {
		return w.parent.Value(key)
	}
	return nil
}

// AfterFunc arranges for f to run, in its own goroutine, once the context
// has ended (see context.AfterFunc); the context package uses it for the
// contexts derived from this one.
func (w *boundWait) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(w.done, f) }

// oneKey returns the state of a one-key call and key as a slice inside it.
func oneKey(key keys.Key) (*acquired, []keys.Key) {
	a := &acquired{}
	a.key1[0] = key
	return a, a.key1[:]
}

// acquireSession waits for the turn and a connection of a's request, set
// by the call's entry point, and takes its keys at session level, filling
// the rest of a. On error nothing is held or pinned.
func (l *Locker) acquireSession(ctx context.Context, a *acquired) error {
	a.span = &a.sp
	l.initSpan(a.span, ctx, ScopeSession, a.s.all, a.shared, a.try)
	defer a.span.endCut(a.op)
	err := l.acquireSessionTraced(ctx, a)
	a.span.acquired(err)
	return err
}

// waitCtx returns the context that bounds a's wait (its connection, its
// turn, and for a blocking call the lock): a Try call's tryConnWait, a
// blocking call's a.timeout, both on the shared timer (no runtime timer of
// their own: boundWait); ctx when a blocking call has no timeout.
// a.bw.stop ends it.
func (l *Locker) waitCtx(ctx context.Context, a *acquired) context.Context {
	switch {
	case a.try:
		return a.bw.start(ctx, l.tryConnWait())
	case a.timeout > 0:
		return a.bw.start(ctx, a.timeout)
	default:
		return ctx
	}
}

func (l *Locker) acquireSessionTraced(ctx context.Context, a *acquired) error {
	wctx := l.waitCtx(ctx, a)
	defer a.bw.stop()
	return l.acquireSessionWithin(ctx, wctx, a)
}

// acquireSessionWithin is acquireSessionTraced within the call's wait bound
// wctx (see waitBound).
func (l *Locker) acquireSessionWithin(ctx, wctx context.Context, a *acquired) error {
	r := &a.request
	s, op := &r.s, r.op
	c, t, err := l.pinInto(wctx, r, &a.tk)
	if err != nil {
		return &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
	}
	defer t.leave()
	defer func() {
		if c != nil {
			// A statement panicked (a pgx tracer's or hook's panic): the
			// lock may have been granted. Destroying the connection ends
			// the session and whatever it holds; the panic goes on up.
			c.MarkDirty(errStatementPanicked)
			l.unpin(c)
		}
	}()
	w := &a.w
	for retried := false; ; retried = true {
		err = l.checkProxy(ctx, wctx, c, op, s.all)
		if err == nil {
			err = l.lockSession(ctx, wctx, c, r, w)
		}
		if err == nil {
			a.c, c = c, nil
			return nil
		}
		if retried || !diedIdle(ctx, wctx, c, err) {
			l.unpin(c)
			c = nil
			return err
		}
		w = &serverWait{} // the retry's wait: a serverWait is used once
		dead := c
		c = nil // repin unpins it
		if c, err = l.repin(wctx, dead); err != nil {
			return &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
		}
	}
}

// diedIdle reports whether c was found dead by a call whose contexts are
// still live, err being the call's failure: typically a pooled connection
// whose server went away while it sat idle (a restart, a failover,
// pg_terminate_backend, idle_session_timeout), which pgxpool does not check
// before handing it out unless it was idle for a second. A dead session
// holds no lock, so such a call is retried once on a fresh connection
// instead of failing. A session the server ended with an error of another
// class than 57P (operator intervention) died of the call's own statement,
// not idle: under exit_on_error a lock wait's 55P03 is FATAL, and the call
// fails with it (it was retried, as a lock timeout's bound ran out, and
// reported ErrNoConnection, or waited twice).
func diedIdle(ctx, wctx context.Context, c *pooltx.Conn, err error) bool {
	if !c.Conn().IsClosed() || ctx.Err() != nil || wctx.Err() != nil {
		return false
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) || strings.HasPrefix(pgErr.Code, "57P")
}

// lockSession takes the keys of r at session level on c, in r's mode and
// wait policy; wctx bounds the wait, using w, a zero serverWait. On any
// failure nothing stays held by c: the locks a failed or partly granted
// statement may have left are released, or c is marked dirty.
func (l *Locker) lockSession(ctx, wctx context.Context, c *pooltx.Conn, r *request, w *serverWait) error {
	s, op, shared, try := &r.s, r.op, r.shared, r.try
	if !try && wctx.Err() != nil {
		// Given up before the lock statement was sent: send nothing, so
		// that no cancel request races the statement (see waitFor).
		return &LockError{Op: op, Keys: s.all, Err: classify(ctx, context.Cause(wctx))}
	}
	w.ctx = ctx
	if !try {
		w.arrange(wctx, c.Conn().PgConn())
	} else {
		w.startTry(c.Conn().PgConn(), l.tryConnWait())
	}
	defer w.stop()

	falses := 0
	var err error
	if len(s.all) == 1 {
		// One key: one plain statement, cheaper on the client than a batch.
		timeout := ""
		if w.bound > 0 {
			timeout = formatTimeout(w.bound)
		}
		sql, args := s.one(sessionOp(try), shared, timeout)
		if try {
			var ok bool
			err = c.Conn().QueryRow(w.ctx, sql, args...).Scan(&ok)
			if err == nil && !ok {
				falses = 1
			}
		} else {
			_, err = c.Conn().Exec(w.ctx, sql, args...)
		}
	} else {
		var check func(pgx.Rows) error // void results: errors only
		if try {
			check = boolResults(&falses)
		}
		b := &pgx.Batch{}
		s.queue(b, sessionOp(try), shared, w.bound, check)
		err = c.Conn().SendBatch(w.ctx, b).Close()
	}
	w.stop() // no cancel request in flight from here on
	if try {
		err = w.endTry(ctx, err)
	}
	err = w.cut(err)
	if w.settle(c, err) {
		// c will be destroyed, which releases whatever it holds.
		if err == nil { // granted, but the wait had been given up
			err = context.Cause(wctx)
		}
		return &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
	}
	if err != nil {
		// The outcome is unknown: a lock may have been granted just before
		// the error (a cancel racing the grant), or a multi-key statement
		// may have taken some keys before failing.
		l.releaseAfterFailure(ctx, c)
		return &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
	}
	if falses > 0 {
		if falses < len(s.all) {
			l.releaseAfterFailure(ctx, c)
		} else {
			c.MarkClean() // every key refused: the statement left nothing
		}
		return &LockError{Op: op, Keys: s.all, Err: join(ErrNotAcquired, ctx.Err())}
	}
	if ctx.Err() != nil {
		// Granted, but the caller has gone: give it back now.
		err := l.unlockSession(ctx, c, r)
		return &LockError{Op: op, Keys: s.all, Err: join(classify(ctx, ctx.Err()), err)}
	}
	return nil
}

// releaseAfterFailure drops every session-level advisory lock c may hold
// after a failed lock statement, under a fresh bounded context: on a
// connection never lent, where only this package's statements ran (their
// settings are transaction-local), pg_advisory_unlock_all alone, which
// keeps the session's settings as the pool gave them out (a SET in
// AfterConnect included, which a reset before the connection's first
// Lend could not restore: pooltx has recorded nothing yet); otherwise
// pooltx's reset. If that is impossible, c is marked dirty so that it is
// destroyed.
func (l *Locker) releaseAfterFailure(ctx context.Context, c *pooltx.Conn) {
	if c.Conn().IsClosed() {
		c.MarkDirty(errors.New("advisory: connection closed during lock"))
		return
	}
	if !c.Lent() {
		// pgconn's simple protocol under the cleanup bound (pgx's would
		// refuse the statement under standard_conforming_strings off).
		if n, err := c.ExecBounded("SELECT pg_catalog.pg_advisory_unlock_all()", nil); err != nil || n != 1 {
			if err == nil {
				err = errors.New("advisory: pg_advisory_unlock_all did not answer")
			}
			c.MarkDirty(&pooltx.CleanupError{Step: "unlock", Err: err})
			return
		}
		c.MarkClean()
		return
	}
	cctx := cleanupBound(ctx, c)
	defer c.EndBound()
	_ = c.Reset(cctx) // a failure marks c dirty
}

// unlockSession releases the keys of r on c (in r's mode), in reverse order, under a
// fresh bounded context. On a connection that was lent to a callback
// (pooltx.Conn.Lend), pooltx's reset follows in the same round trip (any
// other session-level advisory lock dropped, identity, settings and session
// state restored); on one that ran only this package's statements (a
// handle, Hold, a lock given back at once, a callback's connection the
// callback sent nothing on: pooltx.Conn.Reclaim), the unlock is enough: those
// statements change nothing else in the session, and c is marked clean. A
// false unlock (the lock was not held) or a failure marks c dirty.
func (l *Locker) unlockSession(ctx context.Context, c *pooltx.Conn, r *request) error {
	s, shared := &r.s, r.shared
	falses := 0
	var err error
	switch {
	case !c.Lent():
		// Only our statements ran: unlock alone, as raw pgx would (the
		// prepared statement of pgx's cache, the shared cleanup bound
		// rather than a watched context or a timer of its own).
		cctx := cleanupBound(ctx, c)
		if len(s.all) == 1 {
			var held bool
			sql, args := s.one(kindUnlock, shared, "")
			err = c.Conn().QueryRow(cctx, sql, args...).Scan(&held)
			if err == nil && !held {
				falses = 1
			}
		} else {
			b := &pgx.Batch{}
			s.queue(b, kindUnlock, shared, 0, boolResults(&falses))
			err = c.Conn().SendBatch(cctx, b).Close()
		}
		c.EndBound()
		if err == nil && falses == 0 {
			c.MarkClean()
		}
	case len(s.all) == 1 || c.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol:
		// One key, or pgx's simple protocol (where a batch is one string
		// too, which pgx refuses to build under a client_encoding or
		// standard_conforming_strings the callback left): one
		// simple-protocol string, "unlock; reset", sent with pgconn (under
		// pooltx's cleanup bound: no context to watch).
		err = l.unlockResetString(ctx, c, r, &falses)
	default:
		// Several: the unlocks and the reset as one pipeline of pgx's
		// prepared statements (cheaper on the server than a string it
		// parses each time).
		cctx := cleanupBound(ctx, c)
		b := &pgx.Batch{}
		check := boolResults(&falses)
		answered := 0
		s.queue(b, kindUnlock, shared, 0, func(rows pgx.Rows) error {
			err := check(rows)
			if err == nil {
				answered++
			}
			return err
		})
		unlocks := b.Len()
		c.QueueReset(b)
		err = c.Conn().SendBatch(cctx, b).Close()
		c.EndBound()
		var pgErr *pgconn.PgError
		switch {
		case err != nil && answered == unlocks:
			l.resetFailed(ctx, c, r, err)
			err = nil
		case err != nil && answered == 0 && errors.As(err, &pgErr) && pgErr.Code == codeNoPreparedStatement && !c.Conn().IsClosed():
			// The lent code emptied the session's prepared statements
			// (DEALLOCATE ALL, DISCARD ALL), pgx's cached unlock among
			// them: nothing of the pipeline ran. The simple-protocol
			// string needs none (its reset then finds the probe gone,
			// where there is one, and the connection is destroyed).
			falses = 0
			err = l.unlockResetString(ctx, c, r, &falses)
		}
	}
	op := opName(kindUnlock, shared)
	if err != nil {
		cerr := &pooltx.CleanupError{Step: "unlock", Err: err}
		c.MarkDirty(cerr)
		if c.Conn().IsClosed() {
			// The session is gone (the server died, failed over or ended it, or
			// the network did and the bound closed the socket): PostgreSQL has
			// released the lock, or will as soon as it notices, at a moment the
			// caller cannot know, so another session may have held the key while
			// the caller thought it did. That is a lost lock, not a failed
			// cleanup.
			return &LockError{Op: op, Keys: s.all, Err: join(ErrLockLost, cerr)}
		}
		return &LockError{Op: op, Keys: s.all, Err: cerr}
	}
	if falses > 0 {
		c.MarkDirty(ErrNotHeld)
		return &LockError{Op: op, Keys: s.all, Err: ErrNotHeld}
	}
	return nil
}

// cleanupBound bounds the statements run on c until c.EndBound is called,
// by Config.CleanupTimeout from now (pooltx.Conn.BoundCleanup: no runtime
// timer of its own, no context to watch), and returns a context that keeps
// ctx's values but cannot be cancelled. It is pooltx.CleanupContext's
// contract at a lower price: pgx does not watch a context that cannot end.
// A statement cut short by the bound fails, and pgx closes the connection.
func cleanupBound(ctx context.Context, c *pooltx.Conn) context.Context {
	c.BoundCleanup()
	return context.WithoutCancel(ctx)
}

// unlockResetString unlocks r's keys on c and resets the session with one
// simple-protocol string (keySet.unlockResetSQL), setting *falses to the
// number of unlocks that answered false. A reset that fails after the
// unlocks answered is resetFailed's.
func (l *Locker) unlockResetString(ctx context.Context, c *pooltx.Conn, r *request, falses *int) error {
	n, answered, err := execUnlockReset(c, r.s.unlockResetSQL(c, r.shared), len(r.s.all) > 1)
	if err == nil {
		c.MarkClean() // the whole string ran: the reset included
	}
	if answered {
		*falses = n
		if err != nil {
			l.resetFailed(ctx, c, r, err)
			err = nil
		}
	}
	return err
}

// resetFailed handles a reset that failed after every unlock had answered
// (a session statement_timeout that DISCARD TEMP outlasted, another
// session's pg_cancel_backend or pg_terminate_backend): the keys were held
// until the unlocks released them, which the unlocks' answers tell (false
// answers still make ErrNotHeld), so the call's outcome is fn's, as with
// the reset after WithXactLock's COMMIT or pooltx.WithConn's work. The
// connection is destroyed, and the failure logged at Warn as a failed
// cleanup; the caller drops err.
func (l *Locker) resetFailed(ctx context.Context, c *pooltx.Conn, r *request, err error) {
	cerr := &pooltx.CleanupError{Step: "reset", Err: err}
	c.MarkDirty(cerr)
	if l.log.Enabled(ctx, slog.LevelWarn) {
		l.log.WarnContext(ctx, "advisory: reset after unlock failed; connection destroyed", "keys", keyStrings(r.s.all), "err", cerr)
	}
}

// execUnlockReset runs the string of keySet.unlockResetSQL on c, bounded
// by the cleanup timeout, and reports how many unlocks answered false
// (answered: the unlock completed, whatever came after it; many: the
// string is unlockManyResetSQL's, whose first row counts the falses). Any
// error, or fewer results than the unlock and the pooltx.Conn.ResetCount
// statements of the reset, is returned.
func execUnlockReset(c *pooltx.Conn, sql string, many bool) (falses int, answered bool, err error) {
	rows, parsed := 0, false
	results, err := c.ExecBounded(sql, func(v [][]byte) {
		if rows == 0 && len(v) == 1 && v[0] != nil { // the first row is the unlock's
			switch {
			case !many:
				parsed = true
				if string(v[0]) != "t" {
					falses = 1
				}
			default:
				if n, perr := strconv.Atoi(string(v[0])); perr == nil {
					falses, parsed = n, true
				}
			}
		}
		rows++
	})
	if want := 1 + c.ResetCount(); err == nil && results != want {
		err = fmt.Errorf("advisory: unlock and reset answered %d results of %d", results, want)
	}
	answered = results >= 1 && parsed
	if err == nil && !parsed {
		err = errors.New("advisory: the unlock's answer could not be read")
	}
	return falses, answered, err
}

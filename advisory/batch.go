package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgxlock/pgxlock/internal/sentcheck"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// WithXactLockBatch runs the statements of b in one transaction that holds
// every key of ks (sorted and de-duplicated, as for WithXactLockAll), all in
// one round trip: BEGIN, the wait's lock_timeout, the lock statement(s), the
// lock_timeout set back to the connection's default, b's statements in
// order, COMMIT, and pooltx's reset of the session travel as one pipeline.
// It is the form of "lock the tenant, write a few rows, commit" that costs
// what the same pipeline written by hand costs; WithXactLock costs two round
// trips plus one per statement of its callback.
//
// It takes a *pgx.Batch, as pgx.Conn.SendBatch does, because that is how
// pgx sends statements whose text and arguments are known up front, and how
// their results are read: attach readers with QueuedQuery.Query, QueryRow
// or Exec; they run in order as the results arrive. b is read, not changed
// or sent: it may be reused.
//
// b must not begin, end or leave a transaction itself: its statements must
// run inside the one the call opens, which holds the keys. A batch that
// would is refused with ErrInvalid before anything of it is sent. The check
// reads b as pgx will send it on the call's connection: in that
// connection's DefaultQueryExecMode, and with a pgx.QueryRewriter (such as
// pgx.NamedArgs) applied first, once: the call sends the rewritten
// statements the check read. Refused in every mode: an empty string, and a
// statement that begins, after white space, comments and semicolons, with
// BEGIN, START, COMMIT, END, ABORT, PREPARE TRANSACTION, or ROLLBACK other
// than ROLLBACK [WORK | TRANSACTION] TO (AND CHAIN and PREPARED forms
// included).
//
// In the extended protocol (every mode but pgx.QueryExecModeSimpleProtocol)
// each string of b is one statement: PostgreSQL fails a string of several
// (SQLSTATE 42601, the batch is not committed), so only its leading
// keywords are read; a string whose first word starts no PostgreSQL
// statement is refused too, since pgx runs the statement prepared
// (pgx.Conn.Prepare) under a name equal to the string in its place, whose
// text the check cannot read. That is the check's one blind spot: a
// statement prepared on the connection under a name that reads as a
// statement (say "SELECT 'checkpoint'" prepared as COMMIT) runs in place of
// the string, unseen; pgx lists no prepared names, and asking the server
// would cost a round trip. Do not give prepared statements such names. A
// pgx.QueryRewriter among the arguments a rewriter returned is refused
// (pgx would rewrite again). In the simple protocol pgx joins the strings
// into one text: each is split into statements as PostgreSQL's lexer
// splits it and each statement is checked; also refused there is a string
// that leaves a literal, quoted identifier, dollar quote or /* comment open
// (it would go on into the next string), a number or $n directly followed
// by a letter or an underscore (1e'x', 0x1F: PostgreSQL versions read these
// differently), a string whose $n parameters do not match its arguments
// (pgx would refuse it, before sending anything), and, when the string has
// arguments, a $n that PostgreSQL does not read as a parameter (inside a
// literal, an identifier, a comment) or a parameter right after a string
// literal (pgx substitutes arguments with a lexer of its own). A CREATE
// FUNCTION whose BEGIN ATOMIC body ends with END after a semicolon is
// refused as well there (a dollar-quoted body is not).
//
// SAVEPOINT, RELEASE [SAVEPOINT] and ROLLBACK [WORK | TRANSACTION] TO
// [SAVEPOINT] are fine: the keys, taken before any savepoint of b, stay
// held. No other statement ends the transaction: a COMMIT or ROLLBACK run
// by a procedure (CALL) or a DO block fails inside it (SQLSTATE 2D000), as
// do statements that cannot run in a transaction block (VACUUM, CREATE
// DATABASE), and nothing of b is kept.
//
// All or nothing: when a lock cannot be taken or any statement of b fails,
// the server skips everything after it, COMMIT included, and the
// transaction is rolled back (one more round trip, with the reset): nothing
// of b is kept and every key is released. A nil error means committed.
//
// Readers run as the results arrive, when the whole pipeline, COMMIT
// included, has been sent (the server sends its answers at the end, unless
// they outgrow its output buffer), so a reader's error cannot stop the
// COMMIT: it is returned as a *ReaderError, and the transaction was
// committed all the same. Readers see
// results before the call knows whether COMMIT succeeded: act on what they
// read only when the call returns nil or a *ReaderError. (Sending COMMIT
// after the readers would let them veto it, at the cost of a second round
// trip; WithXactLock is that form.) When a statement fails, its failure is
// the call's error: the readers after it are not called, and the errors of
// those before it are not reported (what they read was rolled back). A
// reader that panics destroys the connection; the panic is re-raised.
//
// ctx governs the wait for a connection and the whole pipeline: when ctx
// ends while the pipeline runs, a cancel request stops the statement that
// is running (a lock wait, or one of b's) and the transaction is rolled
// back; if the server does not stop within half a second the connection is
// closed and destroyed. A pipeline that had already committed when the
// cancellation arrived returns nil. The call's timeout (Options.Timeout,
// Config.LockTimeout) and ctx's deadline bound the lock wait on the server
// (lock_timeout, all keys together, as for WithXactLockAll); b's statements
// run with the session's own lock_timeout as pooltx first found it (see
// WithXactLock). So once the pipeline is
// sent, only ctx bounds the call on the client: a server or network that
// stops answering holds it until ctx ends (give ctx a deadline; the call
// then returns pooltx.ErrCommitUnknown within half a second of it). After the call the pooled
// connection holds no advisory lock and no setting b changed (a SET,
// SET search_path included, or a session-level lock): the reset rides in
// the pipeline after COMMIT, or after the rollback.
//
// It returns:
//   - nil: committed; every reader returned nil;
//   - a *ReaderError: committed; a reader returned an error;
//   - a *LockError matching ErrLockTimeout, ErrDeadlock, ErrTooManyLocks,
//     ErrNoConnection or ErrInvalid (nil b, bad keys, a batch the check
//     above refuses), or holding ctx's error when ctx was cancelled during
//     the wait: nothing of b ran to completion and nothing is kept;
//   - an error matching pooltx.ErrNotCommitted: a statement of b, or
//     COMMIT, failed (its *pgconn.PgError is in the chain), or pgx refused
//     b before running any of it (a pgx.ErrPreprocessingBatch: a statement
//     that does not parse, an argument it cannot encode; in the simple
//     protocol, where the server parses the whole pipeline before running
//     any of it, the parser's error: a syntax error, SQLSTATE 42601, or
//     another such as 42P20), or ctx ended
//     while the locks were held (ctx's error is in the chain); nothing is
//     kept;
//   - an error matching pooltx.ErrCommitUnknown: the pipeline was sent and
//     no answer came (the connection failed, or it was closed because the
//     server did not stop after a cancel request): the transaction may or
//     may not have committed; the connection was destroyed. It is also what
//     a refusal by pgx that is not a pgx.ErrPreprocessingBatch reads as (an
//     argument pgx cannot encode in the Exec or simple protocol modes;
//     in the simple protocol a DSN with standard_conforming_strings off or
//     a client_encoding other than UTF8, which pgx refuses, or a string pgx
//     lexes otherwise than PostgreSQL): then nothing was sent, but the call
//     cannot tell, and destroys the connection.
func (l *Locker) WithXactLockBatch(ctx context.Context, ks []keys.Key, opts *Options, b *pgx.Batch) error {
	return l.withXactBatch(ctx, ks, opts, false, b)
}

// TryWithXactLockBatch is WithXactLockBatch without waiting (b is checked
// as there, and refused with ErrInvalid alike): when a key is
// busy, the lock statement fails on the server, so that none of b's
// statements runs and the transaction is rolled back, and the error is a
// *LockError matching ErrNotAcquired. (pg_try_advisory_xact_lock answers
// false rather than failing, and in a pipeline the statements after it
// would run all the same; the call's lock statement divides by the answer,
// so a false one fails with SQLSTATE 22012, division by zero, whose
// *pgconn.PgError stays in the chain. No schema object is created.)
func (l *Locker) TryWithXactLockBatch(ctx context.Context, ks []keys.Key, opts *Options, b *pgx.Batch) error {
	return l.withXactBatch(ctx, ks, opts, true, b)
}

// ReaderError reports that a reader attached to a statement of the batch
// of WithXactLockBatch returned an error. The transaction had been
// committed by then: a reader cannot undo it.
type ReaderError struct {
	// Index is the statement's position in the caller's batch (0-based).
	Index int
	// Err is the reader's error.
	Err error
}

// Error renders "advisory: committed, but the reader of statement <i>
// failed: <err>".
func (e *ReaderError) Error() string {
	return fmt.Sprintf("advisory: committed, but the reader of statement %d failed: %v", e.Index, e.Err)
}

// Unwrap returns the reader's error.
func (e *ReaderError) Unwrap() error { return e.Err }

// tryAbortSQL holds the lock statements of TryWithXactLockBatch, indexed by
// shared mode: pg_try_advisory_xact_lock whose false answer fails the
// statement (1 / 0), so that the pipeline stops there. Keys travel as bind
// parameters; the function is volatile, so the division runs per row, never
// at plan time. For several keys the order is the keySet's (see sql.go).
var tryAbortSQL [2]struct{ one1, one2, many1, many2 string }

// codeDivisionByZero is how a refused key of TryWithXactLockBatch fails.
const codeDivisionByZero = "22012"

func init() {
	for shared := range 2 {
		fn := funcNames[kindTryXactLock]
		if shared == 1 {
			fn += "_shared"
		}
		t := &tryAbortSQL[shared]
		t.one1 = fmt.Sprintf("SELECT 1 OPERATOR(pg_catalog./) %s($1)::pg_catalog.int4", fn)
		t.one2 = fmt.Sprintf("SELECT 1 OPERATOR(pg_catalog./) %s($1, $2)::pg_catalog.int4", fn)
		t.many1 = fmt.Sprintf("SELECT 1 OPERATOR(pg_catalog./) %s(k)::pg_catalog.int4 FROM %s ORDER BY n", fn, sqlInts)
		t.many2 = fmt.Sprintf("SELECT 1 OPERATOR(pg_catalog./) %s(a, b)::pg_catalog.int4 FROM %s ORDER BY n", fn, sqlPairs)
	}
}

// queueTryAbort adds the lock statements of a Try batch call for s to b.
func (s *keySet) queueTryAbort(b *pgx.Batch, shared bool) {
	t := &tryAbortSQL[b2i(shared)]
	if len(s.all) == 1 {
		if v, ok := s.all[0].Int64(); ok {
			b.Queue(t.one1, v)
		} else {
			a, c, _ := s.all[0].Pair()
			b.Queue(t.one2, a, c)
		}
		return
	}
	if len(s.ints) > 0 {
		b.Queue(t.many1, s.ints)
	}
	if len(s.as) > 0 {
		b.Queue(t.many2, s.as, s.bs)
	}
}

func (l *Locker) withXactBatch(ctx context.Context, ks []keys.Key, opts *Options, try bool, b *pgx.Batch) error {
	// The call's state on the heap: what it asks for, and its wait's bound.
	call := &struct {
		r      request
		bw     boundWait
		locked bool // the current attempt's locks answered (batchAttempt.lockedOut)
	}{}
	r := &call.r
	r.set(l, xactOp(try), opts, try)
	shared, op := r.shared, r.op
	if b == nil {
		return &LockError{Op: op, Keys: ks, Err: invalid("nil batch")}
	}
	var err error
	if r.s, err = newKeySet(ks, l.cfg.MaxKeys); err != nil {
		return &LockError{Op: op, Keys: ks, Err: err}
	}
	s := &r.s
	sp := l.startSpan(ctx, ScopeXact, s.all, shared, try)
	defer sp.endCut(op) // a panic before the reader's guard below (in the pin, say)
	wctx := l.waitBound(ctx, &call.bw, opts, try)
	defer call.bw.stop()
	c, t, err := l.pin(wctx, r)
	if err != nil {
		err = &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
		sp.acquired(err)
		return err
	}
	defer func() { l.unpin(c) }()
	defer t.leave() // idempotent

	// A reader that panics (or exits its goroutine) unwinds past the
	// tracing below: the acquisition, and the lock where it was granted,
	// end here, once each, as a callback's panic ends them in WithXactLock.
	spanEnded := false
	defer func() {
		if spanEnded {
			return
		}
		if call.locked {
			sp.acquired(nil)
			sp.released(errors.New("batch reader panicked; connection destroyed"))
			return
		}
		sp.acquired(&LockError{Op: op, Keys: s.all, Err: errors.New("advisory: a batch reader panicked; connection destroyed")})
	}()

	for retried := false; ; retried = true {
		// The check reads b as pgx will send it on this connection (its
		// QueryExecMode, its QueryRewriters): see batchsql.go.
		spanEnded = false // a retry: the span is open again until the attempt returns
		checked, i, why, found := checkBatch(ctx, c.Conn(), b)
		if found {
			spanEnded = true
			err = &LockError{Op: op, Keys: s.all, Err: invalid("statement %d of the batch is refused: %s: the call's transaction must hold the keys until its own COMMIT", i, why)}
			sp.acquired(err)
			return err
		}
		call.locked = false
		x := batchAttempt{l: l, ctx: ctx, wctx: wctx, c: c, s: s, op: op, shared: shared, try: try, checked: checked, lockedOut: &call.locked}
		err = x.run(b)
		spanEnded = true // every path below ends the span itself
		t.leave()        // the lock statement is over, whatever its outcome
		if x.locked {
			sp.acquired(nil)
			sp.released(nil)
			return err
		}
		if retried || !diedIdle(ctx, wctx, c, err) || !nothingRan(err) {
			if _, isLock := err.(*LockError); isLock {
				sp.acquired(err)
			} else {
				sp.acquired(&LockError{Op: op, Keys: s.all, Err: err})
			}
			return err
		}
		// The pooled connection was dead before we used it: the server
		// failed the pipeline before the lock's answer (so before COMMIT),
		// or nothing was sent. Once more, on a fresh one.
		if c, err = l.repin(wctx, c); err != nil {
			spanEnded = true
			err = &LockError{Op: op, Keys: s.all, Err: classify(ctx, err)}
			sp.acquired(err)
			return err
		}
	}
}

// nothingRan reports whether err, from a pipeline whose lock statement got
// no answer, shows that nothing of it is kept: the server said so itself
// (its answers come in order, so an error before the lock's answer came
// before COMMIT's: a backend that was terminated while idle answers with
// its FATAL error), or nothing was sent.
func nothingRan(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
}

// batchAttempt is one try of a batch call on one connection.
type batchAttempt struct {
	l         *Locker
	ctx, wctx context.Context
	c         *pooltx.Conn
	s         *keySet
	op        string
	shared    bool
	try       bool
	checked   []pgx.QueuedQuery // the caller's statements, as checkBatch read them
	restore   textArg           // the session's lock_timeout (queueRestoreTimeout)

	// Set by the result handlers, in pipeline order.
	txAfter   byte         // the connection's transaction status once the pipeline was read
	locked    bool         // every lock statement answered: the keys were held
	lockedOut *bool        // set with locked, for the call's panic path (withXactBatch)
	committed bool         // COMMIT answered COMMIT
	readErr   *ReaderError // the first reader error
	stmtErr   error        // the first failure of a statement of b (failed1)
}

// run sends the pipeline, reads it back and settles the connection: a
// transaction left open is rolled back with the reset; a connection in
// doubt is marked dirty.
func (x *batchAttempt) run(b *pgx.Batch) error {
	ctx, c := x.ctx, x.c
	if !x.try && x.wctx.Err() != nil {
		// Given up before anything was sent: send nothing.
		return &LockError{Op: x.op, Keys: x.s.all, Err: classify(ctx, context.Cause(x.wctx))}
	}
	// b's statements are the caller's: the full reset follows them.
	pg := c.Lend(ctx).PgConn()
	if derr := c.Dirty(); derr != nil {
		// pooltx could not ready the connection (its first Lend failed,
		// and closed it): nothing was sent.
		return &LockError{Op: x.op, Keys: x.s.all, Err: noConnection(derr)}
	}
	// One watcher covers the whole pipeline: ctx's end (cancellation or
	// deadline) sends a cancel request. The call's timeout is enforced by
	// the server alone (lock_timeout), as it bounds only the lock wait: the
	// results arrive together at the end, so the client cannot tell the
	// wait from b's statements.
	w := x.l.waitFor(cancelView{ctx}, pg)
	defer w.stop()
	// The wait's bound becomes the transaction's lock_timeout between the
	// save and the restore; several keys share it (see keySet.queue).
	timeout, bound := "", time.Duration(0)
	if d, ok := x.wctx.Deadline(); ok && !x.try {
		d := max(time.Until(d), time.Millisecond)
		timeout = formatTimeout(d)
		if len(x.s.all) > 1 {
			bound = d
		}
	}

	p := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, b.Len()+8)}
	p.Queue("begin")
	if timeout != "" {
		p.Queue(sqlSetTimeout, timeout)
	}
	if x.try {
		x.s.queueTryAbort(p, x.shared)
	} else {
		x.s.queue(p, kindXactLock, x.shared, bound, nil)
	}
	p.QueuedQueries[p.Len()-1].Exec(func(pgconn.CommandTag) error { x.locked, *x.lockedOut = true, true; return nil })
	if timeout != "" {
		queueRestoreTimeout(p, c, &x.restore)
	}
	x.queueCallers(p)
	p.Queue("commit").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() != "COMMIT" {
			return pgx.ErrTxCommitRollback // the transaction had failed: nothing kept
		}
		x.committed = true
		return nil
	})
	c.QueueReset(p) // marks c clean once the reset's last statement has answered

	// A reader that panics (or exits its goroutine) leaves the pipeline
	// half read: the connection is destroyed and the panic goes on.
	panicked := true
	defer func() {
		if panicked {
			c.MarkDirty(errors.New("advisory: a batch reader panicked"))
		}
	}()
	open := !pg.IsClosed()
	err := sentcheck.Check(c.Conn().SendBatch(w.ctx, p).Close(), open, pg)
	x.txAfter = pg.TxStatus()
	panicked = false
	w.stop()
	w.settle(c, err) // a cancel request that may be pending makes c unfit for the pool
	if err == nil {
		if x.readErr != nil {
			return x.readErr
		}
		return nil
	}
	if x.committed {
		// COMMIT answered; the reset after it did not: c is in doubt.
		c.MarkDirty(&pooltx.CleanupError{Step: "reset", Err: err})
		if x.readErr != nil {
			return x.readErr
		}
		return nil
	}
	return x.failed(err)
}

// failed settles c after a pipeline that did not commit (or may have) and
// returns the call's error for err, the pipeline's.
func (x *batchAttempt) failed(err error) error {
	ctx, c := x.ctx, x.c
	var pre pgx.ErrPreprocessingBatch
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pre):
		// pgx refused b before executing anything: a statement that does
		// not parse (prepared, and synced, before any runs), or an argument
		// it cannot encode (found before the pipeline is flushed; pgx then
		// closes the connection, unsent), or the preparation got no
		// answer (a silent server: cut at ctx's end, whose error is kept).
		_ = c.Rollback(ctx) // a closed connection: marked dirty
		return fmt.Errorf("%w: %w", pooltx.ErrNotCommitted, join(err, ctx.Err()))
	case errors.As(err, &pgErr) || pgconn.SafeToRetry(err):
		// The server failed a statement before COMMIT answered (an answer
		// to COMMIT would have come before it): the server skipped the rest
		// and rolled back, or holds an aborted transaction; or nothing was
		// sent. Roll back whatever is open, with the reset.
		_ = c.Rollback(ctx)
	default:
		// Sent, and no answer: the pipeline may have run to its COMMIT.
		c.MarkDirty(&pooltx.CleanupError{Step: "commit", Err: err})
		return join(fmt.Errorf("%w: %w", pooltx.ErrCommitUnknown, err), ctx.Err())
	}
	if !x.locked {
		if x.try && pgErr != nil && pgErr.Code == codeDivisionByZero {
			return &LockError{Op: x.op, Keys: x.s.all, Err: join(ErrNotAcquired, pgErr, ctx.Err())}
		}
		if pgErr != nil && x.txAfter == 'I' && !c.Conn().IsClosed() && c.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
			// In the simple protocol the pipeline is one text, which the
			// server parses whole before it runs any of it: it refused the
			// text and no transaction began (a syntax error, 42601, or
			// another the parser raises, such as 42P20; a failure after
			// BEGIN leaves the transaction aborted, 'E'), so a statement of
			// b (the library's own parse) was refused, and nothing ran.
			return fmt.Errorf("%w: %w", pooltx.ErrNotCommitted, err)
		}
		return &LockError{Op: x.op, Keys: x.s.all, Err: classify(ctx, err)}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", pooltx.ErrNotCommitted, join(err, cerr))
	}
	return fmt.Errorf("%w: %w", pooltx.ErrNotCommitted, err)
}

// queueCallers appends copies of b's statements to p, each reader wrapped
// so that its error is kept as a *ReaderError and does not stop pgx from
// reading the rest (COMMIT's answer included). A statement's own failure
// (the server's error) stops the batch, whatever its reader does: its error
// is the batch's, and the readers after it are not called. pgx alone does
// not stop there in the Exec and simple protocol modes (for a statement
// without a reader its Close goes on to the next statement, whose reader
// reads the failure again), nor for a reader that does not read its result
// to the end. So each reader reads through stmtResults, and when it returns
// its result is read to the end (or read at all, if it did not) and the
// statement's outcome recorded (failed1).
//
// The copies are checkBatch's: each as the check read it, its
// QueryRewriter already applied, so that pgx sends exactly what was
// checked (a rewriter is called once).
func (x *batchAttempt) queueCallers(p *pgx.Batch) {
	qs := x.checked
	var execOne func(pgx.BatchResults) error // shared by the statements without a reader
	for i := range qs {
		fn := qs[i].Fn
		if fn == nil {
			if execOne == nil {
				execOne = x.execOne
			}
			qs[i].Fn = execOne
			p.QueuedQueries = append(p.QueuedQueries, &qs[i])
			continue
		}
		qs[i].Fn = func(br pgx.BatchResults) error {
			if x.stmtErr != nil {
				return x.stmtErr // skipped by the server after the failure
			}
			r := &stmtResults{BatchResults: br, x: x}
			err := fn(r)
			r.finish()
			if x.stmtErr != nil {
				return x.stmtErr
			}
			if err != nil && x.readErr == nil {
				x.readErr = &ReaderError{Index: i, Err: err}
			}
			return nil
		}
		p.QueuedQueries = append(p.QueuedQueries, &qs[i])
	}
}

// execOne reads the result of a statement of b that has no reader, and
// stops the batch at its failure (or at an earlier one).
func (x *batchAttempt) execOne(br pgx.BatchResults) error {
	if x.stmtErr != nil {
		return x.stmtErr // skipped by the server after the failure
	}
	_, err := br.Exec()
	x.failed1(err)
	return err
}

// failed1 records err as the failure of a statement of b when it is the
// server's error (or the connection's: nothing more can be read), and the
// first.
func (x *batchAttempt) failed1(err error) {
	if err == nil || x.stmtErr != nil {
		return
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || x.c.Conn().IsClosed() {
		x.stmtErr = err
	}
}

// stmtResults is what a reader of b reads its statement's result from: the
// batch's results, through rows whose Scan errors stay the reader's
// (stmtRows). A reader that reads more than its own result reads its
// successors' (as with pgx alone); the wrapper follows the last.
type stmtResults struct {
	pgx.BatchResults
	x    *batchAttempt
	read bool      // the reader called Exec, Query or QueryRow
	rows *stmtRows // the rows Query or QueryRow gave it
}

func (r *stmtResults) Exec() (pgconn.CommandTag, error) {
	r.read = true
	tag, err := r.BatchResults.Exec()
	r.x.failed1(err)
	return tag, err
}

func (r *stmtResults) Query() (pgx.Rows, error) {
	r.read = true
	rows, err := r.BatchResults.Query()
	r.x.failed1(err)
	r.rows = &stmtRows{Rows: rows}
	return r.rows, err
}

func (r *stmtResults) QueryRow() pgx.Row {
	rows, _ := r.Query()
	return stmtRow{rows.(*stmtRows)}
}

// finish reads the statement's result to the end once its reader returned
// (or reads it, if the reader did not) and records its failure.
func (r *stmtResults) finish() {
	switch {
	case !r.read:
		_, err := r.BatchResults.Exec()
		r.x.failed1(err)
	case r.rows != nil:
		r.rows.Rows.Close()
		r.x.failed1(r.rows.Rows.Err())
	}
}

// stmtRows are pgx's rows with Scan and Values done apart: pgx's own record a
// scan error (a column into a wrong type) as the rows' error, which its
// pipelined batch then reports for every statement after it, COMMIT
// included, so a reader's mistake on a statement that ran read as a COMMIT
// without an answer (and in the other modes it hid the statement's own
// failure). Here a scan or decode error is the reader's alone: Err returns
// it, Next stops, and the server's answers are read on as usual.
type stmtRows struct {
	pgx.Rows
	err error // the reader's scan error
}

func (r *stmtRows) Next() bool { return r.err == nil && r.Rows.Next() }

func (r *stmtRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *stmtRows) Scan(dest ...any) error {
	if err := r.Err(); err != nil {
		return err
	}
	if r.Rows.Conn() == nil {
		return errors.New("advisory: no row to scan")
	}
	var err error
	if rs, ok := rowScanner(dest); ok {
		err = rs.ScanRow(r)
	} else {
		err = r.scan(dest)
	}
	if err != nil {
		r.err = err
	}
	return err
}

// rowScanner returns dest's one destination when it scans a whole row
// itself, as pgx's Scan lets it.
func rowScanner(dest []any) (pgx.RowScanner, bool) {
	if len(dest) != 1 {
		return nil, false
	}
	rs, ok := dest[0].(pgx.RowScanner)
	return rs, ok
}

// Values is pgx's Values with a decode error kept as the reader's (see
// Scan): pgx's own records it as the rows' error, as its Scan does.
func (r *stmtRows) Values() ([]any, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	conn := r.Rows.Conn()
	if conn == nil {
		return nil, errors.New("advisory: no row to read")
	}
	m, fds, raw := conn.TypeMap(), r.Rows.FieldDescriptions(), r.Rows.RawValues()
	values := make([]any, 0, len(fds))
	for i := range fds {
		buf, fd := raw[i], &fds[i]
		if buf == nil {
			values = append(values, nil)
			continue
		}
		if dt, ok := m.TypeForOID(fd.DataTypeOID); ok {
			v, err := dt.Codec.DecodeValue(m, fd.DataTypeOID, fd.Format, buf)
			if err != nil {
				r.err = err
				return nil, err
			}
			values = append(values, v)
			continue
		}
		switch fd.Format {
		case pgx.TextFormatCode:
			values = append(values, string(buf))
		case pgx.BinaryFormatCode:
			values = append(values, append([]byte(nil), buf...))
		default:
			r.err = errors.New("unknown format code")
			return nil, r.err
		}
	}
	return values, nil
}

func (r *stmtRows) scan(dest []any) error {
	return pgx.ScanRow(r.Rows.Conn().TypeMap(), r.Rows.FieldDescriptions(), r.Rows.RawValues(), dest...)
}

// stmtRow is QueryRow's row over stmtRows, read as pgx reads its own: the
// first row, then the rows closed and their error returned.
type stmtRow struct{ rows *stmtRows }

func (r stmtRow) Scan(dest ...any) error {
	rows := r.rows
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			rows.Close()
			return errors.New("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return err
	}
	if !rows.Next() {
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		rows.Close()
		return err
	}
	rows.Close()
	return rows.Err()
}

// cancelView is ctx without its deadline, ended as cancelled whichever way
// ctx ends: a watcher on it (waitFor) sends a cancel request when ctx's
// deadline passes too, where for a lock wait it leaves that to the
// server's lock_timeout. Its Done channel is ctx's, so context.AfterFunc
// registers on ctx directly, with no goroutine.
type cancelView struct{ context.Context }

func (cancelView) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c cancelView) Err() error {
	if c.Context.Err() != nil {
		return context.Canceled
	}
	return nil
}

package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/sentcheck"
	"github.com/pgxlock/pgxlock/pooltx"
)

// TryLockTimeout bounds how long a non-blocking call (TryAcquire, TryDo,
// TryAcquireAll, TryUpgrade) waits for a row lock held by someone else, such as an unrelated transaction that updated the leased row
// or the resource's counter row and has not committed. When it runs out the
// call reports the lease as busy (ErrNotAcquired, with the server's 55P03
// error in the chain) instead of waiting for that transaction.
const TryLockTimeout = 100 * time.Millisecond

// The statements that frame every lease statement (see exec). They are
// constants: nothing the caller passes reaches them.
const (
	// READ COMMITTED whatever default_transaction_isolation says: the
	// compare-and-swap statements rely on a blocked UPDATE re-checking its
	// WHERE clause against the row that committed (EvalPlanQual), which
	// REPEATABLE READ and SERIALIZABLE replace by a serialization failure
	// (40001). READ WRITE whatever default_transaction_read_only says.
	beginSQL = "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE"
	// TimeZone UTC for the transaction only: a column lease's locked-at
	// column may be a timestamp without time zone, into which now() is
	// written, and against which now() is compared, in the session's
	// TimeZone. UTC for everyone makes every session agree; timestamptz
	// columns are unaffected.
	//
	// synchronous_commit at least local for the transaction only: with
	// synchronous_commit = off (from postgresql.conf, ALTER SYSTEM, the
	// database, the role, the DSN or the session) COMMIT returns before
	// the WAL is flushed, and a crash then loses acquisitions and releases
	// that had returned: tokens already handed out are handed out again,
	// released leases come back. Every other value (local, remote_write,
	// on, remote_apply) already waits for the local flush, and is kept as
	// it is, so synchronous standbys are waited for as configured.
	//
	// pg_catalog first on the search_path for the transaction only, ahead of
	// the session's own path: the statements that follow resolve built-in
	// functions, operators and types to pg_catalog's even where the session's
	// search_path lists a schema with look-alikes before pg_catalog, while the
	// tables and the types of the caller's columns still resolve through the
	// rest of the path. (A statement prepared under the session's path is
	// analysed again under this one, once: PostgreSQL's plan cache re-checks
	// the search_path at every execution.)
	//
	// The output styles pgx reads for the transaction only: in the Exec and
	// simple protocol modes results come as text, which pgx parses in
	// PostgreSQL's default styles only; under DateStyle = 'SQL, DMY' (or
	// German, Postgres) every acquisition failed to read its own timestamps,
	// under IntervalStyle = sql_standard an interval would, and
	// extra_float_digits below 1 rounds the float8 wait hints. ISO keeps the
	// session's day/month order, which only input of other forms reads.
	frameSQL = "SELECT pg_catalog.set_config('TimeZone', 'UTC', true), " + durableSQL + ", " + catalogFirstSQL + ", " + outputStylesSQL
	// outputStylesSQL sets the text output styles pgx parses (see frameSQL).
	outputStylesSQL = "pg_catalog.set_config('DateStyle', 'ISO', true), pg_catalog.set_config('IntervalStyle', 'postgres', true), " +
		"pg_catalog.set_config('extra_float_digits', '1', true)"
	// catalogFirstSQL puts pg_catalog first on the transaction's search_path.
	// (An empty search_path, as set_config('search_path', '', ...) leaves
	// it, becomes pg_catalog alone: "pg_catalog, " is not a valid list.)
	catalogFirstSQL = "pg_catalog.set_config('search_path', CASE WHEN pg_catalog.current_setting('search_path') OPERATOR(pg_catalog.=) '' THEN 'pg_catalog' " +
		"ELSE 'pg_catalog, ' OPERATOR(pg_catalog.||) pg_catalog.current_setting('search_path') END, true)"
	// durableSQL raises synchronous_commit = off to local, keeping any
	// other value.
	durableSQL = "pg_catalog.set_config('synchronous_commit', CASE WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN 'local' ELSE pg_catalog.current_setting('synchronous_commit') END, true)"
	commitSQL  = "COMMIT"
)

// frameTrySQL is frameSQL plus lock_timeout = TryLockTimeout; the manager
// forms add row_security = off (see managerTables).
var (
	frameTrySQL        = fmt.Sprintf("%s, pg_catalog.set_config('lock_timeout', '%dms', true)", frameSQL, TryLockTimeout.Milliseconds())
	frameManagerSQL    = frameSQL + rowSecurityOffSQL
	frameManagerTrySQL = frameTrySQL + rowSecurityOffSQL
)

// utf8SQL sets client_encoding to UTF8 for the transaction only. pgx sends
// every string as UTF-8 and reads every one as UTF-8, but does not set
// client_encoding: a session whose encoding is another (from ALTER ROLE ...
// SET client_encoding, the database's or the server's settings, a LATIN1
// database's default) has the server convert those bytes as if they were in
// that encoding, so two sessions with different encodings would read one
// resource name as two names, and both could hold "the" exclusive lease.
// Queued only where the connection's last reported client_encoding is not
// UTF8 (needsUTF8): no cost otherwise.
const utf8SQL = "SELECT pg_catalog.set_config('client_encoding', 'UTF8', true)"

// needsUTF8 reports whether pg's session runs in a client_encoding other
// than UTF8, from its last ParameterStatus (no round trip).
func needsUTF8(pg *pgconn.PgConn) bool { return pg.ParameterStatus("client_encoding") != "UTF8" }

// wait says how long a lease statement may wait for a row lock, and
// whether the statements read the lock-manager tables (managerTables).
type wait uint8

const (
	waitCtx wait = 0      // as long as ctx allows (and the session's lock_timeout)
	waitTry wait = 1 << 0 // TryLockTimeout, then 55P03

	// managerTables adds row_security = off to the frame, for the
	// transaction only: the lock manager decides from every holder row of
	// a resource, and a row-level security policy on its tables (one that
	// shows each role its own rows, say) would have each role decide from
	// the rows it may see, so two roles could both hold a resource
	// exclusively. With row_security off, a statement that a policy would
	// filter fails with 42501 instead; roles that bypass row security (the
	// tables' owner without FORCE ROW LEVEL SECURITY, superusers,
	// BYPASSRLS) are not affected. Column leases and fences keep row
	// security: their statements match one row by its key, and a row a
	// policy hides is one the caller may not lease.
	managerTables wait = 1 << 1
)

// rowSecurityOffSQL is managerTables' addition to the frame.
const rowSecurityOffSQL = ", pg_catalog.set_config('row_security', 'off', true)"

// exec runs the statements queue adds as one transaction, in one round trip:
//
//	BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE; <frame>; <statements>; COMMIT
//
// on a connection pinned through pooltx. The frame's settings are
// transaction-local (set_config(..., true)), so nothing is left on the
// connection when the transaction ends. ctx governs acquiring the connection
// and the round trip. If a statement fails, the server skips the rest and
// the transaction is left aborted: exec rolls it back under the call's
// clean-up bound (cleanupContext: cleanup from the first clean-up step of the
// call, shared with the give-backs that follow), or destroys the connection
// if that fails; a connection
// in any doubt is destroyed by pooltx, never pooled.
//
// The error is the first statement's error or a result handler's. A
// connection that could not be acquired means nothing was sent (see
// outcomeUnknown).
//
// A pooled connection whose session the server ended while it sat idle in
// the pool (idle_session_timeout, pg_terminate_backend, a restart) answers
// the batch with the FATAL error it sent before closing, ahead of BEGIN's
// answer: nothing of the batch ran (the server answers in order), so exec
// runs it once more, on a connection it has just pinged (withLivePin).
// pgxpool pings only connections idle for over a second, so without this an
// idle_session_timeout under a second failed calls that had only drawn a
// dead connection.
func exec(ctx context.Context, pool *pgxpool.Pool, cleanup time.Duration, w wait, queue func(b *pgx.Batch)) error {
	diedIdle, err := execOnce(ctx, pool, cleanup, w, queue)
	if diedIdle && ctx.Err() == nil {
		_, err = execOnce(withLivePin(ctx), pool, cleanup, w, queue)
	}
	return err
}

// execOnce is one try of exec; diedIdle reports a connection whose session
// had ended before the batch reached it (see exec).
func execOnce(ctx context.Context, pool *pgxpool.Pool, cleanup time.Duration, w wait, queue func(b *pgx.Batch)) (diedIdle bool, err error) {
	c, err := acquire(ctx, pool, cleanup)
	if err != nil {
		return false, errNothingSent{err}
	}
	defer c.Release()
	b := &pgx.Batch{}
	begun := false
	b.Queue(beginSQL).Exec(func(pgconn.CommandTag) error { begun = true; return nil })
	if needsUTF8(c.Conn().PgConn()) {
		b.Queue(utf8SQL) // before any statement with text: the server converts each Bind as it comes
	}
	switch w {
	case waitCtx:
		b.Queue(frameSQL)
	case waitTry:
		b.Queue(frameTrySQL)
	case managerTables:
		b.Queue(frameManagerSQL)
	case managerTables | waitTry:
		b.Queue(frameManagerTrySQL)
	}
	queue(b)
	b.Queue(commitSQL)
	pg := c.Conn().PgConn()
	open := !pg.IsClosed()
	err = sentcheck.Check(c.Conn().SendBatch(ctx, b).Close(), open, pg) // a failed read after the send is not "nothing sent"
	if pg.IsClosed() {
		var pgErr *pgconn.PgError
		// A closed connection is destroyed by Release.
		return !begun && errors.As(err, &pgErr) && pgErr.Severity == "FATAL", err
	}
	if pg.TxStatus() == 'I' {
		// Only our own statements ran, all inside the transaction that
		// just ended, and the frame's settings were transaction-local:
		// nothing to reset, so Release skips pooltx's reset round trip.
		c.MarkClean()
		return false, err
	}
	// Aborted (or, after a handler error, still open): roll back here rather
	// than make the pool destroy a healthy connection.
	rctx, cancel := cleanupContext(ctx, cleanup)
	defer cancel()
	if _, rerr := c.Conn().Exec(rctx, "ROLLBACK"); rerr != nil || pg.TxStatus() != 'I' {
		c.MarkDirty(rerr)
	} else {
		c.MarkClean() // as above: the rollback ended all we did
	}
	if err == nil {
		err = errors.New("lease: transaction left open")
	}
	return false, err
}

// livePinKey marks a context whose exec must run on a connection it has
// just pinged (withLivePin).
type livePinKey struct{}

// withLivePin makes the execs under ctx ping the connection they draw
// before using it, and draw another while the ping finds it dead: a retry
// after a statement failed on a dead pooled connection (releaseRetrying),
// since pgxpool pings only connections idle for over a second and may
// hand out every dead one in turn.
func withLivePin(ctx context.Context) context.Context {
	return context.WithValue(ctx, livePinKey{}, true)
}

// acquire pins a connection of pool for exec; under withLivePin, one that
// has just answered a ping (at most the pool's MaxConns+1 draws: a
// connection whose ping fails is destroyed, so a later draw dials anew).
func acquire(ctx context.Context, pool *pgxpool.Pool, cleanup time.Duration) (*pooltx.Conn, error) {
	opts := &pooltx.ConnOptions{CleanupTimeout: cleanup, DeferIdentity: true}
	if live, _ := ctx.Value(livePinKey{}).(bool); !live {
		return pooltx.Acquire(ctx, pool, opts)
	}
	var err error
	for range pool.Stat().MaxConns() + 1 {
		var c *pooltx.Conn
		if c, err = pooltx.Acquire(ctx, pool, opts); err != nil {
			return nil, err
		}
		pctx, cancel := context.WithTimeout(ctx, cleanup)
		err = c.Conn().Ping(pctx)
		cancel()
		if err == nil {
			return c, nil
		}
		c.Destroy(err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// errNothingSent marks an error that occurred before anything was sent (no
// connection could be had), so that the outcome is known: nothing happened.
type errNothingSent struct{ err error }

func (e errNothingSent) Error() string     { return e.err.Error() }
func (e errNothingSent) Unwrap() error     { return e.err }
func (e errNothingSent) SafeToRetry() bool { return true }

// isLockTimeout reports a lock wait ended by lock_timeout (SQLSTATE 55P03).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// cleanupClock is the one clean-up bound of a call: every clean-up step of
// the call (the ROLLBACK of a failed statement, the give-backs and releases
// that follow it, a retry of them on another connection) ends by the same
// deadline, start + timeout, where start is the moment the first of them
// began. Without it each step would take a fresh bound of its own, and a
// frozen network would stretch the call by one timeout per step.
type cleanupClock struct {
	mu    sync.Mutex
	start time.Time // zero: no clean-up has begun
}

type cleanupClockKey struct{}

// withCleanupClock gives the call ctx belongs to a clean-up clock, unless
// it has one already.
func withCleanupClock(ctx context.Context) context.Context {
	if _, ok := ctx.Value(cleanupClockKey{}).(*cleanupClock); ok {
		return ctx
	}
	return context.WithValue(ctx, cleanupClockKey{}, &cleanupClock{})
}

// restartCleanupClock forgets a clean-up that ended without ending the call
// (the ROLLBACK of an attempt that Acquire follows with another attempt), so
// that the call's final clean-up gets its whole bound.
func restartCleanupClock(ctx context.Context) {
	if c, ok := ctx.Value(cleanupClockKey{}).(*cleanupClock); ok {
		c.mu.Lock()
		c.start = time.Time{}
		c.mu.Unlock()
	}
}

// cleanupContext is the context a clean-up step runs under: detached from
// ctx's cancellation (pooltx.CleanupContext) and bounded by timeout counted
// from the first clean-up step of the call, which it starts if none has. A
// ctx without a clock (a caller's own, for Renew or Release) gets one here,
// carried by the result, so the steps nested in this one (exec's ROLLBACK
// inside a bounded release) share its bound.
func cleanupContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		timeout = pooltx.DefaultCleanupTimeout
	}
	ctx = withCleanupClock(ctx)
	c := ctx.Value(cleanupClockKey{}).(*cleanupClock)
	c.mu.Lock()
	if c.start.IsZero() {
		c.start = time.Now()
	}
	deadline := c.start.Add(timeout)
	c.mu.Unlock()
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

package advisory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlock/pgxlock/keys"
)

// Sentinel errors. Every error a call returns that a caller can act on
// matches one of these with errors.Is, and keeps the *pgconn.PgError that
// caused it (errors.As) and, when the caller's context ended, the context's
// error as well. (A lock wait that another session's pg_cancel_backend
// ended matches none, where the server's messages are in English: it is a
// *LockError with the server's 57014 in the chain; see Locker.WithLock.)
var (
	// ErrNotAcquired: a Try call found a key held in a conflicting mode.
	// Nothing is held.
	ErrNotAcquired = errors.New("advisory: lock not acquired")

	// ErrLockTimeout: a blocking call gave up waiting for a lock (in the
	// Locker's local queue or on the server), because of the configured or
	// per-call timeout (SQLSTATE 55P03), the context's deadline, or the
	// server's statement_timeout ending the lock statement (SQLSTATE 57014;
	// a cancel request sent because the caller's context was cancelled is
	// not a timeout: it reads as the context's error). Nothing is held, and
	// a connection that waited on the server was kept.
	ErrLockTimeout = errors.New("advisory: lock timeout")

	// ErrDeadlock: PostgreSQL chose this call as the victim of a deadlock
	// (SQLSTATE 40P01). Callers that pass every key of a critical section
	// to one multi-key call never see it from each other.
	ErrDeadlock = errors.New("advisory: deadlock detected")

	// ErrTooManyLocks: the server's shared lock table is full (SQLSTATE
	// 53200). It is sized by max_locks_per_transaction x (max_connections +
	// max_prepared_transactions); while it is full, every session of the
	// cluster suffers, new logins included. Release locks, or raise
	// max_locks_per_transaction (needs a restart).
	ErrTooManyLocks = errors.New("advisory: out of shared memory for locks (raise max_locks_per_transaction)")

	// ErrNotHeld: an unlock found the key not held by its session: the lock
	// was released behind the library's back, or was never there. The
	// connection is destroyed.
	ErrNotHeld = errors.New("advisory: lock not held")

	// ErrInvalid: bad input (no keys, a zero key, more keys than
	// Config.MaxKeys, a nil pool or callback, a negative setting). No SQL
	// was sent.
	ErrInvalid = errors.New("advisory: invalid input")

	// ErrNoConnection: the call could not get a live connection to lock
	// on: the pool or Config.MaxConns was exhausted past the call's bound
	// (for a Try call, Config.LockTimeout else DefaultTryConnWait), or the
	// server could not be reached or did not answer while connecting, or
	// the call's bound ended before its lock statement was sent (a Locker's
	// first session-scope call checks for a proxy first, one round trip
	// inside that bound: a bound shorter than a round trip ends there), or,
	// in a callback form, the lock was granted but the connection could not
	// be readied for the callback (pooltx's first Lend of a connection
	// records its identity in one round trip; a failure there, another
	// session's pg_cancel_backend of it say, closes the connection, which
	// ends the lock with the session; the tracer has seen the acquisition
	// and then its release with this error). Nothing is held and the
	// callback did not run; but for that last case, no lock was requested
	// from the server. It is never
	// ErrLockTimeout: a lock timeout means the wait for the key ran out (on
	// the server, or in the local queue behind an earlier call of the same
	// Locker for that key, which may itself be stuck on its way to the
	// server: see "Pool protection" in gate.go), this means this call's own
	// connection could not be had in time. OutcomeOf reports it as
	// OutcomeNoConnection unless the context was cancelled.
	ErrNoConnection = errors.New("advisory: no connection")

	// ErrCallbackInTx: a WithLock or WithLockAll callback returned while
	// its connection was still inside a transaction it began, open or
	// aborted (a statement in it failed, SQLSTATE 25P02 for what follows).
	// Nothing of that transaction is committed: it is rolled back, then
	// the lock is released as usual (a connection on which the rollback
	// fails is destroyed, which also releases it, and the rollback's error,
	// a server's FATAL say, is kept in the chain). What fn committed itself
	// before it (a COMMIT AND CHAIN, whose new transaction is the one left
	// open) is kept. fn's own error, if any, is joined. A callback that
	// commits or rolls back its own BEGIN does not get it.
	ErrCallbackInTx = errors.New("advisory: callback returned inside a transaction (rolled back)")
)

// LockError is the typed error of every failed call: which operation, on
// which keys, and why. Err matches the sentinels above and keeps the cause.
type LockError struct {
	// Op is the operation: "lock", "try-lock", "xact-lock", "try-xact-lock",
	// "unlock", each with a "-shared" suffix for shared mode.
	Op string
	// Keys are the keys of the call, sorted and de-duplicated.
	Keys []keys.Key
	// Err is the cause; errors.Is and errors.As see through it.
	Err error
}

// maxErrorKeys is how many of its keys a LockError's text names.
const maxErrorKeys = 16

// Error renders "advisory: <op> <key>: <cause>" for one key and
// "advisory: <op> [<key> <key> ...]: <cause>" for several (a key's own
// text may contain a comma, never a space); keys print as numbers and
// namespace names, never as a hashed source string. Of more than
// maxErrorKeys keys the first maxErrorKeys print, then "+N more" (a call
// of Config.MaxKeys raised to thousands would print every one in each log
// line); Keys holds them all.
func (e *LockError) Error() string {
	var b strings.Builder
	b.WriteString("advisory: ")
	b.WriteString(e.Op)
	if len(e.Keys) > 0 {
		b.WriteByte(' ')
	}
	if len(e.Keys) > 1 {
		b.WriteByte('[')
	}
	for i, k := range e.Keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		if i == maxErrorKeys {
			b.WriteString("+" + strconv.Itoa(len(e.Keys)-i) + " more")
			break
		}
		b.WriteString(k.String())
	}
	if len(e.Keys) > 1 {
		b.WriteByte(']')
	}
	b.WriteString(": ")
	b.WriteString(strings.TrimPrefix(e.Err.Error(), "advisory: "))
	return b.String()
}

// Unwrap returns the cause.
func (e *LockError) Unwrap() error { return e.Err }

// SQLSTATE codes the package maps to sentinels.
const (
	codeLockNotAvailable = "55P03"
	codeDeadlock         = "40P01"
	codeOutOfMemory      = "53200"
	codeQueryCanceled    = "57014"
	// codeNoPreparedStatement: a prepared statement is gone (DEALLOCATE
	// ALL); not a sentinel, see unlockSession.
	codeNoPreparedStatement = "26000"
)

// statementTimeoutMsg is what PostgreSQL says (lc_messages in English)
// when statement_timeout, not a cancel request, ends a statement; both are
// SQLSTATE 57014. A cancel request reads cancelRequestMsg.
const (
	statementTimeoutMsg = "canceling statement due to statement timeout"
	cancelRequestMsg    = "canceling statement due to user request"
)

// isStatementTimeout reports a 57014 raised by statement_timeout, as far as
// the client can tell: the English message says so; a message in another
// language (lc_messages) is taken as statement_timeout too unless ctx was
// cancelled (then it is our own cancel request), since only the English
// message tells a cancel request from a timeout. So on a server that
// speaks another language, another session's pg_cancel_backend of a lock
// wait also reads as a lock timeout: the wait ended on the server and
// nothing is held, which is what the caller acts on.
func isStatementTimeout(ctx context.Context, pgErr *pgconn.PgError) bool {
	if pgErr.Code != codeQueryCanceled {
		return false
	}
	if strings.Contains(pgErr.Message, statementTimeoutMsg) {
		return true
	}
	return !strings.Contains(pgErr.Message, cancelRequestMsg) && !errors.Is(ctx.Err(), context.Canceled)
}

// classify maps err from a lock statement to the package's sentinels,
// keeping err itself, and the context's error when ctx has ended, in the
// chain.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var sentinel error
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeLockNotAvailable:
			sentinel = ErrLockTimeout
		case codeDeadlock:
			sentinel = ErrDeadlock
		case codeOutOfMemory:
			sentinel = ErrTooManyLocks
		case codeQueryCanceled:
			// statement_timeout (role, database, DSN) ended the wait: a lock
			// timeout to the caller. A cancel request (ours, sent because ctx
			// was cancelled, or another session's pg_cancel_backend) gets no
			// sentinel: ctx's error, appended below, says what happened.
			if isStatementTimeout(ctx, pgErr) {
				sentinel = ErrLockTimeout
			}
		}
	}
	ctxErr := ctx.Err()
	if ctxErr == nil {
		// The server's lock_timeout, set from the deadline and rounded up,
		// fires after the deadline; but ctx reports it only once its timer
		// has run, which a loaded machine can delay past our return.
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			ctxErr = context.DeadlineExceeded
		}
	}
	if sentinel == nil && !errors.Is(err, ErrNoConnection) &&
		(errors.Is(ctxErr, context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)) {
		sentinel = ErrLockTimeout // a deadline or the call's timeout ended the wait for a lock
	}
	errs := chain{}
	if sentinel != nil {
		errs = append(errs, sentinel)
	}
	errs = append(errs, err)
	if ctxErr != nil && !errors.Is(err, ctxErr) {
		errs = append(errs, ctxErr)
	}
	return errs
}

// noConnection marks err, from the wait for a connection (Config.MaxConns,
// the pool, connecting), as ErrNoConnection: a deadline that ends it is not
// a lock timeout, as no lock was waited for.
func noConnection(err error) error { return chain{ErrNoConnection, err} }

// chain is errors.Join with a one-line message: "a: b: c". Every element
// is visible to errors.Is and errors.As.
type chain []error

func (c chain) Error() string {
	parts := make([]string, len(c))
	for i, e := range c {
		parts[i] = e.Error()
	}
	return strings.Join(parts, ": ")
}

func (c chain) Unwrap() []error { return c }

// join returns the non-nil errors as one chain, or nil.
func join(errs ...error) error {
	var c chain
	for _, e := range errs {
		if e != nil {
			c = append(c, e)
		}
	}
	switch len(c) {
	case 0:
		return nil
	case 1:
		return c[0]
	}
	return c
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

package pooltx

import (
	"errors"
	"fmt"
)

// Outcomes of a transaction that fn asked to commit (fn returned nil) and
// that did not commit cleanly. Both wrap the cause (a *pgconn.PgError,
// pgx.ErrTxCommitRollback, a context's error or a network error).
var (
	// ErrNotCommitted: the transaction was not committed and nothing fn
	// did in it is kept; it is safe to run the work again (unless fn
	// committed part of it itself, by COMMIT AND CHAIN: that part is kept). The context
	// ended before COMMIT was sent (the transaction was rolled back), or
	// the server refused COMMIT (a deferred constraint, a serialization
	// failure: its *pgconn.PgError is in the chain), or the transaction
	// had already failed (pgx.ErrTxCommitRollback), or the server had
	// ended the session for idling in the transaction past
	// idle_in_transaction_session_timeout (the FATAL 25P03 is in the chain;
	// PostgreSQL checks for that timeout after reading a command and before
	// running it, so COMMIT never ran).
	ErrNotCommitted = errors.New("pooltx: transaction not committed")

	// ErrCommitUnknown: COMMIT was sent and no answer came (the
	// connection failed, or the context ended while waiting for it), so
	// the transaction may or may not have committed; or the connection was
	// lost under a callback that returned nil all the same (only a commit
	// the callback ran itself may have happened). The connection was
	// destroyed. Before doing the work again, check whether it took
	// effect, or make it idempotent.
	ErrCommitUnknown = errors.New("pooltx: commit outcome unknown")
)

// CleanupError reports a cleanup step that failed after the work: the
// connection it ran on has been destroyed. Step names the operation
// ("rollback", "commit", "unlock", "reset", ...); Err is the cause and may
// be a *pgconn.PgError or a context error.
type CleanupError struct {
	Step string
	Err  error
}

// Error renders "pooltx: <step>: <cause>".
func (e *CleanupError) Error() string {
	return fmt.Sprintf("pooltx: %s: %v", e.Step, e.Err)
}

// Unwrap returns the cause.
func (e *CleanupError) Unwrap() error { return e.Err }

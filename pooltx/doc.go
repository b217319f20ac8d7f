// Package pooltx pins one pooled PostgreSQL connection, or one transaction on
// it, through a piece of work and guarantees what happens to that connection
// afterwards.
//
// It is the layer the advisory and lease packages stand on, and it is useful
// on its own wherever a callback must run on a single connection of a
// [pgxpool.Pool].
//
// # The rule
//
// A connection that may still hold a session-level lock, an open
// transaction or a changed session setting never goes back to the pool.
// Either it is known to be clean and is released, or it is hijacked out of
// the pool and closed. There is no third outcome: when in doubt, destroy.
// Destroying costs one new connection later; releasing a dirty one hands a
// lock or a half-done transaction to an unrelated borrower.
//
// A connection is made clean by a reset ([Conn.Reset]) before every release,
// whatever the callback did: "SELECT pg_advisory_unlock_all(); RESET ALL"
// drops every session-level advisory lock and restores every setting to its
// value at connection start. On the way out of [WithTx] the reset shares
// COMMIT's (or ROLLBACK's) round trip, so a transaction costs no more round
// trips than before; [WithConn] and [Conn.Release] pay one round trip for
// it. Callers that end with statements of their own queue the reset with
// them ([Conn.QueueReset]).
//
// What the reset keeps and what it does not:
//
//   - Settings from the server, the database, the role and the connection
//     string (pgx's ConnConfig.RuntimeParams, e.g. ?search_path=app in the
//     DSN) survive: they are the connection's defaults. A SET run in
//     pgxpool's AfterConnect does not survive the first release by this
//     package: put such settings in RuntimeParams.
//   - Prepared statements are kept (DISCARD ALL would also drop pgx's
//     statement cache behind its back). Temporary tables, LISTEN
//     registrations and cursors WITH HOLD are not reset: a callback that
//     creates them must remove them itself.
//
// A connection is destroyed instead when:
//
//   - the callback panicked (the panic is re-raised after cleanup);
//   - a cleanup step (rollback, unlock, reset) failed or timed out;
//   - the connection is closed, busy, or not idle in the transaction sense
//     (TxStatus other than 'I') when the work ends;
//   - a COMMIT went unanswered ([ErrCommitUnknown]);
//   - a caller marked it with [Conn.MarkDirty], for example because the
//     outcome of a lock statement cannot be known.
//
// # Destroying lets go at once
//
// A destroyed connection's socket is closed before Release returns. A
// backend that is idle, or idle in a transaction, reads the closed socket
// and exits within milliseconds, and PostgreSQL releases every lock it held.
// This holds also when pgx has already given up on the connection (a
// context that ended mid-statement), whose own close first sends a cancel
// request on a new connection and closes the socket only after it: a
// connect, a TLS handshake and a fork on the server, measured at 85-500 ms
// each on a loaded 2-core machine, bounded by pgx at 15 s. A backend that
// is still waiting for a lock does not read its socket: it leaves the wait
// when the cancel request arrives, or when the lock is granted and it finds
// its client gone (the server setting client_connection_check_interval
// bounds that too). The cancel request runs in a goroutine of pgx's that
// may outlive Release.
//
// # Commit outcomes
//
// When the callback of [WithTx] returns nil, the transaction is committed,
// or the error says what happened: [ErrNotCommitted] (nothing was
// committed: safe to run the work again) or [ErrCommitUnknown] (COMMIT was
// sent and no answer came: the work may or may not be committed; check
// before running it again). A callback that commits or rolls back the
// transaction itself is accepted: what it did is the outcome.
//
// # Contexts
//
// The context given to [WithConn] and [WithTx] governs acquiring the
// connection, BEGIN and its preamble, the callback, and COMMIT. Cleanup
// (ROLLBACK, closing a destroyed connection, and the unlock/reset steps
// callers run through [CleanupContext]) runs under context.WithoutCancel of
// that context, bounded by a cleanup timeout ([DefaultCleanupTimeout] unless
// set), so a cancelled caller still gets its connection cleaned up, and a
// cleanup that cannot finish in time destroys the connection instead of
// waiting for ever. A failed cleanup step is reported as a [*CleanupError]
// naming the step.
//
// # One round trip for BEGIN and what must precede the callback
//
// [TxOptions.Preamble] queues statements into the same [pgx.Batch] as BEGIN
// (pgx's [pgx.Batch.BeginTx]), so "BEGIN; SET LOCAL lock_timeout ...; SELECT
// pg_advisory_xact_lock(...)" costs a single network round trip once the
// statements are prepared. Result handlers attached to the queued queries
// (QueuedQuery.QueryRow, QueuedQuery.Exec) run before the callback; an error
// from one rolls the transaction back and is returned as is.
//
// # Panics
//
// A panic in a callback is never swallowed. The connection is destroyed (its
// transaction and session locks go with it, server-side) and the panic value
// is re-raised in the caller's goroutine, the policy of database/sql's
// Conn.Raw.
package pooltx

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
// A connection is treated as dirty, and destroyed, when:
//
//   - the callback panicked (the panic is re-raised after cleanup);
//   - a cleanup step (rollback, unlock, reset) failed or timed out;
//   - the connection is closed, busy, or not idle in the transaction sense
//     (TxStatus other than 'I') when the work ends;
//   - a caller marked it with [Conn.MarkDirty], for example because the
//     outcome of a lock statement cannot be known.
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

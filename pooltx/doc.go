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
// transaction or any changed session state (settings, role, session
// authorization, temporary tables, LISTEN, cursors) never goes back to the
// pool. Either it is known to be clean and is released, or it is hijacked
// out of the pool and closed. There is no third outcome: when in doubt,
// destroy. Destroying costs one new connection later; releasing a dirty one
// hands a lock, a half-done transaction or another user's identity to an
// unrelated borrower.
//
// # The reset
//
// Its invariant: after any work lent a connection, the next borrower sees
// the connection as the pool gave it out (after a reset, as the
// connection's first pin found it: what a fresh connection of the pool
// sees, unless another borrower of the pool had changed it before that
// pin; see the identity and settings below), or a fresh connection. Before every release of a connection
// that was lent to code the caller does not control ([Conn.Lend]:
// [WithConn], [WithTx] and the callback and batch helpers of package
// advisory do), whatever that code did, one simple-protocol string runs
// ([Conn.Reset]), unless that code left the connection exactly as it
// found it (see "Work that sent nothing" below):
//
//	RESET SESSION AUTHORIZATION; SET ROLE NONE; SELECT pg_catalog.pg_advisory_unlock_all();
//	CLOSE ALL; UNLISTEN *; RESET ALL; DISCARD TEMP; DISCARD SEQUENCES
//
// (preceded by EXECUTE pgxlock_reset, the probe below, on a connection that
// uses pgx's statement cache; the first two statements name the identity
// recorded at the connection's first pin, below; and followed, where the
// session had set settings itself by then, by one SELECT of set_config
// calls that sets them again). The whole string is ASCII (names outside it
// are Unicode-escaped identifiers, values the hex of their bytes), so
// that a client_encoding the lent code left cannot change how it reads;
// on a connection whose client_encoding was not UTF8 when its identity was
// read (pgx asks for UTF8 unless the connection string or the database
// says otherwise), or to an SQL_ASCII server, names are quoted as the bytes
// they came in, and a client_encoding the lent code changed can misread
// them (the reset then fails, and the connection is destroyed, or names
// another role of the same bytes in that encoding).
//
// It restores:
//
//   - Identity: the session user and role the connection had when it was
//     first pinned ([Acquire] reads session_user and
//     current_setting('role') then, once in the connection's life; with
//     [ConnOptions.DeferIdentity], as advisory and lease pin, the first
//     [Conn.Lend] does, and a reset before it leaves identity as it is; a
//     first Lend inside the caller's own transaction cannot, and the
//     connection is destroyed instead, as [Conn.Lend] says): a role
//     from the connection string's RuntimeParams, from ALTER ROLE ... SET
//     role, or from a SET ROLE or SET SESSION AUTHORIZATION that pgxpool's
//     AfterConnect ran, included. The reset names them: SET SESSION
//     AUTHORIZATION (RESET SESSION AUTHORIZATION where it is the user that
//     logged in; PostgreSQL checks the authenticated user, so either works
//     whatever role the session switched to), then SET ROLE (NONE where it
//     was none). So a session never goes back to the authenticated user's
//     identity where the pool's own set-up had left it, and a role whose
//     grant was revoked since makes the reset fail, which destroys the
//     connection. RESET ALL alone skips both (they are flagged
//     NO_RESET_ALL). Identity is never kept, whether changed by SET ROLE,
//     SET SESSION AUTHORIZATION or set_config('role', ..., false). (A pool
//     hook that switches identity per borrower, in PrepareConn or
//     BeforeAcquire, must set it on every acquire, or undo it in
//     AfterRelease: what the reset restores is the identity recorded at
//     the connection's first pin (or lend), whichever borrower's that was.)
//   - Every session-level advisory lock is dropped, every cursor (WITH
//     HOLD ones) closed, every LISTEN ended, every temporary table dropped,
//     and the session's sequence state forgotten (currval and lastval are
//     undefined again, as in a new session, so lastval does not tell the
//     next borrower the last id the work drew).
//   - Every setting goes back to its value when the connection was first
//     pinned (or, with DeferIdentity, first lent), read with the identity:
//     RESET ALL restores the server's, database's and role's defaults and
//     the connection string's RuntimeParams (e.g. ?search_path=app in the
//     DSN), and a statement at the end of the reset sets again, with
//     set_config, each setting the session had SET itself by then
//     (pg_settings.source 'session': a SET run in pgxpool's AfterConnect,
//     say search_path or default_transaction_isolation), to the value it
//     had then (as with identity, what that first pin found, whichever
//     borrower left it), as PostgreSQL shows it (a real-valued setting to
//     6 significant digits: cpu_tuple_cost 0.0123456789 comes back as
//     0.0123457). The transaction_isolation, transaction_read_only and
//     transaction_deferrable settings belong to a transaction and are not
//     restored. Settings restored apply to the library's own statements
//     outside transactions too, as they would on a fresh connection of
//     the pool: with default_transaction_isolation serializable,
//     default_transaction_read_only and default_transaction_deferrable all
//     set, every such statement, the unlock and reset included, first
//     waits for a safe snapshot (bounded by the cleanup timeout, past
//     which the connection is destroyed). Not restored: a custom setting (a name with a dot) that
//     AfterConnect set, which pg_settings does not list (RuntimeParams
//     carries one); and a setting that only a superuser may set, SET
//     before an AfterConnect's SET ROLE to a role that may not, makes
//     every reset fail, which destroys the connection each time. With
//     DeferIdentity, a reset before the first Lend (nothing recorded yet)
//     restores the values at connection start only.
//   - pgx's statement cache keeps working after a DEALLOCATE ALL (or pgx's
//     Conn.DeallocateAll): on a connection that uses it by default (a
//     DefaultQueryExecMode of QueryExecModeCacheStatement, pgx's default;
//     a pool with another default, whose queries ask for that mode one by
//     one, has no probe: the other modes are the ones that work through
//     PgBouncer, where a statement the probe prepared would not be found
//     again), the connection's first pin (or, with
//     DeferIdentity, first [Conn.Lend]) prepares a probe statement,
//     pgxlock_reset (once in the connection's life, with the identity's
//     read; the name is the library's: where the pool's own code, an
//     AfterConnect say, prepared a statement under it, that first pin or
//     Lend fails, and so does every call on such a connection), and the reset executes it
//     first; after a DEALLOCATE ALL it is gone, the reset fails and the
//     connection is destroyed, so the next borrower's cached statements do
//     not fail with 26000. The probe runs before the rest of the reset, so
//     what a statement the work prepared under its name does (a lock, a
//     role, a setting) the rest of the reset undoes; but such a statement
//     stays prepared and runs at the start of every later reset, under
//     the session state later work left (see below: lent code can plant
//     statements that later borrowers run).
//   - pgx's queue of notifications received for the work's LISTENs is
//     emptied when the connection goes back (the reset's UNLISTEN * ends
//     the registrations, not what had already arrived).
//
// On the way out of [WithTx] the reset shares COMMIT's (or ROLLBACK's)
// round trip, and in advisory's session helpers the unlock's, so a helper
// costs no more round trips than the same work by hand; [WithConn] and
// [Conn.Release] pay one round trip for it (WithConn none when its work
// sent nothing). The first pin of each connection ([Acquire]; with
// DeferIdentity, its first [Conn.Lend]) costs one round trip, once in the
// connection's life (it records the identity and the settings the session
// had set itself, and prepares the probe where that is used; reading
// pg_settings makes it the costlier statement, about 1.1 ms of server time
// more than the identity alone on the 2-core test machine: pgbench -M
// simple of the two, 1.26 against 0.15 ms a statement); a failure there destroys the connection, and the
// work does not run on it. Its answers are read message by
// message, with no allocation per statement. A connection that was never
// lent ran only its caller's statements: the caller may vouch for it
// ([Conn.MarkClean]: advisory's handles, Hold and refused try-locks,
// lease's frames), and it goes back with no reset at all.
//
// # Work that sent nothing
//
// A session's state changes only by what its client sends (the server may
// end the session, which the check below sees). So [Conn.Lend] notes the
// kernel's counts for the connection's socket (Linux, TCP, TLS included:
// TCP_INFO's tcpi_bytes_sent plus tcpi_notsent_bytes, so bytes a frozen
// network still queues count, tcpi_bytes_received, and the TCP state), and
// [Conn.Reclaim], called when the lent code has returned, flushes whatever
// it handed pgx's frontend without flushing, clears any deadline it set on
// the socket, and compares: nothing written, nothing received or waiting
// to be read (not a notice, a notification, nor the error of a session the
// server ended) and the connection still open both ways mean the code left
// the session as it found it, and the connection goes back without the reset
// (as the pool gave it out: state another borrower of the pool left on it,
// through pgxpool alone, is left as it was), a transaction ends with
// COMMIT or ROLLBACK alone (which vouch for nothing run on the connection
// before the transaction began: [WithTx] starts from a connection fresh
// from the pool). A session the server ends while its last words are still
// on the way is not seen, and reaches the next borrower ended, as an idle
// connection of the pool whose session ended would (pgxpool pings one idle
// for over a second). Once lent code has sent or received anything,
// the connection stays lent until its release: a later Lend, [Conn.Tx] or
// Reclaim does not make it quiet again. [WithConn], [WithTx] and
// advisory's callback helpers do this; a [TxOptions.Preamble] counts as
// lent code unless the caller sets [TxOptions.PreambleChangesNoState].
// Where the counts cannot be read (another OS, a Unix-domain socket, a
// DialFunc whose net.Conn does not unwrap to a *net.TCPConn through NetConn
// methods) the reset always runs. Lent code must not leave a goroutine that
// uses the connection after it returned (it may not in any case); a
// DialFunc or AfterNetConnect wrapper that unwraps by NetConn, and the
// writer of a custom BuildFrontend, must not buffer writes.
//
// What the reset does not undo, and why:
//
//   - A custom setting (a name with a dot, such as my.tenant) that the work
//     created reads as the empty string afterwards, not as NULL: PostgreSQL
//     keeps a placeholder for it for the rest of the session, and RESET ALL
//     sets it to the empty string; only a new connection drops it, and
//     destroying every connection that saw one would cost a new connection
//     per call to code that uses them. Nor can the reset tell cheaply
//     whether the work created one: only a scan of pg_settings lists
//     them, which took 0.48 ms more than SELECT 1 per statement (pgbench,
//     PostgreSQL 15 on the 2-vCPU machine of BENCHMARKS.md), against a
//     reset that now rides in the unlock's round trip. Code that tells "unset" by NULL
//     (current_setting with missing_ok) must treat the empty string as
//     unset too.
//   - Statements the work prepared itself (PREPARE, pgx's Conn.Prepare)
//     stay prepared: DEALLOCATE ALL would also drop pgx's statement cache
//     behind its back (so would DISCARD ALL, which besides cannot run in
//     the reset's implicit transaction), and the server offers no cheap way
//     to tell them from pgx's. A later borrower preparing the same name
//     gets 42P05.
//   - The seed of random() is not reset (setseed: neither RESET ALL nor
//     DISCARD touches it), so work that seeds it hands the next borrower a
//     predictable sequence; do not use random() for secrets
//     (gen_random_uuid and pgcrypto do not use it).
//   - The probe catches DEALLOCATE ALL only. Work that deallocates one of
//     pgx's cached statements (DEALLOCATE "stmtcache_..."), prepares a
//     statement under one of pgx's names, or redefines the probe after a
//     DEALLOCATE ALL leaves pgx's cache out of step with the server: the
//     next borrower's statement fails with 26000, or runs the other
//     statement. The server's own statements are not for the work to
//     replace; the reset cannot tell them apart cheaply.
//   - Lent code can plant statements that later borrowers run: one
//     prepared under one of pgx's statement names runs in their queries
//     (above), one prepared under the probe's name at the start of every
//     later reset. Where the reset itself goes out as pgx's cached
//     statements ([Conn.QueueReset], in pgx's default exec mode: advisory's
//     unlock of several keys after a callback, and WithXactLockBatch),
//     code that re-prepares those statements' names (found in
//     pg_prepared_statements) as something else keeps its role, settings
//     and session locks past the reset. Lend connections only to code you
//     trust as much as the pool's other users.
//   - What the session loaded or opened beyond SQL state: a library LOADed
//     (auto_explain, passwordcheck, plpgsql by any DO block: their
//     settings exist for later borrowers), connections opened by dblink or
//     postgres_fdw (and whatever they hold, such as advisory locks taken
//     through them: those belong to the other session), a replication
//     origin set up for the session (pg_replication_origin_session_setup)
//     and temporary replication slots, and the session's temporary schema
//     once assigned (DISCARD TEMP empties it; pg_my_temp_schema() stays
//     set). Work that uses them must undo them itself, or make the
//     connection go (pgxpool's Conn.Hijack, or an error that destroys it).
//   - State AfterConnect created other than identity and settings (both
//     restored, above, but for a custom setting): a temporary table or
//     LISTEN it made is gone after the first reset, as after DISCARD ALL;
//     create such state per use, not per connection.
//   - State of the *pgx.Conn on the client: types registered on its
//     TypeMap, its PgConn's CustomData, options set on its socket.
//     Register types in pgxpool's AfterConnect, for every connection
//     alike. And what pgx's statement and description caches hold: a
//     statement the work ran while a temporary table of its own shadowed
//     a permanent table of the same name stays described against the
//     temporary table, which the reset drops; a later borrower running
//     the same SQL text gets pgx's encode error or the server's 0A000
//     ("cached plan must not change result type"), as on a raw pgx
//     connection (pgx offers no way to drop those entries but
//     Conn.DeallocateAll, a round trip that would also drop the probe).
//     Give temporary tables names of their own.
//   - What is sent to the server bypassing pgx (PgConn().Frontend() with
//     answers left unread) leaves the connection out of step with its
//     answers.
//
// Connections that were never lent (advisory's handles, Hold) go back
// without the reset, on the word of their caller that only its own
// statements ran there: a pgx tracer (ConnConfig.Tracer) or pool hook that
// runs statements on the connections it is given, a SET ROLE say, breaks
// that word. Hooks and tracers should only observe.
//
// A connection is destroyed instead when:
//
//   - the callback panicked (the panic is re-raised after cleanup);
//   - a cleanup step (rollback, unlock, reset) failed or timed out, the
//     reset's check for a DEALLOCATE ALL included;
//   - the connection is closed, busy, or not idle in the transaction sense
//     (TxStatus other than 'I') when the work ends;
//   - a COMMIT went unanswered ([ErrCommitUnknown]), or was answered by
//     the FATAL of idle_in_transaction_session_timeout ([ErrNotCommitted]);
//   - with [ConnOptions.DeferIdentity], its first [Conn.Lend] came inside
//     the caller's own transaction and the lent code was not found quiet
//     ([Conn.Reclaim]): the identity to return to is unknown;
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
// statements are prepared (pgx's QueryExecModeDescribeExec describes them
// first every time: two round trips). Result handlers attached to the queued queries
// (QueuedQuery.QueryRow, QueuedQuery.Exec) run before the callback; an error
// from one rolls the transaction back and is returned as is.
//
// # Panics
//
// A panic in a callback is never swallowed. The connection is destroyed (its
// transaction and session locks go with it, server-side) and the panic value
// is re-raised in the caller's goroutine, the policy of database/sql's
// Conn.Raw. The same holds for a panic of the pool's own code (an OnNotice
// handler, a tracer) while the package's own statements run (Release's
// reset, Acquire's first reading of the session's identity, the COMMIT or
// ROLLBACK with its reset): the connection is destroyed, its slot of the
// pool given back, and the panic goes on up.
package pooltx

// Package advisory takes PostgreSQL advisory locks through a pgx v5
// connection pool without ever leaking a lock, a transaction or a setting
// into the pool.
//
// A [Locker] wraps a [pgxpool.Pool]. Keys come from package keys: one
// bigint, or a pair of int4 (PostgreSQL's two key spaces, which never
// collide), plain, namespaced or hashed from a string.
//
//	locker, err := advisory.New(pool, advisory.Config{LockTimeout: 5 * time.Second})
//	err = locker.WithLock(ctx, keys.Hash("migrations"), nil, func(ctx context.Context, conn *pgx.Conn) error {
//		return migrate(ctx, conn)
//	})
//
// # Session and transaction locks
//
// Session-level locks (pg_advisory_lock: [Locker.WithLock] and friends)
// belong to a database session, that is, to one connection, and last until
// unlocked or until the session ends; ROLLBACK does not release them. They
// suit work that spans transactions or does not use the database at all
// (a migration runner, a job that calls other services).
//
// Transaction-level locks (pg_advisory_xact_lock: [Locker.WithXactLock] and
// friends) last until the transaction ends, commit or rollback, and cannot
// be released earlier. They suit work done inside one transaction
// (per-tenant serialisation of writes): nothing to unlock, nothing to leak.
// Prefer them whenever the critical section is one transaction.
//
// Isolation. A transaction-level lock is its transaction's first
// statement, so under REPEATABLE READ or SERIALIZABLE (Options.TxOptions,
// or the session's default_transaction_isolation) the transaction's
// snapshot is taken as the lock statement starts, before it waits: a
// transaction that waited for the previous holder does not see that
// holder's writes (its reads are of the data before them, and a
// serializable one's writes to the same rows fail with 40001). The lock
// still orders the transactions; it does not make their reads current.
// Run the critical section in READ COMMITTED, where every statement takes
// a fresh snapshot (Options.TxOptions with IsoLevel pgx.ReadCommitted
// overrides a stricter session default), or take a session-level lock
// ([Locker.WithLock]) and begin the stricter transaction inside its
// callback, once the lock is held. The same holds for
// [Locker.WithXactLockBatch], which begins with the session's default
// isolation and takes no TxOptions (under a stricter default, use
// WithXactLock with READ COMMITTED), and for [LockInTx] as the first
// statement of the caller's transaction.
//
// Round trips. The counts this package's documentation gives are those of
// pgx's exec modes that do not describe each statement: the default
// (QueryExecModeCacheStatement) and QueryExecModeCacheDescribe once pgx has
// the statements prepared or described, QueryExecModeExec and
// QueryExecModeSimpleProtocol, once each connection has been lent to a
// callback or batch for the first time (that first time costs one round
// trip more, once in the connection's life: pooltx's Conn.Lend records the
// session's identity then), and once a Locker has made its first
// session-scope call (that call costs one round trip more, once per
// Locker: it checks whether a connection proxy sits between the client
// and the server). QueryExecModeDescribeExec describes every
// statement first, so each extended-protocol statement or pipeline the
// library sends (a lock, an unlock, BEGIN with the lock, a batch, the
// savepoint of an in-transaction call) costs one round trip more there, as
// the same statements sent by hand do: with an empty callback a WithLock
// cycle takes 4, a WithXactLock 3, a WithXactLockBatch 2.
//
// When the statements are known up front, [Locker.WithXactLockBatch] sends
// BEGIN, the lock, a caller's pgx.Batch, COMMIT and the session's reset as
// one pipeline, in one round trip; a busy key ([Locker.TryWithXactLockBatch]),
// a lock timeout or a failed statement stops the pipeline on the server, so
// none of the batch is kept. Its readers run after COMMIT was sent and
// cannot undo it. A batch with a statement that would begin or end the
// call's transaction (COMMIT, ROLLBACK, BEGIN, ...; savepoints are fine)
// is refused with ErrInvalid before it is sent; in the simple protocol,
// where pgx joins the batch into one text, each string is read as
// PostgreSQL's lexer reads it, and a string the check cannot read for sure
// (a quote or comment left open, a token PostgreSQL versions read
// differently) is refused too: the list is in WithXactLockBatch's doc.
//
// # Locks inside the caller's transaction
//
// Code that already holds a pgx.Tx (a repository layer, sqlc queries, its
// own pgx.BeginTxFunc, on a pool or a single pgx.Conn, or a nested pgx
// transaction, which is a savepoint) takes transaction locks in it with
// [Locker.LockInTx], [Locker.TryLockInTx], [Locker.LockAllInTx] and
// [Locker.TryLockAllInTx]:
//
//	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
//		if err := locker.LockInTx(ctx, tx, tenant, nil); err != nil {
//			return err
//		}
//		return write(ctx, tx) // COMMIT releases the key
//	})
//
// Each call runs in a savepoint of its own: SAVEPOINT, the lock statement,
// RELEASE SAVEPOINT, in one round trip when the keys are granted (in the
// statement-caching exec modes, once pgx has them prepared: see
// [Locker.LockInTx]); a lock
// taken in a released savepoint belongs to the enclosing transaction, and
// lasts until it ends (or until the enclosing nested transaction is rolled
// back). A bounded wait sets lock_timeout inside the lock statement and, in
// the same statement, sets it back to the value the transaction had. A wait
// that fails (timeout, busy keys of a multi-key try, deadlock,
// cancellation) is undone by ROLLBACK TO SAVEPOINT in one more round trip
// (a busy single-key try takes nothing and needs none): none of the call's
// keys or settings stay, and the caller's transaction is usable as before,
// where a failed statement would otherwise abort it. A call that finds the
// transaction aborted or its connection closed, or leaves it so (the
// connection closed during the call), returns an error matching
// [ErrTxAborted]: roll it back. These calls use neither the Locker's pool
// nor its local queue.
//
// A transaction lock ends with the first error in its transaction, not at
// ROLLBACK: PostgreSQL aborts the transaction, and releases its locks, the
// moment a statement fails. A callback that catches a database error and
// carries on (say, to call another service) is no longer protected; return
// the error instead, or run the statement that may fail inside a SAVEPOINT
// (tx.Begin), whose failure leaves the lock in place.
//
// # Why a pinned connection
//
// A pool hands each query to whichever connection is free, so a lock taken
// with pool.Exec belongs to a connection the caller no longer controls: the
// unlock may run on another connection (and fail), and the locked
// connection goes back to the pool still holding the lock for the next
// borrower. Every callback call here pins one connection from acquire to
// unlock, and every held lock lives on a connection the Locker keeps out of
// the pool until nothing is held on it (see Held locks share connections).
// The unlock shares its round trip with pooltx's reset (see pooltx's
// package documentation for the exact statements), so nothing the callback
// did on the pinned connection survives into the pool: not a lock it took
// again (locks stack: two locks need two unlocks), not a setting, not a
// role or session authorization it switched to, not a temporary table, a
// LISTEN or a cursor; a transaction-scope call, and a batch, reset in
// COMMIT's round trip the same way (that round trip is COMMIT's: the
// caller's ctx governs it, not CleanupTimeout). Handles and Hold, whose connections
// run only this package's statements, unlock their own keys without a
// reset, and so does a callback that sent nothing on its connection (on
// Linux over TCP the kernel's counts for the socket tell: see pooltx's
// "Work that sent nothing"), which cannot have changed the session's state; its
// transaction-scope form ends with COMMIT alone. The unlock's boolean is checked: false means the lock was not held
// any more, which the call reports as [ErrNotHeld] while the connection is
// destroyed (and, on a shared holder connection, every other lock on it is
// lost: see below).
//
// # Stacking
//
// PostgreSQL advisory locks are re-entrant per session: a session that
// holds a key can lock it again, and must unlock it as many times. The
// callback helpers take each key once per call. Contention is between
// sessions, and this package never takes a key a second time on a
// connection that holds it: a second WithLock call always uses another
// connection, and a held lock never shares a connection with another lock
// of the Locker on any of its keys (see below), so two concurrent calls on
// one key exclude each other even in one goroutine (which is why a nested
// call on the same key waits for itself until its timeout).
//
// # Held locks share connections
//
// Held locks ([Locker.Lock], [Locker.TryLock], [Locker.LockAll],
// [Locker.TryLockAll], [Locker.Hold] and its forms) share holder
// connections by default: a thousand held locks of one Locker can live on
// one connection and one server backend, not a thousand. The rules:
//
//   - A Try call runs on a holder connection that already holds other
//     locks of the Locker and none of the call's keys, else on a new
//     connection, which becomes a holder connection if the keys are
//     granted; Try calls that arrive while it is being opened share it. A
//     blocking call is tried there first (unless other calls of the
//     Locker are in its first key's local queue); when a key is busy,
//     or no holder connection can take the keys, it takes them on a
//     connection of its own, waiting there as WithLock does if it must,
//     and once granted that connection becomes a holder connection that
//     later calls share. So blocking calls that arrive together before
//     any holder connection exists each draw a connection of their own: on
//     a pool smaller than such a burst, the calls beyond it wait for a
//     connection within their bound and fail with ErrNoConnection when it
//     runs out (50 concurrent first Locks on a pool of one: 49 did), where
//     50 concurrent first TryLocks share one. Take the first lock before
//     the burst, or size the pool for it. A holder connection (one shared with other
//     held locks) never waits for a lock.
//   - A statement on a holder connection that holds other locks is bounded
//     by Config.CleanupTimeout (HeartbeatTimeout when heartbeats run and it
//     is shorter), plus 20 µs for each key of the call beyond the first
//     1,000 (Config.MaxKeys raised: the server's own time for them), not by
//     the call's own bound: cutting it short at a
//     caller's bound would lose the other locks held there. On a connection
//     opened for the call, which holds nothing else, it is bounded as a Try
//     call's statement is (Config.LockTimeout, else DefaultTryConnWait, if
//     shorter). A holder connection whose server does not answer in time is
//     lost, with its locks (their Done channels close), and the call goes on
//     on another connection (ErrNoConnection when that one does not answer
//     in time either). The wait for a holder connection's turn is bounded
//     by the call's bound.
//   - PostgreSQL's session locks stack within a session (a key taken twice
//     is granted twice, and an exclusive request is granted to the session
//     that holds the key shared), so the Locker keeps its own record of the
//     keys and modes of each holder connection and never sends a request to
//     one that has any of its keys, in either mode: such a request goes to
//     another holder connection or a connection of its own, where
//     PostgreSQL decides. Two shared requests for one key take two
//     connections, so that a shared lock of this Locker never overtakes
//     another session's exclusive request queued for the key.
//   - One statement at a time runs on a holder connection, only this
//     package's (try-locks, unlocks of exactly the unlocking lock's keys,
//     heartbeat pings), each under the Locker's own bound: Config.
//     CleanupTimeout, and at most Config.HeartbeatTimeout when heartbeats
//     are on. A caller's context governs only its wait for its turn; once
//     its statement is sent the call waits for the answer, so a cancelled
//     caller never makes pgx cancel or close a connection that holds other
//     callers' locks, and a key granted to a caller that has gone is
//     unlocked at once.
//   - A holder connection goes back to the pool when the last of its locks
//     is unlocked, every unlock having answered true. An unlock that answers
//     false puts it in doubt: it is destroyed.
//   - One watcher and one heartbeat serve each holder connection, not each
//     lock. When it dies, every lock on it is lost (see Long holds and lost
//     locks): each handle's Done closes, each Hold's context is cancelled
//     with cause [ErrLockLost], and each loss is traced once.
//   - Config.MaxConns counts holder connections (and connections that
//     wait). [Locker.WithLock] and [Locker.WithLockAll] keep a connection
//     of their own, since their callbacks may run anything on it;
//     Config.DisableMultiplexing gives every held lock one too, as before.
//
// # Cancellation and doubt
//
// After any error from a lock statement the library treats the outcome as
// unknown: the lock may have been granted just before a cancel took effect
// (with pgx's CancelRequestContextWatcherHandler the server can answer
// 57014 while holding the lock), or a multi-key statement may have taken
// some keys before failing. The session's advisory locks are then released
// with pg_advisory_unlock_all under a fresh context bounded by
// Config.CleanupTimeout, or, if that fails or the connection was closed,
// the connection is destroyed. A lock granted after the caller's context
// has ended is released at once. A connection to which the library sent a
// cancel request that the wait did not consume (the lock was granted
// first) is destroyed rather than pooled: PostgreSQL applies the request
// asynchronously and could cancel the next borrower's statement. Unlock,
// rollback and close always run under context.WithoutCancel with that
// bound.
//
// A panic raised inside the library's own statements by code of the
// pool's (a pgx QueryTracer or BatchTracer in the pool's ConnConfig)
// leaves the outcome unknown too: the connection is destroyed, which ends
// its session and every lock on it (a shared holder connection's other
// locks are then lost, as when its session dies; a handle whose Unlock
// panicked is lost: Done closes, Err and a later Unlock match
// ErrLockLost), its slot of Config.MaxConns is given back, and the panic
// goes on up. The exception is a held lock's watcher, which reads the idle
// connection on a goroutine of the library's, where nobody could recover a
// panic: one of the pool's OnNotice or OnNotification handler there (a
// NOTIFY to a channel the pool's AfterConnect LISTENs to, say) is
// recovered, and the lock is lost as when its connection dies ([ErrLockLost],
// the panic's value in the cause: in its chain, when it is an error).
// pgx runs those two handlers inside the read that receives the message,
// the watcher's included, and a handler that blocks holds that read: the
// watcher then sees no loss (no heartbeat runs) and a statement on that
// connection, an Unlock's included, returns only once the handler does,
// past its bound. Keep them short, or hand the message to a goroutine of
// your own. A pgxpool hook that panics while the library draws a
// connection (PrepareConn, say) gets the slot back too, but pgxpool
// itself (v5.12) then keeps the connection it was preparing acquired for
// good, and Pool.Close waits for it: do not panic in pool hooks. pgx's
// tracers see the arguments of the library's one-key statements as
// pointers into the call's state, valid during the statement only (they
// print as the key or the setting's text).
//
// # Timeouts
//
// A blocking wait is bounded by Options.Timeout, else Config.LockTimeout,
// else only by the context. The bound, and a context deadline (whichever is
// sooner), becomes PostgreSQL's lock_timeout for that wait only: set with
// set_config(..., true) inside the lock statement's own implicit
// transaction for session locks, and, for transaction locks, set back to
// the session's own value (with SET LOCAL) before the callback. It never reaches the pool. PostgreSQL applies
// lock_timeout to each lock wait separately; for a multi-key call the lock
// statement sets it again before each key to what is left of the bound,
// measured on the server from the start of the statement's transaction, so
// the bound covers the whole call. A wait that times out ends with
// SQLSTATE 55P03 on a healthy connection, which goes back to the pool; the
// call returns [ErrLockTimeout] (together with context.DeadlineExceeded
// when the deadline caused it).
//
// A bound longer than PostgreSQL's maximum lock_timeout, 2147483647 ms
// (about 24.8 days), is cut to it; a longer wait ends there with
// [ErrLockTimeout].
//
// An explicit cancellation during the wait sends PostgreSQL a cancel
// request, which ends the wait server-side (57014) and keeps the
// connection. A call whose context ends after it got its connection but
// before its lock statement is sent sends nothing and returns the
// context's error, keeping the connection. PostgreSQL ignores a cancel
// request that reaches the backend before it has begun the statement
// (while it is still reading it), so a cancellation in that short window,
// about the network's latency, is lost: the wait then goes on until a
// backstop, half a second later, closes the socket, and the connection is
// destroyed. The same backstop ends a wait whose server does not answer the
// cancel request within half a second (a frozen server or network). (Closing the socket alone is not enough: a backend waiting for
// a lock does not read its socket, so it would stay queued in pg_locks
// until granted. Setting client_connection_check_interval on the server
// makes such orphaned waiters leave the queue too.)
//
// Of the goroutines of one Locker that wait for the same key, only the first
// two wait on the server, pinning a connection each; the others queue in
// process, in arrival order, without one (see Config.MaxConns for a hard
// cap). The second waiter on the server is what keeps the Locker's place
// in PostgreSQL's FIFO queue when the first is granted, so that another
// process's waiters cannot take every turn in between. A
// multi-key call queues this way for its first key only (in keys.Compare
// order), and a shared multi-key call not at all, so a call never waits in
// process for a key PostgreSQL would grant it. The timeout bounds the whole
// wait, queue included.
//
// # Server timeouts
//
// Timeouts set for the role or in the connection string apply to the
// library's statements as to any other:
//
//   - lock_timeout: a call with no bound and no context deadline waits as
//     long as it allows, then fails with [ErrLockTimeout] (55P03). Any bound,
//     a context deadline included, replaces it for the wait only; a
//     transaction callback runs with it (or with the session's own, from
//     a SET in AfterConnect, as first found on the connection: see
//     WithXactLock).
//   - statement_timeout ends a lock wait that outlasts it, whatever the
//     call's bound, in every blocking form: [ErrLockTimeout], with the
//     57014 kept in the chain. A 57014 from the library's cancel request,
//     sent when the context is cancelled, is the context's error, not a
//     timeout. Another session's pg_cancel_backend is no timeout either
//     where the server's messages are in English (lc_messages), the only
//     language in which the client can tell it from statement_timeout;
//     in any other it reads as [ErrLockTimeout] too (the wait ended on the
//     server; nothing is held).
//   - idle_session_timeout ends a held [Lock]'s idle session if it is
//     shorter than Config.HeartbeatInterval (each heartbeat ping is
//     activity): the lock is lost ([ErrLockLost], 57P05). Keep
//     HeartbeatInterval below it. A WithLock callback that idles past it
//     loses the lock the same way ([ErrLockLost]).
//   - idle_in_transaction_session_timeout: a WithXactLock callback that
//     idles past it loses its session; the transaction is rolled back, the
//     lock goes with it, and the call fails with COMMIT's error
//     (pooltx.ErrNotCommitted, the 25P03 kept: PostgreSQL checks for that
//     timeout after reading COMMIT and before running it, so nothing was
//     committed); one that then runs a statement, or its own COMMIT, and
//     ignores its error has found the connection closed:
//     pooltx.ErrCommitUnknown, without the 25P03. A WithLock callback that
//     idles inside its own BEGIN gets [ErrLockLost] and [ErrCallbackInTx]
//     (the 25P03 kept); one that then runs a statement and ignores its
//     error has found the connection closed, and gets [ErrLockLost] alone.
//
// # Deadlocks
//
// Two callers that lock the same keys in opposite orders deadlock;
// PostgreSQL detects it after deadlock_timeout and fails one with 40P01
// ([ErrDeadlock]). The multi-key calls ([Locker.WithLockAll],
// [Locker.WithXactLockAll], ...) sort and de-duplicate their keys with
// keys.Compare and take them in that order in one round trip, so callers
// that pass all the keys of a critical section to one call never deadlock
// each other. Taking keys one call at a time, nested, gives up that
// guarantee, and worse: a call that waits does so on a connection of its
// own, so a holder that asks for a key held by a goroutine which is waiting for the holder's
// key closes a cycle through the client that PostgreSQL cannot see. Such
// nested calls across connections are never reported as a deadlock (40P01):
// they end at their timeout, or wait for ever without one. A wait in a
// Locker's local queue (see Timeouts) is likewise invisible to PostgreSQL's
// deadlock detector.
//
// # Capacity
//
// Every held key is an entry in the cluster's shared lock table, sized by
// max_locks_per_transaction x (max_connections + max_prepared_transactions)
// (about 6,400 to 12,900 with defaults). When it is full, PostgreSQL fails
// lock requests with 53200 ([ErrTooManyLocks]) in every session, new
// logins included. Config.MaxKeys (default [DefaultMaxKeys]) caps the keys
// of one call before any SQL is sent; a 53200 part-way through a multi-key
// call leaves nothing held.
//
// # Errors
//
// Every failure is a [*LockError] naming the operation and keys; it matches
// the sentinels ([ErrNotAcquired], [ErrLockTimeout], [ErrNoConnection],
// [ErrDeadlock], [ErrTooManyLocks], [ErrNotHeld], [ErrLockLost],
// [ErrCallbackInTx], [ErrTxAborted], [ErrInvalid]) with
// errors.Is and keeps
// the *pgconn.PgError and, when the context ended, the context's error in
// its chain. A lock wait that another session's pg_cancel_backend ended
// matches none of them where the server's messages are in English (see
// "Server timeouts"): the *LockError keeps the server's 57014, nothing is
// held, and the callback did not run. Neither does an unlock that code of
// the pool's refused on a connection still open (a tracer's cancelled
// context, a codec that cannot scan the result) after a callback that ran
// under the lock: that *LockError wraps a pooltx.CleanupError, and the
// connection was destroyed, which releases the lock as its backend exits
// (within milliseconds: see pooltx, "Destroying lets go at once"). A callback's own
// error is returned unchanged. Only a wait for
// a lock is a lock timeout: a call that could not get a connection in time
// (pool or Config.MaxConns exhausted, a server that cannot be reached or
// does not answer) fails with [ErrNoConnection]. A Try call never waits
// for a lock and waits for a connection at most Config.LockTimeout, else
// [DefaultTryConnWait].
//
// # Long holds and lost locks
//
// A session lock lives exactly as long as its connection. When the
// connection dies (failover, pg_terminate_backend, a restart, a network
// cut) PostgreSQL releases the lock at once and another process may take
// it while the first still works. [Locker.Lock] handles and [Locker.Hold]
// callbacks have their holding connection watched while it is idle (one
// watcher per holder connection): a terminated backend or a closed socket
// is seen within milliseconds without any traffic, and a bounded ping when
// the connection has not answered for Config.HeartbeatInterval catches a
// frozen server or a silent partition within HeartbeatInterval +
// HeartbeatTimeout. The loss of a connection is the loss of every lock on
// it: it closes each one's Done, cancels each Hold's context with cause
// [ErrLockLost], is logged and traced once per lock, and destroys the
// connection. A loss that an unlock finds
// first (Lock.Unlock, Hold or WithLock finding the connection dead) is
// reported the same way: the error and Lock.Err match [ErrLockLost], and
// the tracer gets one TraceLost (no TraceRelease), so each lost lock is
// counted once. Work whose correctness needs
// more than "stop soon" should also carry a fencing token (see package
// lease).
//
// A pooled connection whose server went away while it sat idle (a
// restart, a failover) is only found dead when used. A lock call that draws
// one, and finds it closed before anything was locked, retries once within
// the same timeout: a dead session holds nothing. The retry runs on a
// connection just pinged (pgxpool itself pings only connections idle for
// over a second, so the next idle ones may be dead too); dead candidates
// are destroyed, and if no live connection can be had the call fails with
// [ErrNoConnection]. A session the server ends with an error of its own
// statement (a lock wait's 55P03 under exit_on_error, which makes it
// FATAL) is not retried: the call fails with that error ([ErrLockTimeout]
// with the 55P03). A session ended by an operator (SQLSTATE class 57P:
// pg_terminate_backend, a shutdown) while the call waited cannot be told
// from one that died idle: it is retried once, within the same timeout.
//
// # Failover
//
// Advisory locks, session and transaction scope alike, live in the
// primary's memory and are not replicated: a standby holds none of them,
// and after a promotion every lock taken on the old primary is gone. Point
// the pool at all the servers with target_session_attrs=read-write (for
// example host=a,b port=5432,5432 target_session_attrs=read-write), so that
// new connections go to whichever accepts writes.
//
// A standby grants advisory locks too, but only against its own sessions.
// So every call that locks refuses a connection to a hot standby with
// [ErrStandby] (PostgreSQL 14 and later report in_hot_standby to the
// client; a connection that says so is asked again first, in case its
// server was promoted since): a pooled one is destroyed, and nothing is
// locked. [Config.AllowStandby] lifts the refusal for a fleet that locks on
// one standby only. Earlier servers do not report it, and are not checked.
//
// When the old primary stops, a [Lock] handle's Done closes, a
// [Locker.Hold] callback's context is cancelled with cause [ErrLockLost],
// and [Locker.WithLock] returns an error matching [ErrLockLost] (the
// callback's next statement on its connection fails; the unlock finds the
// session gone). A closed socket is seen at once, with no heartbeat. An
// in-flight [Locker.WithXactLock] returns COMMIT's pooltx.ErrNotCommitted,
// or pooltx.ErrCommitUnknown where the shutdown's FATAL is what answers the
// COMMIT (a FATAL there does not say whether the commit ran: a backend
// terminated while it waits for a synchronous standby has committed
// locally), or the callback's own statement error, and none of its work is
// on the new primary, even with synchronous replication.
//
// When the old primary is cut off but not dead (a silent partition), it
// keeps the locks: nothing tells it the holders are gone. The heartbeat
// tells a handle and a Hold callback within about HeartbeatInterval +
// HeartbeatTimeout (defaults [DefaultHeartbeatInterval] and
// [DefaultHeartbeatTimeout]; lower them to learn sooner, at the price of a
// ping per holder connection per interval); a WithLock callback learns when a
// statement on its connection fails, so bound its statements with a
// context deadline. Until then, and for a holder that ignores the signal,
// two processes may act as owners of one key, one per primary: a lock
// cannot prevent that, fencing can. Leases (package lease) give every
// acquisition a fencing token that a protected write checks, and their
// tokens stay greater after a promotion (see "Fencing tokens across a
// failover" in package lease).
//
// After the promotion, new calls on the same pool take the keys on the
// promoted server. Set pgxpool.Config.PingTimeout (say 1 s) when the old
// primary may go silent rather than die: pgxpool pings a connection idle
// for over a second before handing it out, bounded by nothing but the
// caller's context unless PingTimeout is set, so a pool holding idle
// connections to a silent old primary makes a new call wait its whole
// timeout and fail with [ErrNoConnection]; with PingTimeout those pings
// fail, pgxpool drops the connections and opens new ones to the promoted
// server. Tests: advisory_test/failover_test.go.
//
// # Operating the server
//
//   - client_connection_check_interval (PostgreSQL 14+), e.g. 1s: a backend
//     waiting for a lock does not read its socket, so a client that died
//     while waiting stays queued in pg_locks, and is even granted the lock,
//     until its turn comes. With the setting the server notices within the
//     interval. (Waits this package cancels send a cancel request instead.)
//   - TCP keepalives: tcp_keepalives_idle/interval/count on the server, and
//     keepalives_idle etc. in the client's DSN, so that a holder or waiter
//     behind a dead network path is dropped, and its locks released, in
//     seconds rather than the kernel's default of hours.
//   - max_locks_per_transaction sizes the lock table (see Capacity).
//   - To find and end a stuck holder: [ListLocks] (or "pgxlock locks"),
//     then pg_terminate_backend(pid); a holder using this package learns
//     of the loss and stops.
//   - search_path: every function, operator, type and relation the
//     package's statements name (those of [ListLocks] included) is named in
//     pg_catalog, so a search_path that lists another schema before
//     pg_catalog (from the connection string, ALTER ROLE ... SET or
//     AfterConnect), where someone has created a function, operator or type of
//     the same name, cannot redirect them (the pattern of CVE-2018-1058).
//     The SQL of a callback or batch is the caller's: it resolves names as
//     the session's search_path says.
//
// # PgBouncer
//
// Behind PgBouncer in transaction pooling mode a session lock belongs to
// whichever server connection ran the statement, and the next statement may
// run on another: session locks silently stop excluding anybody. Use the
// transaction-scope calls there (they keep every statement in one
// transaction, so they work, the in-tx calls included), with a pgx exec mode PgBouncer accepts
// (QueryExecModeExec or QueryExecModeSimpleProtocol).
package advisory

// Package lease provides table-backed leases: mutual exclusion for critical
// sections that call the outside world (a payment or identity provider, with
// retries and back-off for seconds) without holding a database connection or
// transaction while they do.
//
// A lease is a row claimed by one compare-and-swap statement, committed at
// once, and released by another statement. Between the two, nothing is held in
// PostgreSQL: no connection, no transaction, no lock. A TTL is the safety net:
// a holder that crashes stops renewing, and after the TTL the next acquirer
// takes the lease over.
//
// # Two forms
//
// A column lease ([Column]) lives in three columns of a row you already have,
// the "users.identity_action_locked_at" pattern: a nullable timestamptz or
// timestamp of any precision (when locked), the owner token of the current
// acquisition, and a fencing counter.
// Acquisition is one statement,
//
//	UPDATE users SET locked_at = now(), locked_by = $token, lock_fence = lock_fence + 1
//	WHERE id = $1 AND (locked_at IS NULL OR locked_at < now() - $ttl)
//
// that either changes one row (held) or none: [ErrNotAcquired] when someone
// else holds a live lease, [ErrNotFound] when no row has that id. (The real
// statement raises lock_fence + 1 to the server's timeline floor: see
// "Fencing tokens across a failover"; and subtracts from now() - $ttl half a
// unit of the locked-at column's precision: see "Time is the database's".) Two racing
// statements cannot both win: the second waits for the first's row lock, then
// re-evaluates its WHERE clause against the committed row and matches nothing
// (see Isolation and time zones below). It waits at most [TryLockTimeout] for
// a row lock: a row locked longer, by a transaction that is not a lease
// statement, is reported busy.
// Renew and Release are scoped to the owner token, which is fresh for every
// acquisition, and to the fencing token, which the fence column holds while
// the acquisition does, so a holder whose lease was taken over can neither
// extend nor clear the new holder's, and a [ColumnRef] with an edited owner
// or token matches nothing. Column leases are non-blocking (TryAcquire, TryDo):
// a caller that finds the row busy usually answers "409 Conflict".
//
// A lock-manager table ([Manager]) is Fowler's pessimistic offline lock: a
// table of holders (resource, owner, mode, token, acquired_at, expires_at,
// metadata) created by [Manager.Migrate], with a companion table holding one
// row per resource (its fencing counter and any waiting writer's intent). It
// offers exclusive and shared modes, blocking [Manager.Acquire] and
// [Manager.TryAcquire], Renew and Release on the [Lease], and the table-wide
// [Manager.ReleaseAll], [Manager.Sweep] and [Manager.List]. An acquisition is
// one round trip that locks the resource's counter row for the microseconds
// of its decision (so decisions about one resource are taken one at a time)
// and commits before it returns.
//
// Neither form may run inside a transaction that also does the external call:
// that would hold a connection for the whole call and make the claim invisible
// until commit. Both take a *pgxpool.Pool, not a pgx.Tx, for that reason.
//
// # Waiting
//
// A blocking Acquire first tries once. If the lease is busy it subscribes to
// the table's NOTIFY channel and tries again when a release (or give-back,
// ReleaseAll, Sweep) of that resource is notified, or after a jittered poll
// interval, or right after the moment the database says the blocking lease
// expires (an expiry sends no notification). All waiting calls of a Manager
// share one dedicated connection for LISTEN, opened from the pool's
// connection config (the pool's BeforeConnect and AfterConnect hooks do not
// run for it, an OnNotification handler of that config is not called for
// it, the Manager reading its notifications itself, and its Tracer does
// not see it; an idle_session_timeout, PostgreSQL 14 and later, is turned
// off on it, as it sits idle by design), held only while
// someone waits and then closed: it never takes
// a pooled connection, so a pool of one connection is enough, and a
// connection that ran LISTEN never goes back to the pool. Attempts borrow a
// pooled connection for one round trip. (A blocking attempt waits for the
// resource's row lock as long as ctx allows, so that a writer blocked by
// readers always gets to store its intent; only the Try calls give up after
// [TryLockTimeout].) A release wakes every waiting
// reader of the process but only the longest-waiting writer. The context
// governs the whole wait; when it ends, Acquire returns an error wrapping
// both [ErrNotAcquired] and the context's cause.
//
// # Deadlines
//
// Every call returns within its context's deadline plus at most one
// ReleaseTimeout (ManagerConfig, ColumnConfig; default 5s), also through a
// frozen network: the clean-up a call may owe after its context ends (giving
// back an attempt whose outcome is unknown, clearing a writer intent,
// closing the LISTEN connection) runs under fresh contexts bounded by
// ReleaseTimeout, concurrently, never one after another. Do adds the
// callback's own time and one bounded release.
//
// # Shared mode and writer preference
//
// Shared leases coexist with each other and exclude exclusive ones: many
// readers, no writer. A continuous stream of overlapping readers would starve
// a writer that waits for "no readers", so writers are preferred over new
// readers: a blocking exclusive Acquire that is refused because readers hold
// the resource stores a writer intent on it, and from then on new shared
// acquisitions are refused (they wait), while the readers already inside
// finish. The writer gets in as soon as they leave, and clears its intent
// when granted or when it gives up. The intent lasts three poll intervals
// and is refreshed at every attempt, so a writer that dies while waiting
// blocks readers only briefly. TryAcquire never registers an intent.
// [Manager.ListIntents] (and pgxlock leases) show the intents, which is why
// readers may be refused while [Manager.List] shows no exclusive holder.
//
// Readers must not starve either. A writer that is refused because another
// writer holds the resource stores no intent (and withdraws one it had), and
// an exclusive grant clears any intent: the other writers are shut out by
// the holder anyway. So when a writer leaves, no intent is left from its
// tenure; its release wakes every waiting reader of each process and one
// waiting writer, and they compete for the next turn on equal terms. Once a
// reader is in, the next writer's intent closes the door behind the readers
// that made it, as sync.RWMutex does. Neither side is starved: in
// TestReadersAndWritersBothProgress (4 writers and 4 readers, each holding
// 10ms and pausing 5ms, for 4s, on two pools) every goroutine of both sides
// is granted; the turn order is a race, not a strict alternation.
//
// # Upgrade, and several resources
//
// [Lease.TryUpgrade] turns a Shared lease into an Exclusive one, keeping its
// fencing token, when it is the only live holder of the resource, and
// otherwise refuses at once with [ErrNotAcquired]: it never waits, so two
// readers that both try to upgrade are both refused at once instead of
// deadlocking. There is no waiting upgrade. A holder of a Shared lease that
// calls Acquire for an Exclusive lease of the same resource is not
// recognised as the same party: it waits for its own shared lease to end,
// that is until its context ends, and its writer intent refuses other
// readers meanwhile. To wait for the other readers, release the shared lease
// first, then acquire the exclusive one (and re-read what the shared lease
// protected).
//
// [Manager.AcquireAll] and [Manager.TryAcquireAll] lease several resources,
// all or nothing: they sort the names and acquire in that order, as the
// advisory multi-key calls do, so callers asking for the same resources in
// different orders never each hold what the other waits for; on failure
// they give back what they took.
//
// # Isolation and time zones
//
// Every lease statement runs in its own short transaction, sent in one round
// trip with its frame,
//
//	BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;
//	SELECT set_config('TimeZone', 'UTC', true),
//	       set_config('synchronous_commit', <local if it is off, else as it is>, true),
//	       set_config('search_path', 'pg_catalog, ' || <the session's search_path>, true)
//	       [, set_config('lock_timeout', ...)];
//	<the statement>; COMMIT
//
// whatever the session defaults are. The compare-and-swap needs READ
// COMMITTED: under REPEATABLE READ or SERIALIZABLE (default_transaction_isolation)
// a racing UPDATE fails with 40001 instead of matching no row; here no
// serialization failure reaches the caller (except from a table partitioned
// by a lease column: see "Triggers, rules and partitions"). TimeZone UTC makes a timestamp
// (without time zone) lock column hold UTC for every session, so sessions in
// different zones agree on whether a lease is live. Both settings are
// transaction-local and end with the transaction (the search_path too: see
// "Time is the database's"); a transaction left
// aborted is rolled back, or its connection destroyed (package pooltx).
// Migrate, which runs DDL, is the one exception (see [Manager.Migrate]).
// One default reaches outside the frame: in pgx's default exec mode a
// connection's first use of a statement prepares it before the
// transaction, under the session's defaults; with
// default_transaction_isolation serializable, default_transaction_read_only
// and default_transaction_deferrable all set, that can wait for a safe
// snapshot while a serializable read-write transaction runs, which
// TryLockTimeout does not bound: the call ends with its context's error,
// not ErrNotAcquired. Set those defaults per transaction rather than for
// the pool's sessions. For the same reason a table lock held on the lease
// tables (VACUUM FULL, CLUSTER, most ALTER TABLE, LOCK TABLE) is waited for
// without TryLockTimeout by a connection's first use of a statement: a Try
// call on a fresh connection then waits until the lock is gone or its
// context ends (with the context's error), where one on a connection that
// has run it before answers ErrNotAcquired after TryLockTimeout. Bound such
// calls with their context.
//
// # Durability
//
// A lease call returns only once its commit is durable on the primary: an
// acquisition, renewal or release that returned survives a crash of the
// server, so tokens are never handed out twice and a released lease never
// comes back. With synchronous_commit = off, set anywhere (postgresql.conf
// or ALTER SYSTEM, the database, the role, the DSN, the session), COMMIT
// would return before the WAL is flushed and a crash would lose it, so the
// frame raises off to local for the lease transaction (local waits for
// the primary's flush, not for synchronous standbys). Any other value
// (local, remote_write, on, remote_apply) already waits for the local flush
// and is kept, so synchronous standbys are waited for as
// synchronous_commit and synchronous_standby_names say; what a failover
// loses with asynchronous standbys is in "Fencing tokens across a
// failover". Nothing in a session can undo fsync = off on the server.
// TestTokensSurviveServerCrash crashes a private server (pg_ctl stop -m
// immediate) with synchronous_commit off at each of the server, database,
// role and session levels. The cost is one WAL flush per lease call, which
// sessions with synchronous_commit on already paid: for them nothing
// changes; sessions with it off now pay it. Measured on a loaded machine
// (PostgreSQL 15 with fsync on, 2 shared vCPUs, load average 12-17, where a
// WAL flush took 1-8ms), medians of six: a column acquisition plus its
// release (go test -bench ColumnAcquireRelease/lease, two transactions)
// went from 0.46ms to 1.04ms with synchronous_commit = off, a manager one
// from 0.57ms to 1.45ms; the frame with the same lease-shaped transaction
// in pgbench, means of three runs: 1.3ms to 3.8ms with synchronous_commit =
// off, 4.7ms and 4.8ms (no change beyond noise) with it on.
//
// # Time is the database's
//
// Every expiry is computed in SQL from now(), the start time of the
// statement's transaction on the server, and compared there; TTLs travel as
// interval parameters. No client clock reaches a lease decision, so clock
// skew between application hosts does not matter. The local clock is used in
// exactly one place, and only to give up early: the trust window of [Do]
// (below), measured with Go's monotonic clock from before the acquiring
// statement was sent, which is never later than the server's now().
//
// A search_path cannot give the leases another clock or other arithmetic:
// the frame puts pg_catalog first on the transaction's search_path, ahead of
// the session's own, so a schema listed before pg_catalog in the session's
// search_path, in which someone has created look-alike functions, operators
// or types (CVE-2018-1058's pattern), is not used for the built-in ones.
// Two things the order alone would not settle are named in pg_catalog
// explicitly: every cast's type (pgx prepares a statement before its
// transaction, under the session's search_path, and a cast fixes a
// parameter's type there) and the few operators with no exact match in
// pg_catalog (for those PostgreSQL takes an exact match from any schema of
// the path), as is everything in the frame's own statement; so are the
// comparisons of a column lease's locked-at, owner and fence columns, and
// every function and operator of the fencing token's arithmetic and of the
// lease ids' concatenation, and every function and aggregate of the
// lock-manager statements (count, min, bool_or, pg_notify). A look-alike
// whose result type differs from
// pg_catalog's (a * on bigints returning boolean) is seen by pgx's
// preparation, which runs before the frame: where it stands for an
// operator this package does not name in pg_catalog (a comparison of the
// lock-manager tables' columns, say), that preparation fails, in the cache
// exec modes, with an error (42804, 42883, ...), and nothing runs; a
// look-alike is never executed in place of pg_catalog's. The
// tables, and the comparison of a column lease's id column (whose type may
// come from any schema: citext, a domain), still resolve through the rest of
// the path; for an id column of type varchar or a domain, which has no
// exact operator in pg_catalog, an exact look-alike = anywhere on the path
// decides which row a statement takes, so keep schemas that others can
// create objects in off the search_path. A few statements run outside a
// frame and resolve names through the session's search_path, as your own
// SQL does: the DDL of Migrate (its tables go to
// the first schema of the search_path when the config names none), which
// names in pg_catalog the types of the columns it creates, its CHECK's
// operator, and the functions and relations of its catalog checks;
// [Manager.List] and [Manager.ListIntents] (one read-only query each, whose
// functions, casts and operators are all named in pg_catalog, so only their
// tables resolve through the path); and [Fence.Update], which runs in your
// transaction.
//
// A column lease stores when it was locked, not when it expires, so every
// process leasing the same column must use the same TTL.
//
// The locked-at column may have any precision: timestamptz(p) and
// timestamp(p) with p from 0 to 6, or none (6). A column of precision
// p < 6 rounds the assigned now() to the nearest unit of 10^-p seconds, so
// the stored time may be up to half a unit (0.5s at p = 0) before the
// acquisition or renewal really happened. The rule: a lease can be taken
// over only once the TTL has passed since the now() of its last
// acquisition or renewal, on every precision. The takeover check and the
// renewal check therefore compare the stored time with now() - TTL - half a
// unit of the column's precision, which every statement reads from the
// catalog (pg_attribute; a domain over timestamptz(p) is read through to p,
// a domain over a domain is taken as precision 0), so a lease on
// a timestamptz(0) column is taken over between TTL and TTL + 1s after its
// last acquisition or renewal, and the holder's trust window (below), which
// closes before TTL, always closes before a takeover.
// TestOneHolderOnEveryTimestampPrecision checks it on a ledger of the
// statements' now() for precisions 0-6 of both types. The lock-manager
// table stores expires_at per lease, so TTLs may differ per call; its time
// columns must be timestamptz of full precision, as Migrate creates them, and
// Migrate refuses (ErrInvalid) tables whose time columns were altered to
// another type or precision. A column lease's locked-at column of another
// type than timestamptz or timestamp (a date) is refused by Migrate and by
// TryAcquire (see ColumnConfig.LockedAtColumn).
//
// Every TTL must be at least [MinTTL] (100ms); a shorter one is
// [ErrInvalid]. PostgreSQL truncates intervals below a microsecond to zero,
// so a TTL in the wrong unit (30, meaning 30ns) would otherwise give no
// exclusion at all.
//
// # Row-level security
//
// The lock manager decides from every holder row of a resource, so a
// row-level security policy on its tables would have each role decide from
// the rows the policy shows it: under a policy that shows each role its own
// rows, two roles could both hold a resource exclusively. Every
// lock-manager statement except List and ListIntents therefore runs with
// row_security = off for its transaction: where row-level security applies
// to the caller on a table the statement reads, under any policy (even
// USING (true), which hides nothing: PostgreSQL refuses by whether policies
// apply, not by what they would hide), it fails with SQLSTATE 42501 (a
// *Error wrapping the *pgconn.PgError) and changes nothing. Every statement
// reads the holders table, so there a lease taken before row security was
// enabled can then be neither renewed nor released, and ends at its TTL;
// the resources table is read by the acquisitions, upgrades and give-backs
// only. Roles that bypass row security (the tables' owner when FORCE
// ROW LEVEL SECURITY is not set, superusers, BYPASSRLS roles) are
// unaffected. List and ListIntents, read-only inspections, show what the
// policies let the caller see. Column leases keep row security: each
// statement matches one row by its key, and a row a policy hides from the
// caller is never taken: it is reported as not found (ErrNotFound), or as
// busy (ErrNotAcquired) where a policy shows it to SELECT but hides it from
// UPDATE. [Fence.Update]
// runs in your transaction, under your session's row_security.
//
// # Choosing the TTL
//
// The TTL must be longer than the worst case of the critical section,
// including every retry and back-off of the external calls, not their median.
// A TTL that is a little too long only delays recovery after a crash; one that
// is a little too short lets a second holder in while the first is still
// working, which is exactly the race the lease exists to prevent. With [Do],
// renewal makes the TTL a bound on how long a frozen or partitioned holder
// keeps others out, rather than on the whole operation; pick it above the
// longest pause you want to tolerate between renewals (GC, network, a slow
// database), and keep fencing for the pauses beyond it.
//
// # Fencing tokens
//
// Every acquisition of either form returns a token that is strictly greater
// than the token of every earlier acquisition of the same resource, across
// releases, expiries, takeovers and restarts. A lease only promises exclusion
// while its holder is alive and on time; a holder paused past its TTL can
// wake up and write after its successor started. A store that remembers the
// highest token it accepted can refuse such a late write:
//
//	UPDATE accounts SET balance = $3, fence_token = $2
//	WHERE id = $1 AND fence_token <= $2
//
// [Fence.Update] runs that statement and reports a stale token as
// [ErrLeaseLost]. It accepts an equal token, so one holder may write several
// times; use < in your own SQL if each acquisition may write once.
//
// Where the tokens come from: the column form raises the row's fence column
// (by one, on a server never promoted) in the acquiring UPDATE itself, under the row lock that decides the
// race, so the counter lives and dies with the row. The lock-manager form
// raises a per-resource counter row in the companion table the same way, under the
// lock that serialises acquisitions of that resource; the row is kept when
// leases are released or swept (never delete it), so tokens never restart.
// A database sequence would also give increasing numbers, but its values are
// handed out outside the lock that orders acquisitions, are not transactional,
// and with CACHE > 1 are not even ordered across sessions; a counter updated
// under the deciding lock needs no such argument.
//
// # Fencing tokens across a failover
//
// A counter is only as durable as the commit that raised it. With
// asynchronous replication a standby may be promoted without the last
// acquisitions the old primary committed: counted from the replicated value
// alone, the new primary would hand out again tokens the old holders already
// have, and [Fence.Update], which accepts an equal token, could not tell the
// holders apart. So a token also carries the server's timeline, the number
// PostgreSQL raises at every promotion. The acquiring statement itself
// computes
//
//	token = greatest(counter + 1, (timeline - 1) << TimelineShift)
//
// and stores it as the new counter, where timeline is read from the name of
// the WAL file the server writes (pg_walfile_name(pg_current_wal_lsn()); no
// privilege needed, no extra round trip). Bit layout of the positive int64,
// while a resource stays under 2^40 acquisitions per timeline: bits 40-62
// hold the highest timeline an acquisition of the resource ran on, minus 1
// (token>>TimelineShift + 1 reads it back); bits 0-39 count the acquisitions
// on that timeline (the first one after a promotion has 0 there). On timeline
// 1, a server never promoted, the floor is 0 and tokens are the plain counter
// 1, 2, 3, ... as they always were: existing tables and rows need no
// migration. The first acquisition of a resource on timeline 2 returns 1<<40
// (1099511627776) and counts on from there; on timeline 3 it is 2<<40.
//
// What is guaranteed, with asynchronous or synchronous replication and within
// the limits below: every token a promoted server issues is strictly greater
// than every token issued on an earlier timeline, including the acquisitions lost in the failover and
// those an old primary that is cut off but still running keeps issuing after
// the promotion (it stays on its old timeline, below the new floor). A
// [Fence] row on the new primary, or any store that has accepted a token from
// the new primary, therefore rejects every write of the old holders once a
// new holder has written. With synchronous replication (the standby named in
// synchronous_standby_names; the tests use synchronous_commit = remote_apply),
// for sessions whose synchronous_commit waits for it (not off, which the
// frame raises to local only, nor local: see "Durability"),
// nothing acknowledged is lost besides: every lease whose acquisition
// returned before the failover is still there on the new primary (it renews,
// and still excludes others), and tokens jump to the new floor rather than
// continue by one.
//
// What is not guaranteed: mutual exclusion across an asynchronous failover.
// A lease lost in the failover does not exist on the new primary, which may
// grant the resource at once while the old holder is still working (its next
// renewal there reports ErrLeaseLost); the tokens order the two holders,
// they do not keep them apart. A store that never sees the new primary's
// tokens, such as a Fence row on the cut-off old primary itself, keeps
// accepting the old holders. And the ordering rests on the promoted server's
// timeline being above that of every server that issued tokens: PostgreSQL
// gives a promoted standby the timeline after the one it replays, or higher,
// but two standbys of one primary that are both promoted take the same
// timeline (a split brain between them), and so can a standby that never
// replayed an earlier promotion, unless the WAL archive holds that timeline's
// history file.
//
// Limits: 2^40 (about 1.1 * 10^12) acquisitions of one resource per timeline
// keep it below the next timeline's floor. Through timeline 8192 tokens stay
// below 2^53, so a JSON reader that parses numbers as float64 (JavaScript)
// reads them exactly. Timelines up to 2^23 (8388608) fit
// the format; on timeline 8388609 and above an acquisition fails with SQLSTATE
// 22003 (bigint out of range) rather than issue a negative or wrapped token.
// A column lease's fence column must be bigint, as Migrate creates it: one
// declared integer fails every acquisition after a promotion with 22003
// (integer out of range).
// A server in recovery (a standby) issues no token: the lease frame's BEGIN
// ... READ WRITE is refused there with SQLSTATE 0A000 ("cannot set
// transaction read-write mode during recovery"), and the error wraps the
// server's *pgconn.PgError.
//
// # The Do helper
//
// [Manager.Do], [Manager.TryDo] and [Column.TryDo] acquire, run a callback,
// and release. While the callback runs, an owned goroutine renews the lease
// every TTL/3 (configurable). The callback's context is cancelled, with a
// cause wrapping [ErrLeaseLost] (read it with context.Cause), as soon as a
// renewal reports the lease lost or its row gone, or when the trust window
// closes: start of the winning acquisition (or of the last successful
// renewal) + TTL - margin. Transient renewal errors are retried until then.
// The callback must stop its external work when its context ends. After the
// callback returns (or panics), the renewal goroutine is stopped and waited
// for, and the release runs under context.WithoutCancel with a bounded
// timeout, so a cancelled caller still releases; a release that fails on a
// dead pooled connection is retried within that bound on another, one
// that has just answered a ping. Do
// returns an [*Error] wrapping the callback's error joined with the loss
// (even when the callback returned nil: its work was not protected to the
// end) and with a release that failed for good, wrapping [ErrNotReleased]:
// "the external calls succeeded, the release failed", the lease stays until
// its TTL.
//
// # Do not map the lock columns in an ORM
//
// The column lease's columns must be written only by this package's
// statements. An ORM that maps them writes every mapped field back on save;
// an unrelated save of the same entity from stale in-memory state would then
// silently clear or overwrite a live lease. Leave them out of the entity, as
// you would a version column you manage by hand.
//
// # Triggers, rules and partitions
//
// For the same reason a trigger or rule must not change what this
// package's statements write (the lease columns; in the lock manager's
// tables, every column). A BEFORE UPDATE trigger that keeps the old fence
// makes tokens repeat, one that keeps the old expiry or locked-at time
// makes a renewal report success without extending anything, and a rule
// that replaces the statements breaks them: nothing in the package
// detects it, and exclusion and fencing are lost. Triggers that leave those
// columns alone are fine (an AFTER trigger that audits into another table,
// a BEFORE trigger that sets an updated_at column). A trigger that raises
// an error fails the call with it, a *Error wrapping the *pgconn.PgError,
// and changes nothing; a 55P03 (lock_not_available) it raises reads as the
// lease being busy, ErrNotAcquired. A column lease's table partitioned by
// one of its lease columns moves the row to another partition at each
// acquisition: an acquisition racing one then fails with the server's
// 40001 ("tuple to be locked was already moved to another partition"),
// not ErrNotAcquired.
//
// # Advisory locks, leases and idempotency keys
//
// PostgreSQL advisory locks (package advisory) are the right tool when the
// critical section only talks to the database: they need no TTL and vanish
// with their session or transaction. But a transaction-scoped lock holds its
// transaction, and a session lock pins one connection, for as long as the
// lock is held: seconds of HTTP retries per request would exhaust the pool.
// A lease holds nothing between its two statements, at the price of a TTL to
// choose and a crash-recovery delay. Optimistic locking (a version column)
// detects a conflicting write at the end, after the external side effects
// have happened; it does not prevent the interleaving. Idempotency keys are
// complementary: they make a retry of the same logical request safe, while a
// lease keeps two different requests from interleaving; calls to payment or
// identity providers usually want both. A lease is cooperative (code that
// ignores it is not stopped) and as strongly consistent as the one database
// it lives in.
//
// # Errors
//
// Every error is an [*Error] carrying the operation and resource (cut short
// past [MaxErrorResourceLen]), wrapping [ErrNotAcquired], [ErrLeaseLost],
// [ErrNotFound], [ErrNotReleased], [ErrInvalid], a context error, or a driver
// error; a *pgconn.PgError stays in the chain for errors.As. Bad input (empty
// or oversized resource or id, a nil or typed-nil id, NUL bytes or invalid
// UTF-8, in an id also when it is a named string type, a []byte or a pointer
// to either, a TTL below MinTTL, a renew interval that does not fit in the TTL,
// invalid identifiers (empty, longer than 63 bytes, invalid UTF-8, or
// containing a control character, 0x00-0x1F or 0x7F), a dotted table name, an unknown mode, metadata jsonb
// cannot store) is reported as [ErrInvalid] before any SQL is sent. Identifiers are always quoted with
// pgx.Identifier and values always travel as bind parameters; the
// statement templates' SQL comments are removed before any name is
// substituted into them. The checks assume a UTF8 database: on a database
// with another encoding (LATIN1, say), metadata with a \u escape of a
// character that encoding cannot represent is refused by the server, with
// SQLSTATE 22P05 in the chain, not as ErrInvalid; such a database's
// sessions default to its encoding as client_encoding, which pgx does not
// override (nor one set by ALTER ROLE ... SET client_encoding). pgx sends
// and reads all text as UTF-8, so every lease transaction, List,
// ListIntents and Migrate's DDL run with client_encoding set to UTF8 for
// their transaction wherever the connection's is another: sessions of any
// encoding read one resource name as one name (otherwise two of them could
// both hold its exclusive lease), and the connection's own setting is left
// as it was. What that does not reach, and needs client_encoding UTF8 on
// the connection (in the connection string, or ALTER ROLE ... SET), or ASCII
// names: a pool in QueryExecModeSimpleProtocol (pgx refuses such a session
// for it, with its own error); a Schema, Table or Channel with non-ASCII
// characters (pgx prepares statements, and the listener runs LISTEN, outside
// those transactions); Fence.Update, which runs in the caller's transaction,
// its key converted by the session's encoding. The NOTIFY payload that
// wakes waiters hashes a resource's UTF-8 bytes whatever the database's
// encoding.
//
// If an acquiring statement fails in a way that leaves its outcome unknown
// (the connection broke, or the context ended after the statement was sent),
// the call deletes whatever it may have created, under a fresh context
// bounded by the configured ReleaseTimeout, before returning the error. If
// that fails too, the TTL reclaims the lease.
//
// A [Ref] or [ColumnRef] stored by a client is client input: a resumed lease
// renews for the Manager's TTL whatever the Ref says, an unknown mode is
// refused and an edited one matches nothing, and ColumnRef decodes integer
// ids as int64 (never float64) so it survives encoding/json. Every field of
// either kind edited by hand matches nothing: Renew and Release of a Ref
// match the resource, lease id, token and mode; of a ColumnRef the owner and
// the token (the row's fence column), and the row id as the id column's
// type reads it: an id edited to another spelling of the same value ("05",
// " 5" or "+5" for 5 on a bigint column; another case, or braces, for a uuid)
// names the same row, and still needs that row's owner and token to match. [Column.Resume] refuses
// with ErrInvalid, before any SQL, a token below 1 and an owner that is not
// an owner token this package issues (a lowercase UUID), without quoting it.
package lease

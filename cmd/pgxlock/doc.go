// Command pgxlock is the operator's tool for PostgreSQL advisory locks and
// pgxlock leases: it shows who holds and who waits for which lock, runs a
// command under a cluster-wide lock (a flock(1) for a fleet of machines), and
// lists the leases of a lock-manager table.
//
//	pgxlock locks  [--key K]... [--watch [--interval 1s]] [--json] [--show-query] [--ns NAME=ID]...
//	pgxlock run    --key K [--try | --wait DURATION] [--shared] [--heartbeat 5s] [--grace 10s]
//	               [--foreground] [-v] [--ns NAME=ID]... -- COMMAND [ARGS...]
//	pgxlock leases [--table [SCHEMA.]TABLE] [--resource R] [--owner O] [--json]
//	pgxlock version
//	pgxlock help [COMMAND]
//
// Flags may be written -flag or --flag. It runs on Unix systems.
//
// # Connection
//
// The connection string comes from DATABASE_URL (a postgres:// URL or a
// key=value string); without it, from the libpq variables PGHOST, PGPORT,
// PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE, PGPASSFILE, PGSERVICE and the
// rest that pgx reads, as psql would. Every connection of the CLI has
// application_name "pgxlock-cli" (whatever the settings say), so its own
// backends are easy to tell apart in pg_stat_activity and in `pgxlock locks`.
// A connect timeout of 10 s applies unless connect_timeout is set (to 0 for
// none, in DATABASE_URL or PGCONNECT_TIMEOUT).
//
// # Key syntax
//
// K names an advisory lock the way package keys derives it, in exactly one
// of these forms:
//
//	123                  keys.Int64(123): pg_advisory_lock(123); decimal, optional sign
//	7,42                 keys.Pair(7, 42): pg_advisory_lock(7, 42); no spaces
//	int64:123            the same as 123 (the form `pgxlock locks` prints)
//	pair:7,42            the same as 7,42
//	ns:billing(7)/42     pair (7, 42), as printed for a registered namespace
//	ns:billing/42        pair (7, 42) once billing=7 is known (--ns or PGXLOCK_NAMESPACES)
//	ns:billing/hash:S    keys.Namespace.Hash(S) in namespace billing
//	hash:S               keys.Hash(S) of exactly S, whatever S looks like
//	other text           keys.Hash(K): the first 8 bytes of SHA-256(K) read as a
//	                     big-endian signed bigint, the value Node.js, PostgreSQL
//	                     and every other pgxlock client compute (see package keys)
//
// A typo must not lock another key: text that looks like a mistyped number
// (1,2,3  1e3  0x7b  "7, 42"  " 123"), a prefix that is not one of the four
// above (INT64:5, int:5, or any WORD: such as tenant:acme), and a number that
// does not fit its type (99999999999999999999, 7,3000000000) are usage errors
// (exit 64) that list the accepted forms; write hash:... to hash such a
// string. Whenever K is a hashed string (other text, hash:S, ns:NAME/hash:S),
// pgxlock prints the key it names on stderr. Every form `pgxlock locks`
// prints is valid K, so a key can be copied from its output into
// `run --key` or `locks --key`.
//
// Namespaces are named with --ns NAME=ID (repeatable) or the environment
// variable PGXLOCK_NAMESPACES="billing=7,jobs=8". A named namespace shows in
// the output of pair keys (ns:billing(7)/42) and can be used in K. Where the
// first number of a listed pair key is not a known namespace, the text output
// of `pgxlock locks` says once, under the table, how to name it.
//
// The output never shows the string a key was hashed from: hashed keys are
// printed as int64:N. (The hash is one-way, but a guessable source, such as an
// e-mail address, can be confirmed by hashing candidates.)
//
// # pgxlock locks
//
// Lists the advisory locks held or awaited in the current database
// (advisory.ListLocks: pg_locks joined with pg_stat_activity), holders
// before waiters, one row per lock and session:
//
//	KEY        MODE       STATE    PID    APPLICATION     SESSION  FOR            BLOCKED BY
//	int64:123  exclusive  held     17253  billing-worker  idle     >=8.1s <=8.2s  -
//	int64:123  exclusive  waiting  17494  billing-worker  active   3.3s           17253
//
// KEY, MODE (exclusive or shared), STATE (held or waiting), the backend's PID,
// APPLICATION (application_name), SESSION (pg_stat_activity.state), FOR, and
// BLOCKED BY (pg_blocking_pids of a waiter: the sessions it waits for).
// --show-query adds the backend's current or last query, which may contain
// literal values.
//
// FOR is honest about what PostgreSQL knows. For a waiter it is the time since
// the wait began (pg_locks.waitstart; "<1s" in the moment before the server
// records it). PostgreSQL does not record when an advisory lock was granted,
// so for a holder it is a range: at least the time since an idle session's
// last statement ended (that statement, or an earlier one, took the lock), at
// most the session's age. An active session may be taking the lock in its
// current statement, so it gets no lower bound. A client that pings its idle
// connection resets the lower bound each time (pgxlock run and every
// advisory.Lock do, once per heartbeat). All durations are computed on the
// server's clock.
//
// --key K (repeatable) shows only those keys. --watch redraws every --interval
// (clearing a terminal) until SIGINT or SIGTERM, which end it with status 0;
// a failed snapshot is shown in place of the table and the connection is
// opened again at the next tick.
//
// --json prints one document (one per line with --watch):
//
//	{"at": server time, "database": name, "locks": [lock, ...]}
//
// where each lock has the fields
//
//	key               keys.Key.String(): "int64:N", "pair:A,B" or "ns:NAME(A)/B"
//	space             "int64" or "pair"
//	int64             the bigint as a decimal string (exact in any JSON parser), or null
//	pair              [A, B], or null
//	namespace         registered name of a pair key's first number, or ""
//	mode              "exclusive" or "shared"
//	granted           true: held; false: waiting
//	pid               backend process id
//	application_name  as in pg_stat_activity
//	state             pg_stat_activity.state
//	backend_start, xact_start, state_change, wait_start
//	                  RFC 3339 times, or null
//	waited_seconds    waiters: time since wait_start, or null
//	held_min_seconds  holders: the lower bound of FOR, or null
//	held_max_seconds  holders: the upper bound of FOR (session age), or null
//	blocked_by        pids, [] when none
//	query             only with --show-query
//
// Field names are stable: later versions may add fields, never rename or
// remove them.
//
// # pgxlock run
//
// Takes the lock with an advisory.Lock handle (a session lock on one pinned
// connection, watched for loss), runs the command with pgxlock's stdin,
// stdout, stderr and environment, releases the lock after the command exits
// and exits with the command's status (128+N if signal N killed it).
//
// Connecting comes first, bounded by the connect timeout (connect_timeout,
// else 10 s; connect_timeout=0 in DATABASE_URL or PGCONNECT_TIMEOUT for
// none: a service file's 0 reads as unset), not by --wait: a server that
// cannot be reached or does not answer exits 69 without waiting for the
// key. The check for a connection proxy (advisory.DetectProxy: PgBouncer
// in front exits 69) is part of connecting.
//
// Waiting: by default until the lock is granted; --wait DURATION gives up
// after DURATION (exit 124); --try does not wait (exit 75). The wait is
// these flags' alone: run's connections start with statement_timeout and
// lock_timeout at 0, whatever the settings, the role or the server say. --shared takes the
// key in shared mode (pg_advisory_lock_shared): any number of shared holders,
// no exclusive one. The command is looked up before the lock is taken, so a
// typo never takes or waits for it (exit 127).
//
// Signals: SIGINT, SIGTERM and SIGHUP received while waiting abandon the wait
// (the server-side wait is cancelled too) and exit 128+N without running the
// command. Received while the command runs, they are forwarded to it. The
// command runs in a process group of its own, like timeout(1), and signals go
// to the whole group, so `sh -c '...'` and its children all get them; such a
// command cannot read from the terminal. --foreground keeps the command in
// pgxlock's process group, where it can use the terminal; a Ctrl-C then
// reaches it both from the terminal and forwarded by pgxlock, and signals go
// to the command's process only.
//
// Lock loss: the handle's watcher notices at once when the holding session
// ends (pg_terminate_backend, a server restart, a closed socket) and, with a
// ping every --heartbeat (default 5s, bounded by 2 s), a server or network
// that stops answering; --heartbeat 0 turns the pings off. PostgreSQL has then
// released the lock and someone else may hold it, so pgxlock sends the
// command SIGTERM, then SIGKILL after --grace (default 10s), and exits 70
// whatever the command's status. It also exits 70 if the loss is only found
// when unlocking after the command finished.
//
// If pgxlock itself is killed (kill -9), its session ends and the server
// releases the lock; on Linux the command is then sent SIGKILL too (a
// parent-death signal: it reaches the command, not the command's children).
// While pgxlock waits for a lock, its connection asks the server to check
// every second that the client is still there (client_connection_check_interval,
// PostgreSQL 14+), so a killed waiter does not linger in pg_locks.
//
// Session locks do not work through PgBouncer in transaction pooling mode;
// pgxlock detects a proxy and refuses (exit 69).
//
// # pgxlock leases
//
// Lists the leases of a lease.Manager lock-manager table, live and expired
// (past expires_at by the server's clock and not yet removed; they block
// nobody). --table names the table as lease.ManagerConfig does (Schema and
// Table; default "pgxlock_leases" on the search_path); --resource and --owner
// filter. --json prints
//
//	{"at": server time, "table": as given, "leases": [lease, ...]}
//
// with, per lease: resource, mode ("exclusive" or "shared"), owner, token (the
// fencing token), acquired_at, expires_at, expired (bool),
// expires_in_seconds (negative once expired) and metadata (the stored JSON,
// or null); and writer_intents, one per writer waiting for a resource (new
// shared leases of it are refused meanwhile): resource, until, expired (bool:
// lapsed, blocks nobody) and until_in_seconds. A time edited by hand to
// 'infinity' or '-infinity' prints as that word (its _in_seconds field is
// null; the text form says "never" for an expiry of 'infinity'), and a year
// beyond 9999 with as many digits as it needs. The text form lists waiting
// writers above the leases. Field names are stable, as for locks.
//
// # Exit codes
//
//	0      success; run: the command's own status is passed through
//	1      unexpected error
//	64     usage error (EX_USAGE), including a bad key and connection settings
//	       that cannot be parsed (shown with passwords masked: in a URL, the
//	       whole user info after its first colon up to the last @; after a
//	       password that does not parse cleanly, the rest of the string too;
//	       and the parser's reason is left out if it may quote part of one)
//	69     cannot connect to the database (refused, unreachable, or no answer
//	       within the connect timeout), or it refused a query or the lock
//	       (EX_UNAVAILABLE); the error is shown with every text of three bytes
//	       or more that is or may be part of a password (as masked for 64, the
//	       password pgx parsed, PGPASSWORD) replaced by xxxxx, and as its class
//	       alone (such as "connect: failed to connect") if it still shares
//	       four bytes in a row with one
//	70     run: the lock was lost while the command ran (EX_SOFTWARE)
//	75     run --try: the key is held by another session (EX_TEMPFAIL)
//	124    run --wait: the wait timed out (as timeout(1))
//	126    run: the command could not be started
//	127    run: the command was not found
//	128+N  run: the command was killed by signal N, or pgxlock got signal N while
//	       waiting for the lock (the command did not run)
//
// A command may exit with any of these numbers itself; pgxlock's own
// messages on stderr (prefixed "pgxlock run:") tell them apart.
//
// pgxlock's messages that carry text from the connection settings, the
// server or pgx (errors, on stderr, and --watch's error lines on stdout)
// are scrubbed of those password texts in the same way as for 69. Its
// fixed notes (the hashed-key note, flag errors) carry none and are printed
// as they are.
package main

// Package pgxlockmigrate gives golang-migrate (github.com/golang-migrate/migrate/v4)
// a migration lock that waits in PostgreSQL, gives up cleanly, and knows
// when it is lost.
//
//	inner, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{})  // the stock pgx/v5 driver
//	d, err := pgxlockmigrate.Wrap(ctx, inner, pool, pgxlockmigrate.Config{})
//	m, err := migrate.NewWithInstance("iofs", src, "pgx5", d)
//	d.Attach(m)
//	err = m.Up()
//
// # Why
//
// golang-migrate's postgres and pgx drivers take pg_advisory_lock on
// context.Background, and Migrate bounds the wait with a timer of its own
// (Migrate.LockTimeout) while the statement goes on waiting
// (golang-migrate issue 269): a "timed out" Up can still take the lock
// later and keep it on a pooled connection. [Driver.Lock] waits with
// PostgreSQL's lock_timeout instead (Config.LockTimeout, default 10 s), so
// the wait ends in the server and nothing stays behind; [Driver.Attach]
// makes Migrate's timer longer than that bound, so Migrate never abandons
// a wait that is still running. A cancelled Wrap context ends a wait at
// once, also with nothing held.
//
// # The key, and mixed fleets
//
// By default the Driver takes the key the stock drivers compute from the
// database name, the schema and the migrations table ([Key]), so a fleet
// half-way through a rollout, some processes on the stock driver and some
// on this one, still runs its migrations one process at a time. The
// stock driver also takes that lock while it is built (WithInstance checks
// its migrations table under it), so building one waits, without a bound,
// while another process migrates.
//
// # Losing the lock
//
// The lock is held as an advisory.Lock on a connection of the pool given
// to Wrap, watched for loss (a terminated backend at once, a frozen
// server within the heartbeat bound). When it is lost, Config.OnLost is
// called, the Driver refuses to begin another migration (Run and
// SetVersion(v, true) fail), and Up returns an error matching
// advisory.ErrLockLost. The migration that is running is not interrupted
// (it runs on the inner driver's own connection) and is recorded when it
// ends. golang-migrate then keeps that Migrate marked locked (the Driver's
// Unlock reported the loss), so every later call on it returns
// migrate.ErrLocked: build a new Migrate to try again.
//
// # Errors
//
// A timed-out wait matches both migrate.ErrLockTimeout and
// advisory.ErrLockTimeout, with the *pgconn.PgError (55P03) in its chain;
// other failures are advisory's errors (advisory.ErrLockLost,
// advisory.ErrNotHeld, advisory.ErrNoConnection, advisory.ErrInvalid).
package pgxlockmigrate

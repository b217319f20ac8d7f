// Package pgxlockgoose is the migration lock for goose
// (github.com/pressly/goose/v3) on PostgreSQL advisory locks, without
// polling.
//
//	locker, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{})
//	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations,
//		goose.WithSessionLocker(locker))
//
// # Why
//
// goose's own lock.NewPostgresSessionLocker tries pg_try_advisory_lock and,
// when the lock is busy, sleeps for its retry period (whole seconds, at
// least 1 s) before trying again. Every process that finds the lock busy
// therefore waits about a period longer than needed, and a newcomer can
// take the lock ahead of a process that has waited longer. SessionLocker
// waits in PostgreSQL instead (pg_advisory_lock): the next waiter in
// PostgreSQL's queue gets the lock as soon as it is released. The wait is
// bounded by PostgreSQL's lock_timeout, set for the lock statement only.
//
// # The key, and mixed fleets
//
// By default both lockers here take [GooseKey], the key of goose's own
// session locker (lock.NewPostgresSessionLocker; lock.DefaultLockID =
// 4097083626, the CRC-32 of "goose", a single bigint). A fleet half-way
// through a rollout, some processes on goose's session locker and some on
// this package, still runs the migrations one process at a time.
// "pgxlock locks" lists the holder as key 4097083626. Config.Key sets
// another key (e.g. one per database schema); for processes still on goose's
// session locker, give the same id to lock.WithLockID.
//
// goose's table locker (lock.NewPostgresTableLocker, goose.WithLocker) is
// not compatible: it claims a row of its lock table (goose_lock), not an
// advisory lock, so it and this package never exclude each other, whatever
// the ids. Move a fleet from the table locker to this package in one step
// (all processes stopped), or through goose's session locker first.
//
// # Connections
//
// [SessionLocker] works on the *sql.Conn goose hands it, through
// database/sql's Conn.Raw, and needs the pgx stdlib driver
// (github.com/jackc/pgx/v5/stdlib: sql.Open("pgx", ...), stdlib.OpenDB or
// stdlib.OpenDBFromPool). Its unlock checks PostgreSQL's answer: a false
// unlock (the lock was lost) is an error matching advisory.ErrNotHeld. The
// connection is closed after the unlock, and after a wait that failed in
// doubt, so database/sql never pools it: goose ran the migrations on it,
// and a NO TRANSACTION migration may have left a session lock (the goose
// key taken again), a role or a setting there.
//
// [Locker] (goose.WithLocker) takes the lock as an advisory.Lock handle
// on a pgx pool of its own and reports a lock lost during the migrations
// as an error from goose's Up.
//
// # Errors
//
// Failures are *advisory.LockError values (or advisory's own errors for
// Locker) matching advisory.ErrLockTimeout (also when the session's
// statement_timeout ends the wait), advisory.ErrDeadlock,
// advisory.ErrNotHeld, advisory.ErrLockLost, advisory.ErrStandby (a hot
// standby) or advisory.ErrInvalid, with the *pgconn.PgError kept in the
// chain.
package pgxlockgoose

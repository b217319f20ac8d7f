package pgxlockgoose

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// GooseKey is the key goose's own PostgreSQL lockers take:
// lock.DefaultLockID (4097083626, the CRC-32 (IEEE) of "goose"), a single
// bigint. "pgxlock locks" shows it as 4097083626.
var GooseKey = keys.Int64(lock.DefaultLockID)

// DefaultLockTimeout is the wait bound used when Config.LockTimeout is zero:
// goose's own session locker gives up after 5 minutes by default.
const DefaultLockTimeout = 5 * time.Minute

// DefaultCleanupTimeout bounds an unlock when Config.CleanupTimeout is zero.
const DefaultCleanupTimeout = 5 * time.Second

// Config configures a SessionLocker. The zero value locks GooseKey, waits up
// to DefaultLockTimeout, and bounds the unlock by DefaultCleanupTimeout.
type Config struct {
	// Key is the advisory lock key. The zero Key means GooseKey, so that
	// processes using goose's own lock.NewPostgresSessionLocker with its
	// default lock id and processes using this package exclude each other.
	// goose's table locker (lock.NewPostgresTableLocker) locks a table row,
	// not an advisory lock: it does not exclude this package, whatever key.
	Key keys.Key

	// LockTimeout bounds the wait for the lock; it becomes PostgreSQL's
	// lock_timeout for the lock statement only (cut to lock_timeout's
	// largest value, about 24.8 days, when longer). A context deadline that
	// comes sooner bounds it too. Zero means DefaultLockTimeout; negative
	// means no bound other than the context.
	LockTimeout time.Duration

	// CleanupTimeout bounds the unlock, which runs on a context the
	// caller cannot cancel. Zero means DefaultCleanupTimeout.
	CleanupTimeout time.Duration
}

// SessionLocker implements goose's lock.SessionLocker with one blocking
// PostgreSQL session-level advisory lock on the connection goose passes in.
// It is safe for concurrent use; each call works on its own connection.
type SessionLocker struct {
	key     keys.Key
	timeout time.Duration
	cleanup time.Duration
}

var _ lock.SessionLocker = (*SessionLocker)(nil)

// NewSessionLocker returns a SessionLocker. It returns an error matching
// advisory.ErrInvalid for a negative CleanupTimeout.
func NewSessionLocker(cfg Config) (*SessionLocker, error) {
	if cfg.CleanupTimeout < 0 {
		return nil, fmt.Errorf("%w: negative CleanupTimeout %v", advisory.ErrInvalid, cfg.CleanupTimeout)
	}
	l := &SessionLocker{key: cfg.Key, timeout: cfg.LockTimeout, cleanup: cfg.CleanupTimeout}
	if l.key.IsZero() {
		l.key = GooseKey
	}
	if l.timeout == 0 {
		l.timeout = DefaultLockTimeout
	}
	if l.cleanup == 0 {
		l.cleanup = DefaultCleanupTimeout
	}
	return l, nil
}

// Key returns the key the locker takes.
func (l *SessionLocker) Key() keys.Key { return l.key }

// Statements: the lock_timeout is set with set_config(..., true) inside the
// lock statement's own implicit transaction, so it reverts when the
// statement ends and never stays on goose's connection. Every name is
// pg_catalog's, so a search_path that lists another schema first cannot
// redirect them.
const (
	lockInt64  = `SELECT pg_catalog.pg_advisory_lock($1::pg_catalog.int8) FROM (SELECT pg_catalog.set_config('lock_timeout', $2, true)) s`
	lockPair   = `SELECT pg_catalog.pg_advisory_lock($1::pg_catalog.int4, $2::pg_catalog.int4) FROM (SELECT pg_catalog.set_config('lock_timeout', $3, true)) s`
	unlockInt8 = `SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int8)`
	unlockPair = `SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, $2::pg_catalog.int4)`
)

// SessionLock takes the lock on conn, waiting for it in PostgreSQL (no
// polling): a waiter is granted the lock the moment the holder releases it,
// in the order PostgreSQL queues them. ctx governs the wait; its deadline
// and Config.LockTimeout become the statement's lock_timeout.
//
// It returns nil once the lock is held (also if ctx ended just after the
// grant: goose then calls SessionUnlock), or an *advisory.LockError that
// matches advisory.ErrLockTimeout (SQLSTATE 55P03, with the
// *pgconn.PgError in its chain, and context.DeadlineExceeded when the
// deadline caused it; also when the session's statement_timeout, shorter
// than the bound, ended the wait first, with its 57014 in the chain),
// advisory.ErrDeadlock, advisory.ErrStandby on a hot standby, or
// advisory.ErrInvalid when conn is not a pgx stdlib connection. After a
// statement_timeout and after any other failure the outcome is in doubt
// (a timeout or a cancel may race a grant) and the connection is closed,
// so database/sql discards it rather than pool a connection that may hold
// the lock.
func (l *SessionLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	return l.raw(ctx, conn, "goose session lock", func(c *pgx.Conn) error {
		if err := refuseStandby(ctx, c); err != nil {
			return err
		}
		wctx, stop := waitContext(ctx)
		defer stop()
		timeout, byDeadline := l.lockTimeout(ctx)
		var err error
		if a, b, ok := l.key.Pair(); ok {
			_, err = c.Exec(wctx, lockPair, a, b, timeout)
		} else {
			v, _ := l.key.Int64()
			_, err = c.Exec(wctx, lockInt64, v, timeout)
		}
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch pgErr.Code {
			case "55P03": // lock_timeout: not granted, the connection is fine
				if byDeadline {
					return errors.Join(advisory.ErrLockTimeout, context.DeadlineExceeded, err)
				}
				return errors.Join(advisory.ErrLockTimeout, err)
			case "40P01": // deadlock: not granted
				return errors.Join(advisory.ErrDeadlock, err)
			case "57014":
				if statementTimeout(ctx, pgErr) {
					// The role's, database's or DSN's statement_timeout
					// ended the wait: a lock timeout for the caller, as in
					// advisory. The connection still goes (below): the
					// timeout may have raced a grant.
					l.destroy(ctx, c)
					return errors.Join(advisory.ErrLockTimeout, err)
				}
			}
		}
		// In doubt (a cancel answered with 57014 may race a grant; a
		// closed socket tells nothing): never let this connection back.
		l.destroy(ctx, c)
		return errors.Join(err, ctx.Err())
	})
}

// SessionUnlock releases the lock on conn and checks PostgreSQL's answer.
// ctx contributes only its values: the unlock runs under a fresh context
// bounded by Config.CleanupTimeout. It returns nil, or an *advisory.LockError
// matching advisory.ErrNotHeld when PostgreSQL says the session did not
// hold the lock (it was lost, or unlocked twice). Either way, the
// connection is then closed so that database/sql discards it: goose ran
// the migrations on it, and a NO TRANSACTION migration may have left a
// session lock (the goose key taken again, which the one unlock only
// counts down), a role or a setting on it.
func (l *SessionLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cleanup)
	defer cancel()
	return l.raw(ctx, conn, "goose session unlock", func(c *pgx.Conn) error {
		var ok bool
		var err error
		if a, b, isPair := l.key.Pair(); isPair {
			err = c.QueryRow(ctx, unlockPair, a, b).Scan(&ok)
		} else {
			v, _ := l.key.Int64()
			err = c.QueryRow(ctx, unlockInt8, v).Scan(&ok)
		}
		switch {
		case err != nil:
			l.destroy(ctx, c)
			return err
		case !ok:
			l.destroy(ctx, c)
			return advisory.ErrNotHeld
		}
		l.destroy(ctx, c) // whatever the migrations left on it goes with it
		return nil
	})
}

// raw runs fn on the pgx connection under conn and wraps its error.
func (l *SessionLocker) raw(ctx context.Context, conn *sql.Conn, op string, fn func(*pgx.Conn) error) error {
	if conn == nil {
		return &advisory.LockError{Op: op, Keys: []keys.Key{l.key}, Err: fmt.Errorf("%w: nil *sql.Conn", advisory.ErrInvalid)}
	}
	err := conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w: the connection's driver is %T, not the pgx stdlib driver (github.com/jackc/pgx/v5/stdlib)", advisory.ErrInvalid, dc)
		}
		return fn(sc.Conn())
	})
	if err != nil {
		return &advisory.LockError{Op: op, Keys: []keys.Key{l.key}, Err: err}
	}
	return nil
}

// deadlineGrace is how long past ctx's deadline the client waits for the
// server's lock_timeout (set from that deadline) to end the wait.
const deadlineGrace = 500 * time.Millisecond

// waitContext returns the context the lock statement runs under. A deadline
// is enforced by the server (lock_timeout), which keeps the connection
// usable, so the client context only backs it up deadlineGrace later. An
// explicit cancellation ends the wait at once: pgx then closes the
// connection, which SessionLock treats as an outcome in doubt.
func waitContext(ctx context.Context) (context.Context, func()) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopDeadline := func() bool { return true }
	if dl, ok := ctx.Deadline(); ok {
		t := time.AfterFunc(time.Until(dl)+deadlineGrace, cancel)
		stopDeadline = t.Stop
	}
	stopCancel := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	return wctx, func() { stopCancel(); stopDeadline(); cancel() }
}

// destroy closes the pgx connection; database/sql then sees it closed
// (stdlib reports driver.ErrBadConn) and discards it instead of pooling it.
func (l *SessionLocker) destroy(ctx context.Context, c *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cleanup)
	defer cancel()
	_ = c.Close(cctx)
}

// lockTimeout is the statement's lock_timeout in milliseconds ("0": none):
// the sooner of Config.LockTimeout and ctx's deadline, rounded up, at least
// 1 ms; byDeadline reports that the deadline was the sooner.
func (l *SessionLocker) lockTimeout(ctx context.Context) (ms string, byDeadline bool) {
	d := l.timeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); d < 0 || left < d {
			d, byDeadline = left, true
		}
	}
	if d < 0 {
		return "0", false
	}
	n := (d + time.Millisecond - 1).Milliseconds()
	if n < 1 {
		n = 1
	}
	// PostgreSQL's largest lock_timeout is INT_MAX ms (about 24.8 days); a
	// larger value fails the statement with 22023. A longer bound is cut to
	// it, as advisory does (the wait then ends there, as ErrLockTimeout).
	if n > maxLockTimeoutMillis || d > maxLockTimeoutMillis*time.Millisecond {
		n = maxLockTimeoutMillis
	}
	return strconv.FormatInt(n, 10), byDeadline
}

// statementTimeout reports a 57014 that statement_timeout raised, not a
// cancel request (ours, when ctx ended, or another session's), as advisory
// tells them: by the English message, else by ctx not having been
// cancelled (lc_messages in another language words both differently).
func statementTimeout(ctx context.Context, pgErr *pgconn.PgError) bool {
	if strings.Contains(pgErr.Message, "canceling statement due to statement timeout") {
		return true
	}
	return !strings.Contains(pgErr.Message, "canceling statement due to user request") && ctx.Err() == nil
}

// maxLockTimeoutMillis is the largest lock_timeout PostgreSQL accepts.
const maxLockTimeoutMillis = 1<<31 - 1

// refuseStandby returns an error matching advisory.ErrStandby when c's
// server says it is a hot standby (in_hot_standby, PostgreSQL 14 and later).
// A promotion is reported to a session only after its next statement, so a
// connection that says so is pinged first.
func refuseStandby(ctx context.Context, c *pgx.Conn) error {
	pg := c.PgConn()
	if pg.ParameterStatus("in_hot_standby") != "on" {
		return nil
	}
	if err := pg.Ping(ctx); err != nil {
		return errors.Join(err, ctx.Err())
	}
	if pg.ParameterStatus("in_hot_standby") == "on" {
		return advisory.ErrStandby
	}
	return nil
}

package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ColumnConfig describes a column lease: a lease stored in three columns of an
// existing table, one lease per row. The zero value of every field except
// Table and TTL is a documented default.
type ColumnConfig struct {
	// Schema of the table. Empty: the connection's search_path decides.
	Schema string
	// Table holding the rows to lease. Required.
	Table string
	// IDColumn identifies a row; it must be unique (a primary key). Default "id".
	IDColumn string
	// LockedAtColumn is a nullable timestamptz or timestamp (without time
	// zone): NULL when free, else the database time of the last acquisition
	// or renewal. A timestamp column holds that time in UTC, whatever the
	// sessions' TimeZone: every lease statement runs with TimeZone UTC for
	// its transaction, so sessions in different zones agree. (Values written
	// in another zone by an older version are misjudged by the offset, once,
	// until released or expired.) Any precision from 0 to 6 is safe: a
	// column that rounds now() (timestamptz(0) rounds to the second) is
	// judged with half a unit of its precision added to the TTL, read from
	// the catalog by every statement (see the package documentation).
	// A column of another type (a date truncates now() to the day, so every
	// lease would look expired) is refused: by Migrate (ErrInvalid), and by
	// a Column's acquisitions, which check the type, through any domains,
	// until they have seen it right once (a column altered to another type
	// after that is not seen): ErrInvalid for a date, the server's 42883 for
	// a type that does not compare with a timestamp. Default "locked_at".
	LockedAtColumn string
	// OwnerColumn is a nullable text or uuid column holding the random token
	// of the current acquisition. Release and Renew only touch a row whose
	// owner is still theirs. Default "locked_by".
	OwnerColumn string
	// FenceColumn is a bigint NOT NULL DEFAULT 0 raised by every acquisition
	// (by one, or to the timeline's floor after a promotion: see the package
	// documentation); its new value is the fencing token. Default "lock_fence".
	FenceColumn string
	// TTL after which a lease that was neither renewed nor released may be
	// taken by the next acquirer. Required, at least MinTTL. Every process leasing this
	// table must use the same TTL: the row stores when it was locked, not
	// when it expires, so each acquirer judges staleness by its own TTL.
	TTL time.Duration
	// ReleaseTimeout bounds the release TryDo runs after its callback, and the
	// give-back after an acquisition whose outcome is unknown. Default 5s.
	ReleaseTimeout time.Duration
	// Tracer, when set, receives every renewal (see RenewTracer).
	Tracer RenewTracer
	// Logger receives renewals (Debug; failures at Warn). Row ids are
	// logged as given. Nil means no logging.
	Logger *slog.Logger
}

// DefaultReleaseTimeout is the release bound used when a config leaves it zero.
const DefaultReleaseTimeout = 5 * time.Second

// Column leases rows of one table through its lock columns. It is safe for
// concurrent use and holds no connection between calls.
type Column struct {
	pool           *pgxpool.Pool
	table          string // quoted, qualified; for errors and DDL
	ttl            time.Duration
	releaseTimeout time.Duration
	acquireSQL     string
	checkedSQL     string      // acquireSQL that also checks the locked-at column's type (see checkedAcquireSQL)
	typeChecked    atomic.Bool // checkedSQL saw a timestamptz or timestamp locked-at column
	renewSQL       string
	releaseSQL     string
	giveBackSQL    string
	migrateSQL     string
	lockedAt       string   // the locked-at column's name, for the precision pad
	columns        []string // locked-at, owner, fence: what Migrate checks for
	obs            observer
}

// The column-lease statements. Each is one round trip, run outside any
// transaction, so the change is committed before the call returns. The
// second output column tells "row missing" (ErrNotFound) apart from "row
// not ours / not free"; it reads the statement's snapshot, so a row deleted
// concurrently may still be reported as contention rather than missing.
//
// Placeholders: {t} table, {id}, {at} locked-at, {by} owner, {fence} columns.
const (
	// The compare-and-swap. A concurrent acquirer blocks on the row lock for
	// the few microseconds this statement holds it, then re-evaluates the
	// WHERE clause against the committed row (READ COMMITTED's EvalPlanQual)
	// and matches nothing: exactly one wins.
	columnAcquireSQL = `
WITH claimed AS (
	UPDATE {t} SET {at} = pg_catalog.now(), {by} = $2, {fence} = {next_fence}
	WHERE {id} = $1 AND ({at} IS NULL OR {at} OPERATOR(pg_catalog.<) (pg_catalog.now() - $3::interval - {pad}))
	RETURNING {fence} AS token
)
SELECT (SELECT token FROM claimed), EXISTS (SELECT 1 FROM {t} WHERE {id} = $1)`

	// A lease past its TTL cannot be renewed even if nobody has taken it:
	// its holder already stopped trusting it (see Do), and reviving it would
	// make "expired" mean different things to different parties. "Past its
	// TTL" is judged exactly as the acquirer judges it, precision pad
	// included (see columnPadSQL), so renewal and takeover never both
	// succeed. The fence column must still hold this acquisition's token
	// ($6): see columnReleaseSQL.
	columnRenewSQL = `
WITH renewed AS (
	UPDATE {t} SET {at} = pg_catalog.now()
	WHERE {id} = $1 AND {by} OPERATOR(pg_catalog.=) $2 AND {fence} OPERATOR(pg_catalog.=) $6
		AND {at} OPERATOR(pg_catalog.>=) (pg_catalog.now() - $3::interval - {pad})
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM renewed), EXISTS (SELECT 1 FROM {t} WHERE {id} = $1)`

	// Release clears the lease if it is still ours, expired or not: an
	// expired lease nobody took over is still only ours. The fence column
	// keeps its value so tokens keep increasing. Like renew, it matches the
	// token ($3) as well as the owner: while an acquisition holds the row,
	// the fence column holds that acquisition's token, so a ColumnRef whose
	// token (or owner) was edited matches nothing.
	columnReleaseSQL = `
WITH released AS (
	UPDATE {t} SET {at} = NULL, {by} = NULL
	WHERE {id} = $1 AND {by} OPERATOR(pg_catalog.=) $2 AND {fence} OPERATOR(pg_catalog.=) $3
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM released), EXISTS (SELECT 1 FROM {t} WHERE {id} = $1)`

	// The give-back of an acquisition whose outcome is unknown: its token
	// was never read, so it matches the owner alone, which is fresh for
	// every acquisition and so matches only if that very statement won.
	columnGiveBackSQL = `
UPDATE {t} SET {at} = NULL, {by} = NULL WHERE {id} = $1 AND {by} OPERATOR(pg_catalog.=) $2`

	// columnPadSQL is half a unit of the locked-at column's precision: 0.5s
	// for timestamptz(0) or timestamp(0), 5us for precision 5, zero for
	// precision 6 or none. A column of precision p < 6 rounds the assigned
	// now() to p digits, to the nearest unit, so the stored locked-at time
	// may be up to half a unit earlier than the acquisition (or renewal)
	// really was; a lease judged from it would end up to that much before
	// its TTL. The takeover check and the renewal check both subtract the
	// pad from now() - TTL, so a lease can be taken over only once TTL has
	// passed since the acquisition's (or renewal's) own now(): stored >=
	// true - pad, and stored < now() - TTL - pad implies true < now() - TTL.
	// (Rounding up only delays the takeover.) The column's typmod is read
	// from the catalog by every statement ($4 is the quoted, qualified
	// table name, resolved as the statement resolves it; $5 the column
	// name), so a column altered to another precision is judged by its
	// current one. A domain over timestamptz(p) or timestamp(p) is read
	// through to p; a domain over another domain, and a column not found
	// (which the statement itself would then report), get the largest pad.
	columnPadSQL = `coalesce((
	SELECT CASE WHEN p.typmod OPERATOR(pg_catalog.>=) 0 AND p.typmod OPERATOR(pg_catalog.<=) 5
		THEN ((5 OPERATOR(pg_catalog.*) (10::pg_catalog.float8 OPERATOR(pg_catalog.^) (5 OPERATOR(pg_catalog.-) p.typmod)))::bigint)::pg_catalog.float8
			OPERATOR(pg_catalog.*) interval '1 microsecond'
		ELSE interval '0' END
	FROM (SELECT CASE WHEN ty.typtype OPERATOR(pg_catalog.<>) 'd' THEN a.atttypmod
			WHEN ty.typtypmod OPERATOR(pg_catalog.>=) 0 THEN ty.typtypmod
			WHEN (SELECT b.typtype FROM pg_catalog.pg_type b WHERE b.oid OPERATOR(pg_catalog.=) ty.typbasetype) OPERATOR(pg_catalog.=) 'd' THEN 0
			ELSE -1 END AS typmod
		FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type ty ON ty.oid OPERATOR(pg_catalog.=) a.atttypid
		WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($4) AND a.attname OPERATOR(pg_catalog.=) $5::pg_catalog.name
			AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped) p
), interval '0.5 second')`
)

// checkedAcquireSQL is the compare-and-swap that also reads the
// locked-at column's type ($4 table, $5 column, as for the pad) through
// any domains to its base type, and claims nothing unless it is
// timestamptz or timestamp: a date column, say, truncates now() to the
// day, so a lease taken a second ago would look a day old and every
// acquirer would win. Migrate refuses such a column, but a table need
// not have been through Migrate (ColumnDDL, your own migrations), so a
// Column's first acquisitions run this form, one statement as ever,
// until it has seen the type is right once; the later ones run
// columnAcquireSQL. The last two output columns are the base type's
// name and whether it is one of the two (both NULL when the column is
// not in the catalog, in which case the UPDATE itself fails).
var checkedAcquireSQL = "\nWITH RECURSIVE " + lockedAtTypeCTEs("$4", "$5") + `, claimed AS (
	UPDATE {t} SET {at} = pg_catalog.now(), {by} = $2, {fence} = {next_fence}
	WHERE {id} = $1 AND ({at} IS NULL OR {at} OPERATOR(pg_catalog.<) (pg_catalog.now() - $3::interval - {pad}))
		AND coalesce((SELECT ok FROM lat), false)
	RETURNING {fence} AS token
)
SELECT (SELECT token FROM claimed), EXISTS (SELECT 1 FROM {t} WHERE {id} = $1), (SELECT name FROM lat), (SELECT ok FROM lat)`

// NewColumn validates cfg and prepares the statements. It sends nothing to the
// database. Errors wrap ErrInvalid.
func NewColumn(pool *pgxpool.Pool, cfg ColumnConfig) (*Column, error) {
	const op = "new column"
	if pool == nil {
		return nil, opError(op, "", fmt.Errorf("%w: nil pool", ErrInvalid))
	}
	if cfg.IDColumn == "" {
		cfg.IDColumn = "id"
	}
	if cfg.LockedAtColumn == "" {
		cfg.LockedAtColumn = "locked_at"
	}
	if cfg.OwnerColumn == "" {
		cfg.OwnerColumn = "locked_by"
	}
	if cfg.FenceColumn == "" {
		cfg.FenceColumn = "lock_fence"
	}
	if cfg.ReleaseTimeout == 0 {
		cfg.ReleaseTimeout = DefaultReleaseTimeout
	}
	if cfg.Schema != "" {
		if err := checkIdentifier("schema", cfg.Schema); err != nil {
			return nil, opError(op, "", err)
		}
	}
	for _, c := range []struct{ what, name string }{
		{"table", cfg.Table}, {"id column", cfg.IDColumn}, {"locked-at column", cfg.LockedAtColumn},
		{"owner column", cfg.OwnerColumn}, {"fence column", cfg.FenceColumn},
	} {
		if err := checkIdentifier(c.what, c.name); err != nil {
			return nil, opError(op, "", err)
		}
	}
	cols := map[string]string{cfg.IDColumn: "id", cfg.LockedAtColumn: "locked-at", cfg.OwnerColumn: "owner", cfg.FenceColumn: "fence"}
	if len(cols) != 4 {
		return nil, opError(op, "", fmt.Errorf("%w: the id, locked-at, owner and fence columns must be four distinct columns", ErrInvalid))
	}
	if err := checkTTL(cfg.TTL); err != nil {
		return nil, opError(op, "", err)
	}
	if err := checkTable(cfg.Table); err != nil {
		return nil, opError(op, "", err)
	}
	if cfg.ReleaseTimeout < 0 {
		return nil, opError(op, "", fmt.Errorf("%w: negative release timeout", ErrInvalid))
	}
	table := qualify(cfg.Schema, cfg.Table)
	r := commentFree{strings.NewReplacer(
		"{t}", table, "{id}", quote(cfg.IDColumn), "{at}", quote(cfg.LockedAtColumn),
		"{by}", quote(cfg.OwnerColumn), "{fence}", quote(cfg.FenceColumn),
		"{next_fence}", nextTokenSQL("coalesce("+quote(cfg.FenceColumn)+", 0)"),
		"{pad}", columnPadSQL,
	)}
	return &Column{
		pool:           pool,
		table:          table,
		ttl:            cfg.TTL,
		releaseTimeout: cfg.ReleaseTimeout,
		acquireSQL:     r.Replace(columnAcquireSQL),
		checkedSQL:     r.Replace(checkedAcquireSQL),
		renewSQL:       r.Replace(columnRenewSQL),
		releaseSQL:     r.Replace(columnReleaseSQL),
		giveBackSQL:    r.Replace(columnGiveBackSQL),
		lockedAt:       cfg.LockedAtColumn,
		migrateSQL:     r.Replace(columnMigrateSQL),
		columns:        []string{cfg.LockedAtColumn, cfg.OwnerColumn, cfg.FenceColumn},
		obs:            newObserver(FormColumn, cfg.Tracer, cfg.Logger),
	}, nil
}

// TTL returns the configured lease duration.
func (c *Column) TTL() time.Duration { return c.ttl }

// TryAcquire claims the row whose id column equals id, if it is free or its
// lease is older than the TTL. It never waits for a holder, and waits at most
// TryLockTimeout for a row lock held by another transaction (an unrelated
// UPDATE of the same row that has not committed): the row is then reported
// busy.
//
// ctx governs the one round trip. It returns ErrNotAcquired when another
// holder's lease is live or the row is locked past TryLockTimeout,
// ErrNotFound when no row has this id, ErrInvalid (claiming nothing) for a
// locked-at column of a type that compares with a timestamp but is not
// timestamptz or timestamp, a date (see ColumnConfig; one that does not
// compare with a timestamp at all, text or interval, fails with the
// server's 42883, claiming nothing too), ErrInvalid for a nil or typed-nil id
// and for a string-like id (a string or named string type, a []byte, or a
// pointer to one of them) with a NUL byte or invalid UTF-8 or longer than
// MaxResourceLen (a []byte id is checked as text). If the statement's
// outcome is unknown (the connection failed or ctx ended after it was sent),
// TryAcquire clears the row if the lease turns out to be ours, under a fresh
// context bounded by ReleaseTimeout, and returns the original error: it
// returns within ctx's deadline plus one ReleaseTimeout.
func (c *Column) TryAcquire(ctx context.Context, id any) (*ColumnLease, error) {
	const op = "try acquire"
	if err := checkID(id); err != nil {
		return nil, opError(op, resourceOf(id), err)
	}
	ctx = withCleanupClock(ctx) // exec's ROLLBACK and giveBack share one bound
	l := &ColumnLease{c: c, id: id, owner: newID()}
	l.started = time.Now()
	var token *int64
	var exists bool
	var chk *lockedAtCheck // only until the type was seen right: no allocation after
	if !c.typeChecked.Load() {
		chk = &lockedAtCheck{}
	}
	err := exec(ctx, c.pool, c.releaseTimeout, waitTry, func(b *pgx.Batch) {
		if chk != nil {
			b.Queue(c.checkedSQL, id, l.owner, c.ttl, c.table, c.lockedAt).QueryRow(func(row pgx.Row) error {
				return row.Scan(&token, &exists, &chk.name, &chk.ok)
			})
			return
		}
		b.Queue(c.acquireSQL, id, l.owner, c.ttl, c.table, c.lockedAt).QueryRow(func(row pgx.Row) error {
			return row.Scan(&token, &exists)
		})
	})
	if chk != nil && err == nil && chk.ok != nil {
		if !*chk.ok {
			return nil, opError(op, l.Resource(), fmt.Errorf("%w: locked-at column %s is %s, not timestamptz or timestamp",
				ErrInvalid, quote(c.lockedAt), *chk.name))
		}
		c.typeChecked.Store(true)
	}
	switch {
	case isLockTimeout(err): // the row is locked by a transaction: busy
		return nil, opError(op, l.Resource(), errors.Join(ErrNotAcquired, err))
	case err != nil:
		if outcomeUnknown(err) {
			l.giveBack(ctx)
		}
		return nil, opError(op, l.Resource(), err)
	case token != nil:
		l.token = *token
		return l, nil
	case !exists:
		return nil, opError(op, l.Resource(), ErrNotFound)
	default:
		return nil, opError(op, l.Resource(), ErrNotAcquired)
	}
}

// lockedAtCheck is what checkedAcquireSQL read of the locked-at column's
// type: its base type's name and whether it is timestamptz or timestamp
// (both nil when the column is not in the catalog).
type lockedAtCheck struct {
	name *string
	ok   *bool
}

// ColumnLease is one acquisition of a row. Its methods are safe for
// concurrent use; it holds no connection.
type ColumnLease struct {
	c       *Column
	id      any
	owner   string
	token   int64
	started time.Time // local monotonic time the acquiring statement was sent
}

// ID returns the leased row's id as passed to TryAcquire.
func (l *ColumnLease) ID() any { return l.id }

// Resource returns the row id formatted with %v, as used in errors (cut
// short past MaxErrorResourceLen bytes).
func (l *ColumnLease) Resource() string { return resourceOf(l.id) }

// Owner returns the random token stored in the owner column while held.
func (l *ColumnLease) Owner() string { return l.owner }

// Token returns the fencing token: the fence column's value after this
// acquisition. It is strictly greater than every earlier acquisition's token
// of the same row.
func (l *ColumnLease) Token() int64 { return l.token }

// Renew restarts the TTL from the database's now(). ctx governs the one
// statement. It matches the row's owner and fence columns against Owner and
// Token. It returns ErrLeaseLost if the lease expired, was released or was
// taken over (or, for a resumed lease, if the ColumnRef was edited),
// ErrNotFound if the row is gone.
func (l *ColumnLease) Renew(ctx context.Context) error {
	start := time.Now()
	err := l.scoped(ctx, "renew", l.c.renewSQL, l.id, l.owner, l.c.ttl, l.c.table, l.c.lockedAt, l.token)
	l.c.obs.renewed(ctx, l.Resource(), l.token, start, err)
	return err
}

// Release frees the row if the lease is still this one's. ctx governs the one
// statement; callers that release on the way out of a cancelled operation
// should pass context.WithoutCancel(ctx) with a timeout (TryDo does). It
// returns ErrLeaseLost if another acquirer took the row over (or it was
// already released), ErrNotFound if the row is gone. Releasing an expired
// lease nobody took over succeeds.
func (l *ColumnLease) Release(ctx context.Context) error {
	return l.scoped(ctx, "release", l.c.releaseSQL, l.id, l.owner, l.token)
}

func (l *ColumnLease) scoped(ctx context.Context, op, sql string, args ...any) error {
	var ours, exists bool
	err := exec(ctx, l.c.pool, l.c.releaseTimeout, waitCtx, func(b *pgx.Batch) {
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&ours, &exists) })
	})
	switch {
	case err != nil:
		return opError(op, l.Resource(), err)
	case ours:
		return nil
	case !exists:
		return opError(op, l.Resource(), ErrNotFound)
	default:
		return opError(op, l.Resource(), ErrLeaseLost)
	}
}

// giveBack releases an acquisition whose outcome is unknown. Because the
// owner token is fresh, the release matches only if this very statement won.
func (l *ColumnLease) giveBack(ctx context.Context) {
	rctx, cancel := cleanupContext(ctx, l.c.releaseTimeout)
	defer cancel()
	// Best effort: the TTL is the safety net if this fails too.
	_ = exec(rctx, l.c.pool, l.c.releaseTimeout, waitCtx, func(b *pgx.Batch) {
		b.Queue(l.c.giveBackSQL, l.id, l.owner)
	})
}

// keepAlive adapts a column lease to the Do machinery.
func (l *ColumnLease) keepAlive() keepAlive {
	return keepAlive{
		resource: l.Resource(),
		ttl:      l.c.ttl,
		started:  l.started,
		renew:    l.Renew,
		release:  l.Release,
		timeout:  l.c.releaseTimeout,
	}
}

package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Table-wide operations on a lock-manager table: for operators, start-up
// clean-up and housekeeping. None of them needs the resource lock that
// acquisitions take (see manager_sql.go).

// ReleaseAll deletes every lease whose owner label is owner, expired or not,
// and wakes their waiters. Use it when a process restarts under a stable
// owner label and knows its previous incarnation's leases are dead. It
// returns the number of leases deleted. ctx governs the one statement.
// An empty owner is ErrInvalid.
func (m *Manager) ReleaseAll(ctx context.Context, owner string) (int64, error) {
	const op = "release all"
	if err := checkText("owner", owner, MaxResourceLen); err != nil {
		return 0, opError(op, owner, err)
	}
	var n int64
	err := exec(ctx, m.pool, m.releaseTimeout, waitCtx|managerTables, func(b *pgx.Batch) {
		b.Queue(m.q.releaseAllLock, owner)
		b.Queue(m.q.releaseAll, owner, m.channel).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
	})
	if err != nil {
		return 0, opError(op, owner, err)
	}
	return n, nil
}

// Sweep deletes expired leases (by the database clock), wakes their waiters
// and returns how many it deleted. Expired leases never block anyone (the
// next acquirer deletes them itself), so Sweep is housekeeping: it keeps List
// short and the table small. Rows locked by a concurrent renewal or
// acquisition are skipped. ctx governs the one statement.
func (m *Manager) Sweep(ctx context.Context) (int64, error) {
	n, err := m.count(ctx, m.q.sweep, m.channel)
	if err != nil {
		return 0, opError("sweep", "", err)
	}
	return n, nil
}

// count runs a table-wide statement that returns a row count, in a READ
// COMMITTED transaction (see exec).
func (m *Manager) count(ctx context.Context, sql string, args ...any) (int64, error) {
	var n int64
	err := exec(ctx, m.pool, m.releaseTimeout, waitCtx|managerTables, func(b *pgx.Batch) {
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
	})
	return n, err
}

// ListOptions filter List; a nil pointer lists every live lease.
type ListOptions struct {
	Resource       string // only this resource, if not empty
	Owner          string // only this owner label, if not empty
	IncludeExpired bool   // also leases past their expiry that nobody removed yet
}

// check refuses filters no row can match and PostgreSQL would reject (22021):
// a NUL byte or invalid UTF-8, or one longer than MaxResourceLen.
func (o *ListOptions) check(owner bool) error {
	if o.Resource != "" {
		if err := checkText("resource filter", o.Resource, MaxResourceLen); err != nil {
			return err
		}
	}
	if owner && o.Owner != "" {
		if err := checkText("owner filter", o.Owner, MaxResourceLen); err != nil {
			return err
		}
	}
	return nil
}

// Holder is one row of the lock-manager table, as seen by List. Times are
// the database's.
type Holder struct {
	Resource   string
	Owner      string
	Mode       Mode
	Token      int64
	AcquiredAt time.Time
	// ExpiresAt is expires_at. A row edited by hand to 'infinity' (a lease
	// pinned for good), or to a time past time.UnixMicro's range (the year
	// 294247; PostgreSQL's reaches 294276), reads as
	// time.UnixMicro(math.MaxInt64), and '-infinity' as
	// time.UnixMicro(math.MinInt64); the same holds for AcquiredAt and for
	// Intent.Until.
	ExpiresAt time.Time
	Expired   bool // expires_at <= now() on the database when listed
	Metadata  json.RawMessage
}

// List returns the leases in the table ordered by resource and token. It is a
// snapshot: by the time it returns, leases may have come and gone. ctx
// governs the one query. A filter with a NUL byte or invalid UTF-8, or
// longer than MaxResourceLen, is ErrInvalid.
func (m *Manager) List(ctx context.Context, opts *ListOptions) ([]Holder, error) {
	const op = "list"
	if opts == nil {
		opts = &ListOptions{}
	}
	if err := opts.check(true); err != nil {
		return nil, opError(op, opts.Resource, err)
	}
	var resource, owner any
	if opts.Resource != "" {
		resource = opts.Resource
	}
	if opts.Owner != "" {
		owner = opts.Owner
	}
	rows, err := inspectQuery(ctx, m.pool, m.releaseTimeout, m.q.list, resource, owner, opts.IncludeExpired)
	if err != nil {
		return nil, opError(op, opts.Resource, err)
	}
	defer rows.Close()
	var out []Holder
	for rows.Next() {
		var h Holder
		var mode string
		var meta []byte
		var acquired, expires int64
		if err := rows.Scan(&h.Resource, &h.Owner, &mode, &h.Token, &acquired, &expires, &meta, &h.Expired); err != nil {
			return nil, opError(op, opts.Resource, err)
		}
		h.AcquiredAt, h.ExpiresAt = time.UnixMicro(acquired), time.UnixMicro(expires)
		if h.Mode, err = parseMode(mode); err != nil {
			return nil, opError(op, h.Resource, err)
		}
		if meta != nil {
			h.Metadata = json.RawMessage(meta)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, opError(op, opts.Resource, err)
	}
	return out, nil
}

// inspectQuery runs a List or ListIntents query. On a connection whose
// client_encoding is not UTF8 it runs in a transaction that sets it to UTF8
// first (see utf8SQL): the filters and the names read back are UTF-8, as
// pgx sends and reads them; its ROLLBACK, once the rows are closed, is
// bounded by cleanup (cleanupContext: a network gone silent there closes
// the connection, which the pool then destroys). The rows, once closed,
// release the connection.
func inspectQuery(ctx context.Context, pool *pgxpool.Pool, cleanup time.Duration, sql string, args ...any) (pgx.Rows, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if !needsUTF8(pc.Conn().PgConn()) {
		rows, err := pc.Query(ctx, sql, args...)
		if err != nil {
			pc.Release()
			return nil, err
		}
		return &releasingRows{Rows: rows, release: pc.Release}, nil
	}
	tx, err := pc.Begin(ctx)
	if err != nil {
		pc.Release()
		return nil, err
	}
	done := func() {
		rctx, cancel := cleanupContext(ctx, cleanup)
		_ = tx.Rollback(rctx) // read-only: nothing to keep; a failed one closes the connection
		cancel()
		pc.Release()
	}
	if _, err := tx.Exec(ctx, utf8SQL); err != nil {
		done()
		return nil, err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		done()
		return nil, err
	}
	return &releasingRows{Rows: rows, release: done}, nil
}

// releasingRows runs release once, when its rows are closed.
type releasingRows struct {
	pgx.Rows
	release func()
	done    bool
}

func (r *releasingRows) Close() {
	r.Rows.Close()
	if !r.done {
		r.done = true
		r.release()
	}
}

// String formats a holder for logs and the operator CLI.
func (h Holder) String() string {
	state := "live"
	if h.Expired {
		state = "expired"
	}
	return fmt.Sprintf("%q %s token=%d owner=%q %s until %s", h.Resource, h.Mode, h.Token, h.Owner, state, h.ExpiresAt.Format(time.RFC3339Nano))
}

// Intent is a writer waiting for a resource, as seen by ListIntents: a
// blocked Exclusive Acquire that refuses new Shared acquisitions while it
// waits (see the package documentation). Times are the database's.
type Intent struct {
	Resource string
	Until    time.Time // the intent lapses then unless its writer refreshes it
	Expired  bool      // Until <= now() on the database when listed: it blocks nobody
}

// ListIntents returns the writer intents in the table ordered by resource:
// why readers are being refused while List may show no exclusive holder.
// opts.Resource filters, opts.IncludeExpired adds lapsed intents (a writer
// that gave up or died), and opts.Owner is ignored (an intent records no
// owner, and is not checked). It is a snapshot. ctx governs the one query.
// A bad Resource filter is ErrInvalid, as for List.
func (m *Manager) ListIntents(ctx context.Context, opts *ListOptions) ([]Intent, error) {
	const op = "list intents"
	if opts == nil {
		opts = &ListOptions{}
	}
	if err := opts.check(false); err != nil {
		return nil, opError(op, opts.Resource, err)
	}
	var resource any
	if opts.Resource != "" {
		resource = opts.Resource
	}
	rows, err := inspectQuery(ctx, m.pool, m.releaseTimeout, m.q.intents, resource, opts.IncludeExpired)
	if err != nil {
		return nil, opError(op, opts.Resource, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Intent, error) {
		var in Intent
		var until int64
		err := row.Scan(&in.Resource, &until, &in.Expired)
		in.Until = time.UnixMicro(until)
		return in, err
	})
	if err != nil {
		return nil, opError(op, opts.Resource, err)
	}
	return out, nil
}

// String formats an intent for logs and the operator CLI.
func (in Intent) String() string {
	state := "waiting"
	if in.Expired {
		state = "lapsed"
	}
	return fmt.Sprintf("%q writer %s until %s", in.Resource, state, in.Until.Format(time.RFC3339Nano))
}

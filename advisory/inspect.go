package advisory

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/keys"
)

// Querier is what ListLocks needs: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// LockInfo is one advisory lock held or awaited in the current database:
// a row of pg_locks joined with pg_stat_activity.
type LockInfo struct {
	Key       keys.Key // decoded from classid, objid, objsubid
	Namespace string   // the registered namespace of a pair key, or ""
	Shared    bool     // ShareLock (shared) rather than ExclusiveLock
	Granted   bool     // held (true) or awaited (false)
	PID       int32    // backend process; 0 for a prepared transaction

	ApplicationName string
	State           string    // pg_stat_activity.state: active, idle, idle in transaction, ...
	Query           string    // the backend's current or last query
	BackendStart    time.Time // when the session began
	XactStart       time.Time // when its current transaction began; zero if none
	StateChange     time.Time // when State last changed
	WaitStart       time.Time // when the wait began; zero if granted
	BlockedBy       []int32   // pg_blocking_pids of a waiter
}

// sqlListLocks lists advisory locks of the current database. Rows are
// ordered by pg_locks' columns, not by keys.Compare: int64 keys before pair
// keys (objsubid), then by classid and objid as unsigned 32-bit numbers
// (oid): an int64 key by its 64 bits read as unsigned, a pair by a then b
// read as unsigned, so negative numbers sort after non-negative ones
// (int64:1 before int64:-1); then holders before waiters, waiters by wait
// start, then by pid. Times
// travel as microseconds since the Unix epoch (exact: extract returns
// numeric): a timestamp read as text, as pgx reads results in the Exec and
// simple protocol modes, is parsed in the ISO DateStyle only, and the
// session's may be another. A role that may not see a session's activity
// gets a NULL state and "<insufficient privilege>" as its query: both are
// read as empty.
const sqlListLocks = `
SELECT l.classid, l.objid, l.objsubid, l.mode OPERATOR(pg_catalog.=) 'ShareLock', l.granted, coalesce(l.pid, 0),
       coalesce(a.application_name, ''), coalesce(a.state, ''), CASE WHEN a.state IS NULL THEN '' ELSE coalesce(a.query, '') END,
       (pg_catalog.extract('epoch', a.backend_start) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8, (pg_catalog.extract('epoch', a.xact_start) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8,
       (pg_catalog.extract('epoch', a.state_change) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8, (pg_catalog.extract('epoch', l.waitstart) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8,
       CASE WHEN l.granted OR l.pid IS NULL THEN '{}'::pg_catalog.int4[] ELSE pg_catalog.pg_blocking_pids(l.pid) END
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND (pg_catalog.cardinality($1::pg_catalog.oid[]) OPERATOR(pg_catalog.=) 0
       OR EXISTS (SELECT FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.oid[]), pg_catalog.unnest($2::pg_catalog.oid[]),
                                         pg_catalog.unnest($3::pg_catalog.int2[])) AS f(c, o, s)
                  WHERE f.c OPERATOR(pg_catalog.=) l.classid AND f.o OPERATOR(pg_catalog.=) l.objid
                    AND f.s OPERATOR(pg_catalog.=) l.objsubid))
ORDER BY l.objsubid, l.classid, l.objid, l.granted DESC, l.waitstart NULLS FIRST, l.pid`

// ListLocks returns the advisory locks held or awaited in db's current
// database, all of them or only those on the given keys. It reads
// pg_locks and pg_stat_activity; a role without pg_read_all_stats sees
// other users' Query and State as empty. One round trip.
func ListLocks(ctx context.Context, db Querier, filter ...keys.Key) ([]LockInfo, error) {
	classids := make([]uint32, 0, len(filter))
	objids := make([]uint32, 0, len(filter))
	subids := make([]int16, 0, len(filter))
	for _, k := range filter {
		if k.IsZero() {
			return nil, invalid("zero Key in filter")
		}
		c, o, s := k.PgLocks()
		classids, objids, subids = append(classids, c), append(objids, o), append(subids, s)
	}
	rows, err := db.Query(ctx, sqlListLocks, classids, objids, subids)
	if err != nil {
		return nil, fmt.Errorf("advisory: list locks: %w", err)
	}
	defer rows.Close()
	var out []LockInfo
	for rows.Next() {
		var (
			li                          LockInfo
			classid, objid              uint32
			objsubid                    int16
			backend, xact, change, wait *int64
		)
		if err := rows.Scan(&classid, &objid, &objsubid, &li.Shared, &li.Granted, &li.PID,
			&li.ApplicationName, &li.State, &li.Query, &backend, &xact, &change, &wait, &li.BlockedBy); err != nil {
			return nil, fmt.Errorf("advisory: list locks: %w", err)
		}
		k, err := keys.FromPgLocks(classid, objid, objsubid)
		if err != nil {
			return nil, fmt.Errorf("advisory: list locks: %w", err)
		}
		li.Key = k
		if a, _, ok := k.Pair(); ok {
			if ns, ok := keys.LookupNamespace(a); ok {
				li.Namespace = ns.Name()
			}
		}
		li.BackendStart, li.XactStart, li.StateChange, li.WaitStart = deref(backend), deref(xact), deref(change), deref(wait)
		out = append(out, li)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("advisory: list locks: %w", err)
	}
	return out, nil
}

// deref is the time of us microseconds since the Unix epoch; zero for nil.
func deref(us *int64) time.Time {
	if us == nil {
		return time.Time{}
	}
	return time.UnixMicro(*us)
}
